/// The session, the restrictions and what makes them survive a crash: the one
/// owner of every change to them.
///
/// A settings change is one transaction: the keys it writes are snapshotted,
/// the journal learns the new state, then the backend writes; keys given
/// back leave the snapshot once their restore is written, and the journal
/// catches up later (`journalBehind`, `refreshJournal`). So after a crash
/// the journal knows every key that may have been written and what to put
/// back — at worst a key is restored that was never changed. A write whose
/// outcome is unknown (the store did not answer in time) counts as made:
/// its keys stay in the snapshot, and the end puts them back.
///
/// Bus-free: the service calls it from its one executor, and tests drive it
/// with the memory backend. A backend write is awaited (another process
/// writes), so writes take turns (`exclusively`) while reads go on; changes
/// that write no settings (`change`, `note`, `commit`) need no turn and are
/// journaled together with a write that is out.
public final class SessionStore {
    public let journal: SessionJournal
    public let backend: any SettingsBackend
    public let keyMap: FeatureKeyMap

    /// The active session, if any: what is in effect.
    public private(set) var session: Session?
    public private(set) var registry = RestrictionRegistry()
    /// One more for every session begun or resumed: which session a call was
    /// admitted for (`isCurrent`).
    public private(set) var generation: UInt64 = 0
    /// The journal still lists keys a change gave back: written again by
    /// `refreshJournal`, off the calls' path. Any journal write clears it.
    public private(set) var journalBehind = false
    /// While a backend write is out: the session as the journal has it, one
    /// write ahead of `session` (beginning, changing features, ending).
    private var ahead: Session?
    private let turns = Turns()

    public init(journal: SessionJournal, backend: any SettingsBackend, keyMap: FeatureKeyMap) {
        self.journal = journal
        self.backend = backend
        self.keyMap = keyMap
    }

    /// Whether `generation` is the active session's.
    public func isCurrent(_ generation: UInt64) -> Bool {
        session != nil && self.generation == generation
    }

    /// Runs `body` — a call's checks of the session and the change it makes
    /// — as the only one of its kind: checks made in it still hold when its
    /// write is done. Every change that writes settings runs in one.
    public func exclusively<T>(
        isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> T
    ) async throws -> T {
        await turns.take()
        defer { turns.give() }
        return try await body()
    }

    // MARK: Sessions

    /// Starts `new` with its features' keys written, all or nothing. Keys
    /// still owed a restore (`owed`) join its snapshot: its end restores
    /// them. A write of unknown outcome makes its keys owed, and their
    /// restore is tried at once.
    nonisolated(nonsending) public func begin(_ new: Session) async throws(GuidedAccessError) {
        precondition(session == nil, "a session is active")
        var new = new
        new.snapshot.merge(owed) { _, owedValue in owedValue }
        switch await transact(keyMap.change(from: [], to: new.features, options: new.keyMapOptions), to: new) {
        case .written(let started):
            session = started
            owed = [:]
            generation &+= 1
        case .failed(let error):
            throw error
        case .unknown(let error, let attempted):
            owed = attempted.snapshot
            do {
                try record(nil)
            } catch let journalError {
                // The journal still holds the session as begun: a restart
                // would resume it.
                throw .backendFailed("\(error.message); nor can the journal record what it may have changed: \(journalError.message)")
            }
            throw error
        }
    }

    /// Keys a session that did not start may have changed (its write's
    /// outcome is unknown), with their values from before it: journaled, put
    /// back by `settleOwed` (and at the next start), or by the end of the
    /// next session, whose snapshot takes them.
    public private(set) var owed: [SettingKey: StoredValue] = [:]

    /// Puts the owed keys back; true once none are owed.
    nonisolated(nonsending) public func settleOwed() async -> Bool {
        precondition(turns.isTaken, "a settings write outside `exclusively`")
        guard session == nil else { return owed.isEmpty }
        return await restoreOwed()
    }

    nonisolated(nonsending) private func restoreOwed() async -> Bool {
        guard !owed.isEmpty else { return true }
        do {
            try await backend.apply(try backend.check(owed.mapValues(\.settingValue)))
        } catch {
            return false
        }
        owed = [:]
        try? record(nil)
        return true
    }

    /// Turns the session's features into `features`, all or nothing. The
    /// programs of features turned off leave the session's record; returns
    /// those features (their programs are the caller's to stop).
    @discardableResult
    nonisolated(nonsending) public func setFeatures(_ features: Set<Feature>) async throws(GuidedAccessError) -> Set<Feature> {
        guard var new = session else { throw .notInSession("no session is active") }
        let before = new.features
        guard features != before else { return [] }
        new.features = features
        let turnedOff = before.subtracting(features)
        for feature in turnedOff { new.programs[feature] = nil }
        switch await transact(keyMap.change(from: before, to: features, options: new.keyMapOptions), to: new) {
        case .written(var changed):
            // A program noted for one of them while the write was out.
            for feature in turnedOff { changed.programs[feature] = nil }
            session = changed
            return turnedOff
        case .failed(let error), .unknown(let error, _):
            throw error
        }
    }

    /// A change of the session that writes no settings (owner, programs):
    /// journaled first, kept only if that succeeded.
    public func change(_ body: (inout Session) -> Void) throws(GuidedAccessError) {
        guard var new = session else { throw .notInSession("no session is active") }
        body(&new)
        guard new != session else { return }
        var journaled = ahead
        if journaled != nil { body(&journaled!) }
        try record(journaled ?? new)
        session = new
        ahead = journaled
    }

    /// A change of the session that has happened whatever the journal says
    /// (its owner left the bus, a program exited): kept, and journaled as
    /// well as can be. Returns the journal's error, for the log.
    @discardableResult
    public func note(_ body: (inout Session) -> Void) -> GuidedAccessError? {
        guard var new = session else { return nil }
        body(&new)
        guard new != session else { return nil }
        session = new
        if ahead != nil { body(&ahead!) }
        do {
            try record(ahead ?? new)
            return nil
        } catch {
            return error
        }
    }

    /// What ending a session did.
    public struct Ending: Sendable {
        public var session: Session
        /// The restrictions that were denied and are allowed again, sorted.
        public var allowedAgain: [String]
        /// Why the end could not be journaled after the keys were put back,
        /// if it could not (the journal still marks the session as ending:
        /// the next start finishes the end).
        public var journalProblem: String?
    }

    /// Puts every written key back, allows every restriction again, forgets
    /// the session. The journal first marks the session as ending, so that a
    /// restart finishes the end instead of resuming it; an end that cannot be
    /// recorded, or whose keys cannot be put back, changes nothing: the
    /// session stays, for a retry.
    nonisolated(nonsending) public func end() async throws(GuidedAccessError) -> Ending {
        precondition(turns.isTaken, "a settings write outside `exclusively`")
        guard var ending = session else { throw .notInSession("no session is active") }
        ending.isEnding = true
        ahead = ending
        do {
            try record(ending)
        } catch {
            ahead = nil
            throw .backendFailed("cannot record the end of the session: \(error.message)")
        }
        let restore: CheckedChange
        do {
            restore = try backend.check(ending.restoringChanges)
            try await backend.apply(restore)
        } catch {
            // The session goes on; best effort, for the next start too.
            ahead = nil
            try? record(session)
            throw .backendFailed("\(backend.name) backend: cannot restore the settings: \(error.message)")
        }
        ahead = nil
        let ended = session!
        let allowedAgain = registry.resetAll()
        session = nil
        var problem: String?
        do {
            try record(nil)
        } catch {
            problem = "the settings are restored, but the journal cannot record that the session ended: \(error.message); the next start finishes the end"
        }
        return Ending(session: ended, allowedAgain: allowedAgain, journalProblem: problem)
    }

    // MARK: Restrictions

    /// Replaces the restrictions, journaled first. Returns false, having
    /// written nothing, when nothing changed.
    @discardableResult
    public func commit(_ updated: RestrictionRegistry) throws(GuidedAccessError) -> Bool {
        guard updated != registry else { return false }
        do {
            try journal.record(JournalState(session: ahead ?? session, restrictions: updated.restrictions, owed: owed))
        } catch {
            throw .backendFailed("cannot record the restrictions: \(error)")
        }
        journalBehind = false
        registry = updated
        return true
    }

    // MARK: The journal

    /// Writes the journal again if it still lists keys given back.
    public func refreshJournal() throws(GuidedAccessError) {
        guard journalBehind, let session, ahead == nil else { return }
        try record(session)
    }

    private func record(_ new: Session?) throws(GuidedAccessError) {
        do {
            try journal.record(JournalState(session: new, restrictions: registry.restrictions, owed: owed))
        } catch {
            throw .backendFailed("cannot record the session: \(error)")
        }
        journalBehind = false
    }

    /// How a transaction ended.
    private enum Outcome {
        /// Written: the session it makes, with what changed meanwhile.
        case written(Session)
        /// Nothing changed.
        case failed(GuidedAccessError)
        /// The write may have been made, or may yet be: its keys are in the
        /// snapshot of the session (the one given, for a session beginning).
        case unknown(GuidedAccessError, Session)
    }

    /// The transaction: checks the change's values, records the snapshot of
    /// the keys it writes, journals `target` (the session once `change` is
    /// written), then writes. On success the keys it gave back leave the
    /// snapshot.
    nonisolated(nonsending) private func transact(_ change: KeyMapChange, to target: Session) async -> Outcome {
        precondition(turns.isTaken, "a settings write outside `exclusively`")
        var target = target
        guard !change.isEmpty else {
            do {
                try record(target)
            } catch {
                return .failed(error)
            }
            return .written(target)
        }
        let checked: CheckedChange
        do {
            checked = try backend.check(target.settingChanges(for: change))
        } catch {
            return .failed(.unsupportedFeature(error.message))
        }
        let known = target.snapshot
        do {
            try target.recordSnapshot(of: change.write.keys) { key throws(SettingsBackendError) in
                try backend.userValue(of: key)
            }
        } catch {
            return .failed(.backendFailed("\(backend.name) backend: \(error.message)"))
        }
        do {
            try record(target)
        } catch {
            return .failed(.backendFailed("cannot record the session before changing settings: \(error.message)"))
        }
        ahead = target
        defer { ahead = nil }
        do {
            try await backend.apply(checked)
        } catch {
            let failure = GuidedAccessError.backendFailed("\(backend.name) backend: \(error.message)")
            guard error.kind == .outcomeUnknown else {
                // Nothing was changed (backends apply all or nothing): the
                // journal goes back, best effort — a leftover snapshot entry
                // would only make the end restore a key it never wrote.
                try? record(session)
                return .failed(failure)
            }
            let taken = ahead!.snapshot.filter { known[$0.key] == nil }
            if session != nil {  // else a session beginning: it journals what it owes
                session!.snapshot.merge(taken) { kept, _ in kept }
                try? record(session)
            }
            var owing = ahead!
            owing.snapshot.merge(taken) { kept, _ in kept }
            return .unknown(failure, owing)
        }
        var written = ahead!
        if !change.restore.isEmpty {
            written.forgetSnapshot(of: change.restore)
            journalBehind = true
        }
        return .written(written)
    }

    // MARK: Recovery

    /// What `recover` found and did, for the log.
    public struct Recovery {
        public var plan: RecoveryPlan
        /// Keys the plan wanted written that could not be, and why.
        public var writeProblem: String?
        /// Keys that could not be read to check them against the journal.
        public var unreadable: [(SettingKey, String)]
        /// The journal could not be brought up to date.
        public var journalProblem: String?
        /// No session: what the backend stopped imposing, or why it could not.
        public var released: Result<[SettingKey], SettingsBackendError>?
        /// Owed keys (`owed`) could not be put back yet.
        public var owedProblem = false
    }

    /// Takes up `state` (the journal as loaded; nil for none) after a start:
    /// the restrictions come back, and the session — its keys put in line
    /// with it (`RecoveryPlan`), its owner dropped unless `ownerConnected`
    /// says it is still on the bus. Without a session the backend lets go
    /// of what it still imposes.
    nonisolated(nonsending) public func recover(
        _ state: JournalState?, ownerConnected: (String) -> Bool, nowUsec: UInt64
    ) async -> Recovery {
        registry = RestrictionRegistry(restrictions: state?.restrictions ?? [])
        owed = state?.owed ?? [:]
        var unreadable: [(SettingKey, String)] = []
        var current: [SettingKey: SettingValue?] = [:]
        for key in (state?.session?.snapshot.keys).map(Array.init) ?? [] {
            do {
                current[key] = .some(try backend.userValue(of: key))
            } catch {
                unreadable.append((key, error.message))
            }
        }
        var plan = RecoveryPlan(
            state: state, keyMap: keyMap, currentValues: current,
            ownerConnected: state?.session?.owner.map(ownerConnected) ?? false, nowUsec: nowUsec)
        var recovery = Recovery(plan: plan, unreadable: unreadable.sorted { $0.0 < $1.0 })
        guard var recovered = plan.session else {
            if !owed.isEmpty, await !restoreOwed() { recovery.owedProblem = true }
            do {
                recovery.released = .success(try backend.startedWithoutSession())
            } catch {
                recovery.released = .failure(error)
            }
            return recovery
        }
        // A crash while a session took the owed keys over: they are its.
        let tookOwed = !owed.isEmpty
        recovered.snapshot.merge(owed) { kept, _ in kept }
        owed = [:]
        var forget = plan.givenBack
        if !plan.changes.isEmpty {
            do {
                try await backend.apply(try backend.check(plan.changes))
            } catch {
                recovery.writeProblem = error.message
                // Those still to be restored stay in the snapshot: the session's end restores them.
                forget.removeAll { plan.changes[$0] != nil }
            }
        }
        recovered.forgetSnapshot(of: forget)
        plan.session = recovered
        recovery.plan = plan
        session = recovered
        generation &+= 1
        if plan.ownerDropped || !forget.isEmpty || tookOwed {
            do {
                try record(recovered)
            } catch {
                recovery.journalProblem = error.message
            }
        }
        return recovery
    }
}

/// How a restarted service takes up the journal's session: a pure function
/// of the journal, the key map and the keys' values now.
///
/// The journal is written before the settings, and keys a call gives back
/// leave its snapshot only at a later write. So a resumed session may be one
/// call ahead of the keys, or still list keys it gave back. The plan puts
/// the keys in line with it:
/// - a key its features require gets their value;
/// - a listed key they do not require is put back to its snapshot value only
///   while it still has a value the session would have written (the restore
///   never happened); otherwise it was given back already — perhaps changed
///   by the user since — and is left alone. Either way it leaves the
///   snapshot, so the session's end does not touch it; only a key whose
///   restore fails stays, for the end to restore.
/// A session past its time limit (`expired`), or whose end was under way
/// (`unfinishedEnd`), is about to end: nothing is written, the end restores
/// what the snapshot keeps. A key that could not
/// be read (absent from `currentValues`) is left as the journal has it.
public struct RecoveryPlan: Equatable {
    /// The session to take up, its owner dropped if gone; nil for none.
    public var session: Session?
    /// Writes that put keys in line with the session.
    public var changes: [SettingKey: SettingValue?]
    /// Keys that leave the snapshot (those in `changes` only once written).
    public var givenBack: [SettingKey]
    /// Its time limit passed while the service was down: it is to end now.
    public var expired: Bool
    /// Its end was under way when the service stopped: it is to end now.
    public var unfinishedEnd: Bool
    /// The session is to end now, not to be resumed.
    public var endsNow: Bool { expired || unfinishedEnd }
    /// The journal named an owner that is no longer on the bus.
    public var ownerDropped: Bool

    public init(
        state: JournalState?, keyMap: FeatureKeyMap, currentValues: [SettingKey: SettingValue?],
        ownerConnected: Bool, nowUsec: UInt64
    ) {
        changes = [:]
        givenBack = []
        ownerDropped = false
        guard var session = state?.session else {
            self.session = nil
            expired = false
            unfinishedEnd = false
            return
        }
        expired = session.isExpired(nowUsec: nowUsec)
        unfinishedEnd = session.isEnding
        let endsNow = expired || unfinishedEnd
        if session.owner != nil, !ownerConnected {
            session.owner = nil
            ownerDropped = true
        }
        let wanted = keyMap.keyValues(for: session.features, options: session.keyMapOptions)
        for (key, stored) in session.snapshot.sorted(by: { $0.key < $1.key }) {
            guard let current = currentValues[key] else { continue }
            if let value = wanted[key] {
                if !endsNow && current != value { changes[key] = .some(value) }
                continue
            }
            let sessionValues = Feature.allCases.filter { !session.features.contains($0) }.compactMap {
                keyMap.keyValues(for: session.features.union([$0]), options: session.keyMapOptions)[key]
            }
            if let current, sessionValues.contains(current), current != stored.settingValue {
                // The restore never happened.
                guard !endsNow else { continue }
                changes[key] = .some(stored.settingValue)
            }
            givenBack.append(key)
        }
        self.session = session
    }
}

/// Turns for `SessionStore.exclusively`, first come first served: a call
/// that finds them taken waits, and the turn passes to it directly.
private final class Turns {
    private(set) var isTaken = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    func take(isolation: isolated (any Actor)? = #isolation) async {
        guard isTaken else {
            isTaken = true
            return
        }
        await withCheckedContinuation { continuation in
            // The body may run after other jobs: the turns may be free by now.
            if isTaken {
                waiting.append(continuation)
            } else {
                isTaken = true
                continuation.resume()
            }
        }
    }

    func give() {
        if waiting.isEmpty {
            isTaken = false
        } else {
            waiting.removeFirst().resume()  // still taken: by the one resumed
        }
    }
}
