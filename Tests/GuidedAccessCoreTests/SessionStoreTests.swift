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

    // MARK: The transaction

    @Test func theJournalKnowsTheSnapshotBeforeTheSettingsChange() throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(4.0)])
        let store = store(backend)
        try store.begin(Self.session([.invertColors]))
        #expect(try journal.load()?.session?.snapshot[.magFactor] == .set(.double(4.0)))
        #expect(try journal.load()?.session?.snapshot[.invertLightness] == .unset)
        #expect(try backend.userValue(of: .invertLightness) == .bool(true))
        #expect(store.session?.features == [.invertColors])
        #expect(store.isCurrent(store.generation))
    }

    @Test func aFailedWriteIsBackendFailedAndPutsTheJournalBack() throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        backend.failNextApply()
        #expect(throws: GuidedAccessError.backendFailed("memory backend: injected failure")) {
            try store.begin(Self.session([.invertColors]))
        }
        #expect(try journal.load() == JournalState(session: nil, restrictions: []))
        #expect(backend.values.isEmpty)
        #expect(store.session == nil)
    }

    @Test func aJournalThatCannotBeWrittenStopsTheSettingsWrite() throws {
        let backend = MemorySettingsBackend()
        let store = store(backend, journal: SessionJournal(directory: "/proc/guidedaccess-no-such-dir"))
        #expect(throws: GuidedAccessError.self) { try store.begin(Self.session([.zoom])) }
        #expect(backend.appliedCount == 0)
        #expect(store.session == nil)
    }

    @Test func aValueTheBackendRejectsIsUnsupportedAndWritesNothing() throws {
        // A system whose text-scaling-factor stops below the session's scale.
        var keys = MemorySettingsBackend.gnome43Keys
        keys[.textScalingFactor] = .double(0.5...1.2)
        let backend = MemorySettingsBackend(knownKeys: keys)
        let store = store(backend)
        #expect(throws: GuidedAccessError.self) { try store.begin(Self.session([.largeText])) }
        #expect(backend.appliedCount == 0)
        #expect(try journal.load() == nil)
    }

    @Test func keysGivenBackLeaveTheSnapshotAndTheJournalCatchesUpLater() throws {
        let backend = MemorySettingsBackend(values: [.invertLightness: .bool(false)])
        let store = store(backend)
        try store.begin(Self.session([.zoom, .invertColors]))
        let turnedOff = try store.setFeatures([.zoom])
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

    @Test func turningOffAFeatureDropsItsProgramFromTheRecord() throws {
        let store = store(MemorySettingsBackend())
        try store.begin(Self.session([.screenReader, .zoom]))
        try store.change { $0.programs[.screenReader] = .unit(SessionProgramKind.screenReader.unitName(pid: 42, run: 1)) }
        #expect(try journal.load()?.session?.programs[.screenReader] != nil)
        #expect(try store.setFeatures([.zoom]) == [.screenReader])
        #expect(store.session?.programs.isEmpty == true)
    }

    @Test func aChangeThatCannotBeJournaledIsNotKept() throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        try store.begin(Self.session([.zoom]))
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

    @Test func endingRestoresEveryKeyAllowsEveryRestrictionAndForgetsTheSession() throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(4.0)])
        let store = store(backend)
        var registry = store.registry
        try registry.register([RestrictionRegistration(identifier: "org.example.pay", text: "Pay")])
        try store.commit(registry)
        try store.begin(Self.session([.zoom]))
        registry = store.registry
        try registry.setState(.deny, of: "org.example.pay")
        try store.commit(registry)
        let ending = try store.end()
        #expect(ending.allowedAgain == ["org.example.pay"])
        #expect(ending.journalProblem == nil)
        #expect(backend.values == [.magFactor: .double(4.0)])
        #expect(store.session == nil)
        #expect(try journal.load() == JournalState(
            session: nil, restrictions: [Restriction(identifier: "org.example.pay", text: "Pay", detail: "")]))
    }

    @Test func anEndTheBackendRefusesKeepsTheSession() throws {
        let backend = MemorySettingsBackend()
        let store = store(backend)
        try store.begin(Self.session([.zoom]))
        backend.failNextApply()
        #expect(throws: GuidedAccessError.backendFailed(
            "memory backend: cannot restore the settings: injected failure")) { try store.end() }
        #expect(store.session?.features == [.zoom])
        #expect(try journal.load()?.session != nil)
        _ = try store.end()
        #expect(backend.values.isEmpty)
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

    @Test func recoveringWritesTheKeysForgetsWhatWasGivenBackAndJournalsIt() throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(2.0)])
        var session = Self.session([.highContrast])
        session.snapshot = [.highContrast: .unset, .magFactor: .set(.double(4.0))]
        let state = try journaled(session)
        let store = store(backend)
        let recovery = store.recover(state, ownerConnected: { _ in false }, nowUsec: 1)
        #expect(recovery.writeProblem == nil && recovery.journalProblem == nil)
        #expect(backend.values == [.magFactor: .double(4.0), .highContrast: .bool(true)])
        #expect(store.session?.snapshot == [.highContrast: .unset])
        #expect(store.session?.owner == nil)
        #expect(try journal.load()?.session == store.session)
        #expect(store.isCurrent(store.generation))
    }

    @Test func aRecoveryWriteThatFailsKeepsTheKeysForTheEnd() throws {
        let backend = MemorySettingsBackend(values: [.magFactor: .double(2.0)])
        var session = Self.session([])
        session.snapshot = [.magFactor: .set(.double(4.0))]
        let store = store(backend)
        backend.failNextApply()
        let recovery = store.recover(try journaled(session), ownerConnected: { _ in true }, nowUsec: 1)
        #expect(recovery.writeProblem == "injected failure")
        #expect(store.session?.snapshot == [.magFactor: .set(.double(4.0))])
        _ = try store.end()
        #expect(backend.values == [.magFactor: .double(4.0)])
    }

    @Test func withoutASessionTheRestrictionsComeBackAllowed() throws {
        let store = store(MemorySettingsBackend())
        let recovery = store.recover(
            JournalState(session: nil, restrictions: [Restriction(identifier: "a", text: "A", detail: "")]),
            ownerConnected: { _ in true }, nowUsec: 1)
        #expect(recovery.plan.session == nil)
        #expect(try recovery.released?.get() == [])
        #expect(store.registry.restrictions.map(\.identifier) == ["a"])
        #expect(store.session == nil)
    }
}
