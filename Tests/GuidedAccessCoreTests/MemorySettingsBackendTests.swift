import Testing
@testable import GuidedAccessCore

@Suite struct MemorySettingsBackendTests {
    @Test func itIsNamedMemory() {
        #expect(MemorySettingsBackend().name == "memory")
    }

    @Test func gnome43HasNoReducedMotion() {
        let backend = MemorySettingsBackend()
        #expect(backend.availability(of: .reducedMotion, for: .string("reduce")) == .missingKey)
        #expect(MemorySettingsBackend(knownKeys: MemorySettingsBackend.gnome50Keys)
            .availability(of: .reducedMotion, for: .string("reduce")) == .available)
    }

    @Test func anUnknownSchemaIsMissingSchema() {
        #expect(MemorySettingsBackend().availability(of: SettingKey(schema: "org.kde.kwin", key: "zoom"), for: .bool(true)) == .missingSchema)
    }

    @Test func aValueOfAnotherTypeIsWrongType() {
        #expect(MemorySettingsBackend().availability(of: .magFactor, for: .bool(true)) == .wrongType(expected: "d"))
    }

    @Test(arguments: [
        (SettingKey.magFactor, SettingValue.double(0.1), true),
        (.magFactor, .double(32.0), true),
        (.magFactor, .double(0.05), false),
        (.magFactor, .double(33.0), false),
        (.colorSaturation, .double(0.0), true),
        (.colorSaturation, .double(1.1), false),
        (.textScalingFactor, .double(0.5), true),
        (.textScalingFactor, .double(3.01), false),
        (.screenPosition, .string("full-screen"), true),
        (.screenPosition, .string("left-half"), true),
        (.screenPosition, .string("middle"), false),
    ])
    func valuesAreCheckedAgainstTheSchemaRanges(key: SettingKey, value: SettingValue, valid: Bool) {
        let backend = MemorySettingsBackend()
        if valid {
            #expect(throws: Never.self) { try backend.check([key: value]) }
        } else {
            #expect(throws: SettingsBackendError.self) { try backend.check([key: value]) }
        }
    }

    @Test func reducedMotionTakesItsTwoChoices() throws {
        let backend = MemorySettingsBackend(knownKeys: MemorySettingsBackend.gnome50Keys)
        try backend.check([.reducedMotion: .string("reduce")])
        try backend.check([.reducedMotion: .string("no-preference")])
        #expect(throws: SettingsBackendError.self) { try backend.check([.reducedMotion: .string("less")]) }
    }

    @Test func anOutOfRangeErrorNamesKeyAndValue() {
        #expect(throws: SettingsBackendError(.outOfRange, "org.gnome.desktop.a11y.magnifier mag-factor 40.0 is out of range 0.1…32.0")) {
            try MemorySettingsBackend().check([.magFactor: .double(40.0)])
        }
    }

    @Test func applySetsAndResetsKeys() async throws {
        let backend = MemorySettingsBackend(values: [.invertLightness: .bool(true)])
        try await backend.apply([.magFactor: .double(3.0), .invertLightness: nil])
        #expect(try backend.userValue(of: .magFactor) == .double(3.0))
        #expect(try backend.userValue(of: .invertLightness) == nil)
    }

    @Test func anApplyWithOneBadValueChangesNothing() async {
        let backend = MemorySettingsBackend()
        await #expect(throws: SettingsBackendError.self) {
            try await backend.apply([.magFactor: .double(3.0), .colorSaturation: .double(2.0)])
        }
        #expect(backend.values.isEmpty)
    }

    @Test func anInjectedFailureFailsOnlyTheNextApply() async throws {
        let backend = MemorySettingsBackend()
        backend.failNextApply()
        await #expect(throws: SettingsBackendError(.writeFailed, "injected failure")) { try await backend.apply([.magFactor: .double(3.0)]) }
        #expect(backend.values.isEmpty)
        try await backend.apply([.magFactor: .double(3.0)])
        #expect(backend.appliedCount == 1)
    }
}
