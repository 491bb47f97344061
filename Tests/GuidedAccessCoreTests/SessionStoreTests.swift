import Foundation
import Testing

@testable import GuidedAccessCore

/// The transaction (snapshot → journal → apply → forget → refresh), ending,
/// and taking up a journal after a restart — with the memory backend, a
/// journal in a temporary directory, and no bus.
@Suite struct SessionStoreTests {
    let directory = SessionJournalTests.TemporaryDirectory()
    var journal: SessionJournal { SessionJournal(directory: directory.path) }
    static let kiosk = BusCaller(uniqueName: ":1.1", identity: CallerIdentity(
        uid: 1000, executable: Executable(path: "/usr/bin/kiosk", file: FileIdentity(device: 1, inode: 2))))

    func store(_ backend: MemorySettingsBackend, journal: SessionJournal? = nil) -> SessionStore {
        SessionStore(journal: journal ?? self.journal, backend: backend, keyMap: FeatureKeyMap())
    }

    static func session(_ features: Set<Feature>, owner: BusCaller = kiosk, deadlineUsec: UInt64 = 0) -> Session {
        var session = Session(
            owner: owner,
            options: SessionParameters(timeLimitSec: 0, features: features, zoomFactor: 2, textScale: 1.5, inhibitSleep: true),
            nowUsec: 0)
        session.deadlineUsec = deadlineUsec
        return session
    }

    // The writes, each in a turn of its own, as the service makes them.
    func begin(_ store: SessionStore, _ session: Session) async throws {
        try await store.exclusively { try await store.begin(session) }
    }

    @discardableResult
    func setFeatures(_ store: SessionStore, _ features: Set<Feature>) async throws -> Set<Feature> {
        try await store.exclusively { try await store.setFeatures(features) }
    }

    @discardableResult
    func end(_ store: SessionStore) async throws -> SessionStore.Ending {
        try await store.exclusively { try await store.end() }
    }

    // MARK: The transaction

    @Test func theJournalKnowsTheSnapshotBeforeTheSettingsChange() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(4.0)])
        let store = store(backend)
        try await begin(store, Self.session([.invertColors]))
        #expect(try journal.load()?.session?.snapshot[.magFactor] == .set(.double(4.0)))
        #expect(try journal.load()?.session?.snapshot[.invertLightness] == .unset)
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

    @Test func aJournalThatCannotBeWrittenStopsTheSettingsWrite() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend, journal: SessionJournal(directory: "/proc/guidedaccess-no-such-dir"))
        await #expect(throws: GuidedAccessError.self) { try await begin(store, Self.session([.zoom])) }
        #expect(backend.appliedCount == 0)
        #expect(store.session == nil)
    }

    @Test func aValueTheBackendRejectsIsUnsupportedAndWritesNothing() async throws {
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
        let turnedOff = try await setFeatures(store, [.zoom])
        #expect(turnedOff == [.invertColors])
        #expect(try backend.userValue(of: .invertLightness) == .bool(false))
        #expect(store.session?.snapshot[.invertLightness] == nil)
        // Written before the restore: the journal still lists the key.
        #expect(store.journalBehind)
        #expect(try journal.load()?.session?.snapshot[.invertLightness] == .set(.bool(false)))
        try store.refreshJournal()
        #expect(!store.journalBehind)
        #expect(try journal.load()?.session?.snapshot[.invertLightness] == nil)
        #expect(try journal.load()?.session?.features == [.zoom])
    }

    @Test func turningOffAFeatureDropsItsProgramFromTheRecord() async throws {
        let store = store(MemorySettingsBackend())
        try await begin(store, Self.session([.screenReader, .zoom]))
        try store.change { $0.programs[.screenReader] = .unit(SessionProgramKind.screenReader.unitName(pid: 42, run: 1)) }
        #expect(try journal.load()?.session?.programs[.screenReader] != nil)
        #expect(try await setFeatures(store, [.zoom]) == [.screenReader])
        #expect(store.session?.programs.isEmpty == true)
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

    // MARK: Ending

    @Test func endingRestoresEveryKeyAllowsEveryRestrictionAndForgetsTheSession() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(4.0)])
        let store = store(backend)
        var registry = store.registry
        try registry.register([RestrictionRegistration(identifier: "org.example.pay", text: "Pay")])
        try store.commit(registry)
        try await begin(store, Self.session([.zoom]))
        registry = store.registry
        try registry.setState(.deny, of: "org.example.pay")
        try store.commit(registry)
        let ending = try await end(store)
        #expect(ending.allowedAgain == ["org.example.pay"])
        #expect(ending.journalProblem == nil)
        #expect(backend.values == [.magFactor: .double(4.0)])
        #expect(store.session == nil)
        #expect(try journal.load() == JournalState(
            session: nil, restrictions: [Restriction(identifier: "org.example.pay", text: "Pay", detail: "")]))
    }

    @Test func anEndTheBackendRefusesKeepsTheSession() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        try await begin(store, Self.session([.zoom]))
        backend.failNextApply()
        await #expect(throws: GuidedAccessError.backendFailed(
            "memory backend: cannot restore the settings: injected failure")) { try await end(store) }
        #expect(store.session?.features == [.zoom])
        #expect(try journal.load()?.session != nil)
        _ = try await end(store)
        #expect(backend.values.isEmpty)
    }

    // MARK: Writes of unknown outcome, ends that cannot be recorded, turns

    static let unanswered = SettingsBackendError(.outcomeUnknown, "no answer in time")

    @Test func aWriteOfUnknownOutcomeIsBackendFailedAndItsKeysAreRestoredAtTheEnd() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        try await begin(store, Self.session([.zoom]))
        // The store wrote after all (a stalled dconf-service that ran again).
        backend.failNextApply(with: Self.unanswered, appliedAnyway: true)
        await #expect(throws: GuidedAccessError.backendFailed("memory backend: no answer in time")) {
            try await setFeatures(store, [.zoom, .grayscale])
        }
        #expect(store.session?.features == [.zoom])
        #expect(store.session?.snapshot[.colorSaturation] == .unset)
        #expect(try journal.load()?.session?.snapshot[.colorSaturation] == .unset)
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
        #expect(store.owed.count == 4 && store.owed.values.allSatisfy { $0 == .unset })
        #expect(backend.values[.colorSaturation] == .double(0.0))
        #expect(try journal.load() == JournalState(session: nil, restrictions: [], owed: store.owed))
        #expect(try await store.exclusively { await store.settleOwed() })
        #expect(backend.values.isEmpty && store.owed.isEmpty)
        #expect(try journal.load()?.owed.isEmpty == true)
    }

    @Test func theNextSessionTakesOverTheOwedKeysAndItsEndRestoresThem() async throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        backend.failNextApply(with: Self.unanswered, appliedAnyway: true)
        await #expect(throws: GuidedAccessError.self) { try await begin(store, Self.session([.grayscale])) }
        try await begin(store, Self.session([.zoom]))
        #expect(store.owed.isEmpty)
        #expect(store.session?.snapshot[.colorSaturation] == .unset)
        _ = try await end(store)
        #expect(backend.values.isEmpty)
    }

    @Test func aRestartPutsBackEveryOwedKeyWhateverItsValue() async throws {
        // text-scaling-factor at 1.5 is no value a session of no features
        // would write: owed, it is put back all the same.
        let backend = MemorySettingsBackend(values: [.textScalingFactor: .double(1.5)])
        let state = JournalState(session: nil, restrictions: [], owed: [.textScalingFactor: .unset])
        try journal.record(state)
        let store = store(backend)
        let recovery = await store.recover(try #require(try journal.load()), ownerConnected: { _ in false }, nowUsec: 1)
        #expect(!recovery.owedProblem)
        #expect(backend.values.isEmpty && store.owed.isEmpty && store.session == nil)
        #expect(try journal.load()?.owed.isEmpty == true)
    }

    @Test func owedKeysARestartCannotPutBackStayOwed() async throws {
        let backend = MemorySettingsBackend(values: [.textScalingFactor: .double(1.5)])
        let store = store(backend)
        backend.failNextApply()
        let recovery = await store.recover(
            JournalState(session: nil, restrictions: [], owed: [.textScalingFactor: .unset]), ownerConnected: { _ in false },
            nowUsec: 1)
        #expect(recovery.owedProblem)
        #expect(store.owed == [.textScalingFactor: .unset])
        #expect(try await store.exclusively { await store.settleOwed() })
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

    @Test func aRestartFinishesAnEndThatWasUnderWay() throws {
        var session = Self.session([.invertColors])
        session.isEnding = true
        session.snapshot = [.invertLightness: .unset]
        let plan = RecoveryPlan(
            state: JournalState(session: session, restrictions: []), keyMap: FeatureKeyMap(),
            currentValues: [.invertLightness: .bool(true)], ownerConnected: true, nowUsec: 1)
        #expect(plan.unfinishedEnd && plan.endsNow && !plan.expired)
        #expect(plan.changes.isEmpty && plan.givenBack.isEmpty)
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

    /// The memory backend, but a write can be held until the test lets it go.
    final class HeldBackend: SettingsBackend {
        let inner = MemorySettingsBackend()
        var holdNext = false
        var held: CheckedContinuation<Void, Never>?
        var name: String { inner.name }
        var realisesEveryFeature: Bool { true }
        func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
            inner.availability(of: key, for: value)
        }
        func check(_ changes: [SettingKey: SettingValue?]) throws(SettingsBackendError) -> CheckedChange {
            try inner.check(changes)
        }
        func userValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue? { try inner.userValue(of: key) }
        nonisolated(nonsending) func apply(_ change: CheckedChange) async throws(SettingsBackendError) {
            if holdNext {
                holdNext = false
                await withCheckedContinuation { held = $0 }
            }
            try await inner.apply(change)
        }
        /// Waits until a write is held, then lets it go after `meanwhile`.
        nonisolated(nonsending) func release(after meanwhile: () throws -> Void) async rethrows {
            while held == nil { await Task.yield() }
            try meanwhile()
            held!.resume()
            held = nil
        }
    }

    @MainActor @Test func whatHappensWhileAWriteIsOutIsKeptAndJournaledWithIt() async throws {
        let backend = HeldBackend()
        let store = SessionStore(journal: journal, backend: backend, keyMap: FeatureKeyMap())
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

    @MainActor @Test func aProgramNotedWhileItsFeatureIsTurnedOffLeavesNoRecord() async throws {
        let backend = HeldBackend()
        let store = SessionStore(journal: journal, backend: backend, keyMap: FeatureKeyMap())
        try await store.exclusively { try await store.begin(Self.session([.screenReader, .zoom])) }
        backend.holdNext = true
        let write = Task { @MainActor in try await store.exclusively { try await store.setFeatures([.zoom]) } }
        await backend.release {
            // Its program started (or restarted) while the turn-off was written.
            store.note { $0.programs[.screenReader] = .unit(SessionProgramKind.screenReader.unitName(pid: 42, run: 1)) }
        }
        #expect(try await write.value == [.screenReader])
        #expect(store.session?.programs.isEmpty == true)
    }

    @MainActor @Test func writesTakeTurnsInTheOrderTheyCame() async throws {
        let backend = HeldBackend()
        let store = SessionStore(journal: journal, backend: backend, keyMap: FeatureKeyMap())
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

    /// A journal holding `session`, loaded back.
    func journaled(_ session: Session) throws -> JournalState {
        try journal.record(JournalState(session: session, restrictions: []))
        return try #require(try journal.load())
    }

    @Test func aJournalAheadOfTheSettingsIsWrittenThrough() throws {
        // Crashed after the journal, before the write: invert is not on yet.
        var session = Self.session([.invertColors])
        session.snapshot = [.screenMagnifierEnabled: .unset, .magFactor: .unset, .screenPosition: .unset, .invertLightness: .unset]
        let plan = RecoveryPlan(
            state: JournalState(session: session, restrictions: []), keyMap: FeatureKeyMap(),
            currentValues: [.screenMagnifierEnabled: nil, .magFactor: nil, .screenPosition: nil, .invertLightness: nil],
            ownerConnected: true, nowUsec: 1)
        #expect(plan.changes == [
            .screenMagnifierEnabled: .bool(true), .magFactor: .double(1.0), .screenPosition: .string("full-screen"),
            .invertLightness: .bool(true),
        ])
        #expect(plan.givenBack.isEmpty)
        #expect(!plan.expired && !plan.ownerDropped)
    }

    @Test func aRestoreThatNeverHappenedIsDoneAndAKeyChangedSinceIsLeftAlone() throws {
        // The session turned zoom off (features say so) but crashed before
        // giving mag-factor back; the user set text-scaling-factor since large-text went off.
        var session = Self.session([])
        session.snapshot = [.magFactor: .set(.double(4.0)), .textScalingFactor: .unset]
        let plan = RecoveryPlan(
            state: JournalState(session: session, restrictions: []), keyMap: FeatureKeyMap(),
            currentValues: [.magFactor: .double(2.0), .textScalingFactor: .double(1.25)],
            ownerConnected: true, nowUsec: 1)
        #expect(plan.changes == [.magFactor: .double(4.0)])
        #expect(plan.givenBack == [.magFactor, .textScalingFactor])
    }

    @Test func anExpiredSessionWritesNothingAndKeepsWhatItsEndMustRestore() throws {
        var session = Self.session([.invertColors], deadlineUsec: 10)
        session.snapshot = [.invertLightness: .unset, .colorSaturation: .set(.double(0.5))]
        let plan = RecoveryPlan(
            state: JournalState(session: session, restrictions: []), keyMap: FeatureKeyMap(),
            currentValues: [.invertLightness: nil, .colorSaturation: .double(0.0)],
            ownerConnected: false, nowUsec: 11)
        #expect(plan.expired && plan.ownerDropped)
        #expect(plan.changes.isEmpty)
        #expect(plan.givenBack.isEmpty)
        #expect(plan.session?.owner == nil)
    }

    @Test func aKeyThatCannotBeReadIsLeftAsTheJournalHasIt() throws {
        var session = Self.session([])
        session.snapshot = [.magFactor: .set(.double(4.0))]
        let plan = RecoveryPlan(
            state: JournalState(session: session, restrictions: []), keyMap: FeatureKeyMap(), currentValues: [:],
            ownerConnected: true, nowUsec: 1)
        #expect(plan.changes.isEmpty && plan.givenBack.isEmpty)
        #expect(plan.session?.snapshot == session.snapshot)
    }

    @Test func recoveringWritesTheKeysForgetsWhatWasGivenBackAndJournalsIt() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(2.0)])
        var session = Self.session([.highContrast])
        session.snapshot = [.highContrast: .unset, .magFactor: .set(.double(4.0))]
        let state = try journaled(session)
        let store = store(backend)
        let recovery = await store.recover(state, ownerConnected: { _ in false }, nowUsec: 1)
        #expect(recovery.writeProblem == nil && recovery.journalProblem == nil)
        #expect(backend.values == [.magFactor: .double(4.0), .highContrast: .bool(true)])
        #expect(store.session?.snapshot == [.highContrast: .unset])
        #expect(store.session?.owner == nil)
        #expect(try journal.load()?.session == store.session)
        #expect(store.isCurrent(store.generation))
    }

    @Test func aRecoveryWriteThatFailsKeepsTheKeysForTheEnd() async throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(2.0)])
        var session = Self.session([])
        session.snapshot = [.magFactor: .set(.double(4.0))]
        let store = store(backend)
        backend.failNextApply()
        let recovery = await store.recover(try journaled(session), ownerConnected: { _ in true }, nowUsec: 1)
        #expect(recovery.writeProblem == "injected failure")
        #expect(store.session?.snapshot == [.magFactor: .set(.double(4.0))])
        _ = try await end(store)
        #expect(backend.values == [.magFactor: .double(4.0)])
    }

    @Test func withoutASessionTheRestrictionsComeBackAllowed() async throws {
        let store = store(MemorySettingsBackend())
        let recovery = await store.recover(
            JournalState(session: nil, restrictions: [Restriction(identifier: "a", text: "A", detail: "")]),
            ownerConnected: { _ in true }, nowUsec: 1)
        #expect(recovery.plan.session == nil)
        #expect(try recovery.released?.get() == [])
        #expect(store.registry.restrictions.map(\.identifier) == ["a"])
        #expect(store.session == nil)
    }
}
