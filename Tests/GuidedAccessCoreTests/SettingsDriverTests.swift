import Testing

@testable import GuidedAccessCore

/// The settings keys as a driver: what the backend's schemas allow, what a
/// change writes and puts back, and the snapshot that makes it crash-safe —
/// with the memory backend.
@Suite struct SettingsDriverTests {
    static let options = DriverTarget(features: [], zoomFactor: 4.0, textScale: 1.5)

    static func target(_ features: Set<Feature>) -> DriverTarget {
        DriverTarget(features: features, zoomFactor: 4.0, textScale: 1.5)
    }

    @Test func aMissingOptionalKeyLeavesTheFeatureSupported() {
        let driver = SettingsDriver(backend: TestBackend(MemorySettingsBackend(knownKeys: MemorySettingsBackend.gnome43Keys)))
        #expect(driver.capabilities.isEmpty)
        #expect(driver.keyMap.missingOptionalKeys == [.reducedMotion])
    }

    @Test func aMissingRequiredKeyMakesTheFeatureImpossibleNamingTheKey() {
        var keys = MemorySettingsBackend.gnome43Keys
        keys[.colorSaturation] = nil
        let driver = SettingsDriver(backend: TestBackend(MemorySettingsBackend(knownKeys: keys)))
        #expect(driver.capabilities == [
            .grayscale: .impossible(
                "this system's settings (test backend) lack org.gnome.desktop.a11y.magnifier color-saturation"
                    + ": their schemas come with gsettings-desktop-schemas, in a version that has these keys")
        ])
    }

    @Test func aKeyOfAnotherTypeMakesTheFeatureImpossible() {
        var keys = MemorySettingsBackend.gnome43Keys
        keys[.screenReaderEnabled] = .double(0...1)
        let driver = SettingsDriver(backend: TestBackend(MemorySettingsBackend(knownKeys: keys)))
        guard case .impossible? = driver.capabilities[.screenReader] else {
            Issue.record("\(driver.capabilities)")
            return
        }
        #expect(driver.capabilities.count == 1)
    }

    @Test func theMemoryBackendStandsForAKioskThatDeliversEveryFeatureToPartOfTheScreen() {
        let driver = SettingsDriver(backend: MemorySettingsBackend())
        #expect(driver.capabilities == Dictionary(uniqueKeysWithValues: Feature.allCases.map { ($0, .delivers(.part)) }))
    }

    @Test func theSnapshotKeepsTheFirstValueSeenAndWhetherItWasUnset() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(4.0)])
        let driver = SettingsDriver(backend: backend)
        try driver.prepare(Self.target([.invertColors]))
        #expect(driver.snapshot[.magFactor] == .set(.double(4.0)))
        #expect(driver.snapshot[.invertLightness] == .unset)
        _ = try await driver.apply(Self.target([.invertColors]))
        _ = try await driver.apply(Self.target([.invertColors, .zoom]))
        // mag-factor was written meanwhile: its value from before the session stays.
        #expect(driver.snapshot[.magFactor] == .set(.double(4.0)))
        #expect(backend.values[.magFactor] == .double(4.0) && backend.values[.invertLightness] == .bool(true))
    }

    @Test func turningAFeatureOffPutsBackOnlyItsKeysAndForgetsThem() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(3.0)])
        let driver = SettingsDriver(backend: backend)
        _ = try await driver.apply(Self.target([.zoom, .invertColors]))
        _ = try await driver.apply(Self.target([.zoom]))
        #expect(backend.values[.invertLightness] == nil)
        #expect(backend.values[.magFactor] == .double(4.0))
        #expect(driver.snapshot[.invertLightness] == nil)
        #expect(driver.snapshot[.magFactor] == .set(.double(3.0)))
    }

    @Test func theEndPutsBackEveryKeyAndResetsTheUnsetOnes() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(3.0)])
        let driver = SettingsDriver(backend: backend)
        _ = try await driver.apply(Self.target([.zoom, .invertColors]))
        _ = try await driver.apply(.none)
        #expect(backend.values == [.magFactor: .double(3.0)])
        #expect(driver.snapshot.isEmpty && driver.record == nil)
        #expect(driver.endSummary == DriverSummary(text: "4 keys restored", fields: ["RESTORED_KEYS": "4"]))
    }

    @Test func aValueTheSchemaRefusesIsUnsupportedAndChangesNothing() throws {
        var keys = MemorySettingsBackend.gnome43Keys
        keys[.magFactor] = .double(1.0...2.0)
        let driver = SettingsDriver(backend: MemorySettingsBackend(knownKeys: keys))
        #expect(throws: DriverFailure.self) { try driver.prepare(Self.target([.zoom])) }
        #expect(driver.snapshot.isEmpty)
    }

    @Test func aCancelledPrepareForgetsWhatItAddedToTheSnapshot() throws {
        let driver = SettingsDriver(backend: MemorySettingsBackend())
        try driver.prepare(Self.target([.highContrast]))
        #expect(driver.record != nil)
        driver.cancel()
        #expect(driver.record == nil)
    }

    @Test func theRecordIsTheSnapshotAndIsReadBack() throws {
        let driver = SettingsDriver(backend: MemorySettingsBackend(values: [.magFactor: .double(3.0)]))
        try driver.prepare(Self.target([.zoom]))
        let record = try #require(driver.record)
        #expect(try SettingsDriver.snapshot(of: record) == driver.snapshot)
        #expect(throws: DriverRecordError.self) { try driver.validate(.object([("snapshot", .string("x"))])) }
    }
}
