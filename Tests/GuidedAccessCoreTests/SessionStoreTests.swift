import Foundation
import Testing

@testable import GuidedAccessCore

/// The transaction across the drivers (prepare → journal → apply → forget →
/// refresh), ending, and taking up a journal after a restart — with the
/// settings driver over the memory backend, a driver of the test's own where
/// a second driver is needed, a journal in a temporary directory, and no bus.
@Suite struct SessionStoreTests {
    let directory = SessionJournalTests.TemporaryDirectory()
    var journal: SessionJournal { SessionJournal(directory: directory.path) }
    static let kiosk = BusCaller(uniqueName: ":1.1", identity: CallerIdentity(
        uid: 1000, executable: Executable(path: "/usr/bin/kiosk", file: FileIdentity(device: 1, inode: 2))))

    func store(
        _ backend: any SettingsBackend, journal: SessionJournal? = nil, then others: [any FeatureDriver] = []
    ) -> SessionStore {
        SessionStore(journal: journal ?? self.journal, drivers: [SettingsDriver(backend: backend)] + others)
    }

    static func settings(_ store: SessionStore) -> SettingsDriver { store.drivers[0] as! SettingsDriver }

    static func session(_ features: Set<Feature>, owner: BusCaller = kiosk, deadlineUsec: UInt64 = 0) -> Session {
        var session = Session(
            owner: owner,
            options: SessionParameters(timeLimitSec: 0, features: features, zoomFactor: 2, textScale: 1.5, inhibitSleep: true),
            nowUsec: 0)
        session.deadlineUsec = deadlineUsec
        return session
    }

    /// The settings driver's record holding `snapshot`.
    static func settingsRecord(_ snapshot: [SettingKey: StoredValue]) -> [String: JSON] {
        ["settings": SettingsDriver.record(of: JournalRecord.entries(snapshot).map { $0.json() })]
    }

    /// The snapshot the journal holds now.
    func journaledSnapshot() throws -> [SettingKey: StoredValue] {
        try journal.load()?.drivers["settings"].map(SettingsDriver.snapshot(of:)) ?? [:]
    }

    // The changes, each in a turn of its own, as the service makes them.
    func begin(_ store: SessionStore, _ session: Session) async throws {
        try await store.exclusively { try await store.begin(session) }
    }

    func setFeatures(_ store: SessionStore, _ features: Set<Feature>) async throws {
        try await store.exclusively { try await store.setFeatures(features) }
    }

    @discardableResult
    func end(_ store: SessionStore) async throws -> SessionStore.Ending {
        try await store.exclusively { try await store.end() }
    }

    /// Taking up a journal, in a turn as the service does.
    func recover(
        _ store: SessionStore, _ state: JournalState?, ownerConnected: @escaping (String) -> Bool, nowUsec: UInt64
    ) async -> SessionStore.Recovery {
        try! await store.exclusively { await store.recover(state, ownerConnected: ownerConnected, nowUsec: nowUsec) }
    }

    /// A second driver: it delivers `delivers` and fails its next apply when told.
    final class TestDriver: FeatureDriver {
        let name: String
        var capabilities: [Feature: FeatureCapability]
        var desktopPart: DesktopPart? { nil }
        var applied: [DriverTarget] = []
        var failNext = false
        /// Its applies (counted from 0) that fail.
        var failing: Set<Int> = []
        /// What it runs, as its record: the features applied last.
        var running: Set<Feature> = []

        init(name: String = "test", delivers: Set<Feature>) {
            self.name = name
            capabilities = Dictionary(uniqueKeysWithValues: delivers.map { ($0, .delivers(.wholeScreen)) })
        }

        nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {}
        nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool {
            applied.append(target)
            if failNext || failing.contains(applied.count - 1) {
                failNext = false
                throw DriverFailure(.failed, "\(name): injected failure")
            }
            let grew = !target.features.isSubset(of: running)
            running = target.features
            return grew
        }
        var record: JSON? { running.isEmpty ? nil : .array(running.sortedWireNames.map(JSON.string)) }
        nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote] {
            running = target?.features ?? []
            return []
        }
    }

    // MARK: The transaction

    @Test func theJournalKnowsTheSnapshotBeforeTheSettingsChange() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(4.0)])
        let store = store(backend)
        try await begin(store, Self.session([.invertColors]))
        #expect(try journaledSnapshot()[.magFactor] == .set(.double(4.0)))
        #expect(try journaledSnapshot()[.invertLightness] == .unset)
        #expect(try backend.userValue(of: .invertLightness) == .bool(true))
        #expect(store.session?.features == [.invertColors])
        #expect(store.isCurrent(store.generation))
    }

    @Test func aFailedWriteIsBackendFailedAndPutsTheJournalBack() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        backend.failNextApply()
        await #expect(throws: GuidedAccessError.backendFailed("memory backend: injected failure")) {
            try await begin(store, Self.session([.invertColors]))
        }
        #expect(try journal.load() == JournalState(session: nil, restrictions: []))
        #expect(backend.values.isEmpty)
        #expect(store.session == nil)
    }

    @Test func aJournalThatCannotBeWrittenStopsTheChange() async throws {
        let backend = MemorySettingsBackend()
        let other = TestDriver(delivers: [.zoom])
        let store = store(backend, journal: SessionJournal(directory: "/proc/guidedaccess-no-such-dir"), then: [other])
        await #expect(throws: GuidedAccessError.self) { try await begin(store, Self.session([.zoom])) }
        #expect(backend.appliedCount == 0 && other.applied.isEmpty)
        #expect(store.session == nil)
        #expect(Self.settings(store).record == nil)
    }

    @Test func aValueTheBackendRejectsIsUnsupportedAndChangesNothing() async throws {
        // A system whose text-scaling-factor stops below the session's scale.
        var keys = MemorySettingsBackend.gnome43Keys
        keys[.textScalingFactor] = .double(0.5...1.2)
        let backend = MemorySettingsBackend(knownKeys: keys)
        let store = store(backend)
        await #expect(throws: GuidedAccessError.self) { try await begin(store, Self.session([.largeText])) }
        #expect(backend.appliedCount == 0)
        #expect(try journal.load() == nil)
    }

    @Test func keysGivenBackLeaveTheSnapshotAndTheJournalCatchesUpLater() async throws {
        let backend = MemorySettingsBackend(values: [.invertLightness: .bool(false)])
        let store = store(backend)
        try await begin(store, Self.session([.zoom, .invertColors]))
        try await setFeatures(store, [.zoom])
        #expect(try backend.userValue(of: .invertLightness) == .bool(false))
        #expect(Self.settings(store).snapshot[.invertLightness] == nil)
        // Written before the restore: the journal still lists the key.
        #expect(store.journalBehind)
        #expect(try journaledSnapshot()[.invertLightness] == .set(.bool(false)))
        try store.refreshJournal()
        #expect(!store.journalBehind)
        #expect(try journaledSnapshot()[.invertLightness] == nil)
        #expect(try journal.load()?.session?.features == [.zoom])
    }

    @Test func aChangeThatCannotBeJournaledIsNotKept() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        try await begin(store, Self.session([.zoom]))
        try FileManager.default.removeItem(atPath: directory.path)
        try "not a directory".write(toFile: directory.path, atomically: false, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: directory.path) }
        #expect(throws: GuidedAccessError.self) { try store.change { $0.takeOver(by: BusCaller(uniqueName: ":1.9", identity: Self.kiosk.identity)) } }
        #expect(store.session?.owner == ":1.1")
        // What happened regardless is kept; the journal's error is returned for the log.
        #expect(store.note { $0.connectionLeft(":1.1") } != nil)
        #expect(store.session?.owner == nil)
    }

    // MARK: Across drivers

    @Test func everyDriverAppliesTheSessionInTheListsOrder() async throws {
        let backend = MemorySettingsBackend()
        let first = TestDriver(name: "first", delivers: [.screenReader]), second = TestDriver(name: "second", delivers: [.zoom])
        let store = store(backend, then: [first, second])
        try await begin(store, Self.session([.screenReader, .zoom]))
        #expect(first.running == [.screenReader, .zoom] && second.running == [.screenReader, .zoom])
        #expect(backend.values[.screenReaderEnabled] == .bool(true))
        // A record that grew is journaled at once, beside the settings' —
        // with the session as it now is, not as it was before.
        #expect(try journal.load()?.drivers["first"] == .array([.string("screen-reader"), .string("zoom")]))
        #expect(try journal.load()?.session == store.session)
        try await setFeatures(store, [.zoom, .screenReader, .highContrast])
        #expect(try journal.load()?.drivers["first"] == .array([.string("high-contrast"), .string("screen-reader"), .string("zoom")]))
        #expect(try journal.load()?.session?.features == [.zoom, .screenReader, .highContrast])
        try await setFeatures(store, [.zoom])
        #expect(first.running == [.zoom] && second.applied.last?.features == [.zoom])
    }

    @Test func applyingTheSessionAgainJournalsWhatADriverStarted() async throws {
        let program = TestDriver(delivers: [.screenReader])
        let store = store(MemorySettingsBackend(), then: [program])
        try await begin(store, Self.session([.screenReader]))
        program.running = []  // it gave up, say; applied again, it starts again
        let problems = try await store.exclusively { await store.reapply() }
        #expect(problems.isEmpty)
        #expect(program.running == [.screenReader])
        #expect(try journal.load()?.drivers["test"] == .array([.string("screen-reader")]))
        #expect(try journal.load()?.session == store.session)
    }

    @Test func aFailedUndoIsInTheErrorAndTheJournalKeepsWhatWasDone() async throws {
        let first = TestDriver(name: "first", delivers: [.zoom]), second = TestDriver(name: "second", delivers: [.screenReader])
        let store = store(MemorySettingsBackend(), then: [first, second])
        try await begin(store, Self.session([.highContrast]))
        // The second fails the change; the first cannot undo it.
        first.failing = [2]
        second.failNext = true
        await #expect(throws: GuidedAccessError.backendFailed("second: injected failure; undoing it: first: injected failure")) {
            try await setFeatures(store, [.highContrast, .zoom])
        }
        #expect(store.session?.features == [.highContrast])
        // What the first still runs is journaled, for a restart to undo.
        #expect(first.running == [.highContrast, .zoom])
        #expect(try journal.load()?.drivers["first"] == .array([.string("high-contrast"), .string("zoom")]))
    }

    @Test func aDriverThatFailsUndoesTheWholeChangeAndTheSessionDoesNotStart() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(3.0)])
        let program = TestDriver(delivers: [.screenReader])
        let store = store(backend, then: [program])
        program.failNext = true
        await #expect(throws: GuidedAccessError.backendFailed("test: injected failure")) {
            try await begin(store, Self.session([.screenReader, .zoom]))
        }
        #expect(store.session == nil)
        #expect(backend.values == [.magFactor: .double(3.0)], "the keys written for the session were not put back")
        #expect(program.applied.map(\.features) == [[.screenReader, .zoom], []])
        #expect(try journal.load() == JournalState(session: nil, restrictions: []))
        #expect(!store.hasLeftovers)
    }

    @Test func aDriverThatFailsAChangeLeavesTheSessionAsItWas() async throws {
        let backend = MemorySettingsBackend()
        let program = TestDriver(delivers: [.screenReader])
        let store = store(backend, then: [program])
        try await begin(store, Self.session([.highContrast]))
        let before = backend.values
        program.failNext = true
        await #expect(throws: GuidedAccessError.self) { try await setFeatures(store, [.highContrast, .screenReader, .zoom]) }
        #expect(store.session?.features == [.highContrast])
        #expect(backend.values == before)
        #expect(program.running == [.highContrast])
        #expect(try journal.load()?.session?.features == [.highContrast])
    }

    @Test func aDriverReachingPartOfTheScreenIsToldWhatAnotherCoversWhole() async throws {
        let whole = TestDriver(name: "whole", delivers: [.zoom])
        let part = TestDriver(name: "part", delivers: [])
        part.capabilities = [.zoom: .delivers(.part), .largeText: .delivers(.part)]
        let store = store(MemorySettingsBackend(), then: [whole, part])
        try await begin(store, Self.session([.zoom, .largeText]))
        #expect(part.applied.last?.coveredElsewhere == [.zoom])
        #expect(part.applied.last?.forPart == [.largeText])
        #expect(whole.applied.last?.coveredElsewhere == [])
    }

    // MARK: Ending

    @Test func endingRestoresEveryKeyAllowsEveryRestrictionAndForgetsTheSession() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(4.0)])
        let program = TestDriver(delivers: [.zoom])
        let store = store(backend, then: [program])
        var registry = store.registry
        try registry.register([RestrictionRegistration(identifier: "org.example.pay", text: "Pay")])
        try store.commit(registry)
        try await begin(store, Self.session([.zoom]))
        registry = store.registry
        try registry.setState(.deny, of: "org.example.pay")
        try store.commit(registry)
        let ending = try await end(store)
        #expect(ending.allowedAgain == ["org.example.pay"])
        #expect(ending.journalProblem == nil && ending.problems.isEmpty)
        #expect(ending.summaries == [DriverSummary(text: "3 keys restored", fields: ["RESTORED_KEYS": "3"])])
        #expect(backend.values == [.magFactor: .double(4.0)])
        #expect(program.running.isEmpty)
        #expect(store.session == nil)
        #expect(try journal.load() == JournalState(
            session: nil, restrictions: [Restriction(identifier: "org.example.pay", text: "Pay", detail: "")]))
    }

    @Test func anEndTheBackendRefusesKeepsTheSessionAndWhatTheOtherDriversRun() async throws {
        let backend = MemorySettingsBackend()
        let program = TestDriver(delivers: [.zoom])
        let store = store(backend, then: [program])
        try await begin(store, Self.session([.zoom]))
        backend.failNextApply()
        await #expect(throws: GuidedAccessError.backendFailed(
            "memory backend: cannot restore the settings: injected failure")) { try await end(store) }
        #expect(store.session?.features == [.zoom])
        #expect(program.running == [.zoom])
        #expect(try journal.load()?.session != nil)
        _ = try await end(store)
        #expect(backend.values.isEmpty)
    }

    @Test func aLaterDriverThatCannotReleaseDoesNotKeepTheSession() async throws {
        let backend = MemorySettingsBackend()
        let program = TestDriver(delivers: [.zoom])
        let store = store(backend, then: [program])
        try await begin(store, Self.session([.zoom]))
        program.failNext = true
        let ending = try await end(store)
        #expect(ending.problems == ["test: injected failure"])
        #expect(store.session == nil && backend.values.isEmpty)
    }

    // MARK: Writes of unknown outcome, ends that cannot be recorded, turns

    static let unanswered = SettingsBackendError(.outcomeUnknown, "no answer in time")

    @Test func aWriteOfUnknownOutcomeIsBackendFailedAndItsKeysArePutBackByTheNextChange() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        try await begin(store, Self.session([.zoom]))
        // The store wrote after all (a stalled dconf-service that ran again).
        backend.failNextApply(with: Self.unanswered, appliedAnyway: true)
        await #expect(throws: GuidedAccessError.backendFailed("memory backend: no answer in time")) {
            try await setFeatures(store, [.zoom, .grayscale])
        }
        #expect(store.session?.features == [.zoom])
        #expect(Self.settings(store).snapshot[.colorSaturation] == .unset)
        #expect(try journaledSnapshot()[.colorSaturation] == .unset)
        #expect(try journal.load()?.session?.features == [.zoom])
        _ = try await end(store)
        #expect(backend.values.isEmpty)
    }

    @Test func keysOwedByASessionThatDidNotStartAreJournaledAndPutBackLater() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        backend.failNextApply(with: Self.unanswered, appliedAnyway: true)
        await #expect(throws: GuidedAccessError.self) { try await begin(store, Self.session([.grayscale])) }
        #expect(store.session == nil)
        let owed = Self.settings(store).snapshot
        #expect(owed.count == 4 && owed.values.allSatisfy { $0 == .unset })
        #expect(store.hasLeftovers)
        #expect(backend.values[.colorSaturation] == .double(0.0))
        #expect(try journal.load() == JournalState(session: nil, restrictions: [], drivers: Self.settingsRecord(owed)))
        #expect(try await store.exclusively { await store.settle() })
        #expect(backend.values.isEmpty && !store.hasLeftovers)
        #expect(try journal.load()?.drivers.isEmpty == true)
    }

    @Test func theNextSessionPutsBackTheOwedKeysItDoesNotWrite() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        backend.failNextApply(with: Self.unanswered, appliedAnyway: true)
        await #expect(throws: GuidedAccessError.self) { try await begin(store, Self.session([.grayscale])) }
        try await begin(store, Self.session([.zoom]))
        #expect(backend.values[.colorSaturation] == nil)
        #expect(Self.settings(store).snapshot[.colorSaturation] == nil)
        _ = try await end(store)
        #expect(backend.values.isEmpty)
    }

    @Test func aRestartPutsBackEveryOwedKeyWhateverItsValue() async throws {
        // text-scaling-factor at 1.5 is no value a session of no features
        // would write: owed, it is put back all the same.
        let backend = MemorySettingsBackend(values: [.textScalingFactor: .double(1.5)])
        try journal.record(JournalState(session: nil, restrictions: [], drivers: Self.settingsRecord([.textScalingFactor: .unset])))
        let store = store(backend)
        let recovery = await recover(store, try #require(try journal.load()), ownerConnected: { _ in false }, nowUsec: 1)
        #expect(recovery.notes.isEmpty)
        #expect(backend.values.isEmpty && !store.hasLeftovers && store.session == nil)
        #expect(try journal.load()?.drivers.isEmpty == true)
    }

    @Test func owedKeysARestartCannotPutBackStayOwed() async throws {
        let backend = MemorySettingsBackend(values: [.textScalingFactor: .double(1.5)])
        let store = store(backend)
        backend.failNextApply()
        let recovery = await recover(store, 
            JournalState(session: nil, restrictions: [], drivers: Self.settingsRecord([.textScalingFactor: .unset])),
            ownerConnected: { _ in false }, nowUsec: 1)
        #expect(recovery.notes.map(\.level) == [.error])
        #expect(store.hasLeftovers)
        #expect(try await store.exclusively { await store.settle() })
        #expect(backend.values.isEmpty)
    }

    @Test func anEndThatCannotBeRecordedChangesNothingAndCanBeRetried() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        try await begin(store, Self.session([.zoom]))
        let zoomed = backend.values
        try FileManager.default.removeItem(atPath: directory.path)
        try "not a directory".write(toFile: directory.path, atomically: false, encoding: .utf8)
        await #expect(throws: GuidedAccessError.self) { try await end(store) }
        #expect(store.session?.features == [.zoom])
        #expect(backend.values == zoomed)
        try FileManager.default.removeItem(atPath: directory.path)
        _ = try await end(store)
        #expect(backend.values.isEmpty)
        #expect(try journal.load()?.session == nil)
    }

    @Test func aCommitThatChangesNothingWritesNoJournal() throws {
        let store = store(MemorySettingsBackend())
        var registry = store.registry
        try registry.register([RestrictionRegistration(identifier: "org.example.pay", text: "Pay")])
        try store.commit(registry)
        // A journal that can no longer be written: only a write would notice.
        try FileManager.default.removeItem(atPath: directory.path)
        try "not a directory".write(toFile: directory.path, atomically: false, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: directory.path) }
        var same = store.registry
        try same.register([RestrictionRegistration(identifier: "org.example.pay", text: "Pay")])
        try store.commit(same)
    }

    @MainActor @Test func whatHappensWhileAWriteIsOutIsKeptAndJournaledWithIt() async throws {
        let backend = TestBackend(realisesEveryFeature: true)
        let store = SessionStore(journal: journal, drivers: [SettingsDriver(backend: backend)])
        try await store.exclusively { try await store.begin(Self.session([.zoom])) }
        backend.holdNext = true
        let write = Task { @MainActor in try await store.exclusively { try await store.setFeatures([.zoom, .grayscale]) } }
        try await backend.release { () throws in
            // The owner leaves while dconf-service writes: the journal keeps
            // the write it is ahead by, and the departure.
            store.note { $0.connectionLeft(":1.1") }
            #expect(try journal.load()?.session?.owner == nil)
            #expect(try journal.load()?.session?.features == [.zoom, .grayscale])
            #expect(store.session?.features == [.zoom])
        }
        try await write.value
        #expect(store.session?.owner == nil)
        #expect(store.session?.features == [.zoom, .grayscale])
    }

    @MainActor @Test func changesTakeTurnsInTheOrderTheyCame() async throws {
        let backend = TestBackend(realisesEveryFeature: true)
        let store = SessionStore(journal: journal, drivers: [SettingsDriver(backend: backend)])
        try await store.exclusively { try await store.begin(Self.session([.zoom])) }
        backend.holdNext = true
        let first = Task { @MainActor in try await store.exclusively { try await store.setFeatures([.zoom, .grayscale]) } }
        var order: [String] = []
        await backend.release {
            let second = Task { @MainActor in
                try await store.exclusively {
                    // Checked in its turn: the first write is done.
                    order.append("second sees \(store.session!.features.sortedWireNames)")
                    try await store.setFeatures(store.session!.features.union([.highContrast]))
                }
            }
            _ = second
            order.append("first released")
        }
        try await first.value
        while store.session?.features.contains(.highContrast) != true { await Task.yield() }
        #expect(order == ["first released", "second sees [\"grayscale\", \"zoom\"]"])
        #expect(store.session?.features == [.zoom, .grayscale, .highContrast])
    }

    // MARK: Taking up the journal

    /// A journal holding `session` and the settings' `snapshot`, loaded back.
    func journaled(_ session: Session, snapshot: [SettingKey: StoredValue]) throws -> JournalState {
        try journal.record(JournalState(session: session, restrictions: [], drivers: Self.settingsRecord(snapshot)))
        return try #require(try journal.load())
    }

    static let options = FeatureKeyMap.Options(zoomFactor: 2, textScale: 1.5)

    @Test func aJournalAheadOfTheSettingsIsWrittenThrough() throws {
        // Crashed after the journal, before the write: invert is not on yet.
        let plan = SettingsRecoveryPlan(
            features: [.invertColors], options: Self.options, keyMap: FeatureKeyMap(),
            snapshot: [.screenMagnifierEnabled: .unset, .magFactor: .unset, .screenPosition: .unset, .invertLightness: .unset],
            currentValues: [.screenMagnifierEnabled: nil, .magFactor: nil, .screenPosition: nil, .invertLightness: nil],
            endsNow: false)
        #expect(plan.changes == [
            .screenMagnifierEnabled: .bool(true), .magFactor: .double(1.0), .screenPosition: .string("full-screen"),
            .invertLightness: .bool(true),
        ])
        #expect(plan.givenBack.isEmpty)
    }

    @Test func aRestoreThatNeverHappenedIsDoneAndAKeyChangedSinceIsLeftAlone() throws {
        // The session turned zoom off (features say so) but crashed before
        // giving mag-factor back; the user set text-scaling-factor since large-text went off.
        let plan = SettingsRecoveryPlan(
            features: [], options: Self.options, keyMap: FeatureKeyMap(),
            snapshot: [.magFactor: .set(.double(4.0)), .textScalingFactor: .unset],
            currentValues: [.magFactor: .double(2.0), .textScalingFactor: .double(1.25)], endsNow: false)
        #expect(plan.changes == [.magFactor: .double(4.0)])
        #expect(plan.givenBack == [.magFactor, .textScalingFactor])
    }

    @Test func aSessionAboutToEndWritesNothingAndKeepsWhatItsEndMustRestore() throws {
        let plan = SettingsRecoveryPlan(
            features: [.invertColors], options: Self.options, keyMap: FeatureKeyMap(),
            snapshot: [.invertLightness: .unset, .colorSaturation: .set(.double(0.5))],
            currentValues: [.invertLightness: nil, .colorSaturation: .double(0.0)], endsNow: true)
        #expect(plan.changes.isEmpty)
        #expect(plan.givenBack.isEmpty)
    }

    @Test func aKeyThatCannotBeReadIsLeftAsTheJournalHasIt() throws {
        let plan = SettingsRecoveryPlan(
            features: [], options: Self.options, keyMap: FeatureKeyMap(), snapshot: [.magFactor: .set(.double(4.0))],
            currentValues: [:], endsNow: false)
        #expect(plan.changes.isEmpty && plan.givenBack.isEmpty)
    }

    @Test func anExpiredSessionIsToEndAndItsDepartedOwnerDropped() async throws {
        let backend = MemorySettingsBackend(values: [.invertLightness: .bool(true), .screenMagnifierEnabled: .bool(true)])
        let store = store(backend)
        let state = try journaled(
            Self.session([.invertColors], deadlineUsec: 10), snapshot: [.invertLightness: .unset, .screenMagnifierEnabled: .unset])
        let recovery = await recover(store, state, ownerConnected: { _ in false }, nowUsec: 11)
        #expect(recovery.expired && recovery.endsNow && recovery.ownerDropped && !recovery.unfinishedEnd)
        #expect(recovery.session?.owner == nil)
        #expect(backend.appliedCount == 0, "a session about to end is not written to")
        _ = try await end(store)
        #expect(backend.values.isEmpty)
    }

    @Test func aRestartFinishesAnEndThatWasUnderWay() async throws {
        var session = Self.session([.invertColors])
        session.isEnding = true
        let store = store(MemorySettingsBackend())
        let recovery = await recover(store, 
            try journaled(session, snapshot: [.invertLightness: .unset]), ownerConnected: { _ in true }, nowUsec: 1)
        #expect(recovery.unfinishedEnd && recovery.endsNow && !recovery.expired)
    }

    @Test func recoveringWritesTheKeysForgetsWhatWasGivenBackAndJournalsIt() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(2.0)])
        let state = try journaled(Self.session([.highContrast]), snapshot: [.highContrast: .unset, .magFactor: .set(.double(4.0))])
        let store = store(backend)
        let recovery = await recover(store, state, ownerConnected: { _ in false }, nowUsec: 1)
        #expect(recovery.journalProblem == nil)
        #expect(recovery.notes.map(\.level) == [.notice])
        #expect(backend.values == [.magFactor: .double(4.0), .highContrast: .bool(true)])
        #expect(Self.settings(store).snapshot == [.highContrast: .unset])
        #expect(store.session?.owner == nil)
        #expect(try journal.load()?.session == store.session)
        #expect(try journaledSnapshot() == [.highContrast: .unset])
        #expect(store.isCurrent(store.generation))
    }

    @Test func aRecoveryWriteThatFailsKeepsTheKeysForTheEnd() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(2.0)])
        let store = store(backend)
        backend.failNextApply()
        let recovery = await recover(store, 
            try journaled(Self.session([]), snapshot: [.magFactor: .set(.double(4.0))]), ownerConnected: { _ in true }, nowUsec: 1)
        #expect(recovery.notes == [DriverNote(.error, "cannot put org.gnome.desktop.a11y.magnifier mag-factor in line with the journal: injected failure")])
        #expect(Self.settings(store).snapshot == [.magFactor: .set(.double(4.0))])
        _ = try await end(store)
        #expect(backend.values == [.magFactor: .double(4.0)])
    }

    @Test func eachDriverTakesUpItsOwnRecordForTheResumedSession() async throws {
        let program = TestDriver(delivers: [.screenReader])
        let store = store(MemorySettingsBackend(), then: [program])
        let state = JournalState(
            session: Self.session([.screenReader]), restrictions: [], drivers: ["test": .array([.string("screen-reader")])])
        _ = await recover(store, state, ownerConnected: { _ in true }, nowUsec: 1)
        #expect(program.running == [.screenReader])
    }

    @Test func aRecordOfADriverThisConfigurationDoesNotRunIsReportedAndDropped() async throws {
        let store = store(MemorySettingsBackend())
        let recovery = await recover(store, 
            JournalState(session: nil, restrictions: [], drivers: ["browser": .object([])]), ownerConnected: { _ in true },
            nowUsec: 1)
        #expect(recovery.notes.count == 1 && recovery.notes[0].text.contains("'browser'"))
        #expect(try journal.load()?.drivers.isEmpty == true)
    }

    @Test func withoutASessionTheRestrictionsComeBackAllowed() async throws {
        let store = store(MemorySettingsBackend())
        let recovery = await recover(store, 
            JournalState(session: nil, restrictions: [Restriction(identifier: "a", text: "A", detail: "")]),
            ownerConnected: { _ in true }, nowUsec: 1)
        #expect(recovery.session == nil && recovery.notes.isEmpty)
        #expect(store.registry.restrictions.map(\.identifier) == ["a"])
        #expect(store.session == nil)
    }

    // MARK: What is supported

    @Test func supportIsComputedFromTheDriversAndFollowsTheirChanges() {
        let program = TestDriver(delivers: [])
        program.capabilities = [.screenReader: .unavailable("orca is not installed")]
        var keys = MemorySettingsBackend.gnome43Keys
        keys[.colorSaturation] = nil
        let store = store(MemorySettingsBackend(knownKeys: keys), then: [program])
        #expect(!store.support.supported.contains(.grayscale))
        #expect(store.support.reasons[.grayscale]?.hasPrefix("grayscale: this system's settings") == true)
        // The memory backend delivers what a driver cannot: supported.
        #expect(store.support.supported.contains(.screenReader))
        #expect(!store.updateSupport())
        program.capabilities = [:]
        #expect(!store.updateSupport(), "what the memory backend delivers does not depend on the other drivers")
    }
}
