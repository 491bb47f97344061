/// The session, the restrictions and what makes them survive a crash: the one
/// owner of every change to them.
///
/// A settings change is one transaction: the keys it writes are snapshotted,
/// the journal learns the new state, then the backend writes; keys given
/// back leave the snapshot once their restore is written, and the journal
/// catches up later (`journalBehind`, `refreshJournal`). So after a crash
/// the journal knows every key that may have been written and what to put
/// back — at worst a key is restored that was never changed.
///
/// Synchronous and bus-free: the service calls it from its one executor,
/// and tests drive it with the memory backend.
public final class SessionStore {
    public let journal: SessionJournal
    public let backend: any SettingsBackend
    public let keyMap: FeatureKeyMap

    /// The active session, if any.
    public private(set) var session: Session?
    public private(set) var registry = RestrictionRegistry()
    /// One more for every session begun or resumed: which session a call was
    /// admitted for (`isCurrent`).
    public private(set) var generation: UInt64 = 0
    /// The journal still lists keys a change gave back: written again by
    /// `refreshJournal`, off the calls' path. Any journal write clears it.
    public private(set) var journalBehind = false

    public init(journal: SessionJournal, backend: any SettingsBackend, keyMap: FeatureKeyMap) {
        self.journal = journal
        self.backend = backend
        self.keyMap = keyMap
    }

    /// Whether `generation` is the active session's.
    public func isCurrent(_ generation: UInt64) -> Bool {
        session != nil && self.generation == generation
    }

    // MARK: Sessions

    /// Starts `new` with its features' keys written, all or nothing.
    public func begin(_ new: Session) throws(GuidedAccessError) {
        precondition(session == nil, "a session is active")
        var started = new
        try write(keyMap.change(from: [], to: new.features, options: new.keyMapOptions), into: &started)
        session = started
        generation &+= 1
    }

    /// Turns the session's features into `features`, all or nothing. The
    /// programs of features turned off leave the session's record; returns
    /// those features (their programs are the caller's to stop).
    @discardableResult
    public func setFeatures(_ features: Set<Feature>) throws(GuidedAccessError) -> Set<Feature> {
        guard var new = session else { throw .notInSession("no session is active") }
        let before = new.features
        guard features != before else { return [] }
        new.features = features
        let turnedOff = before.subtracting(features)
        for feature in turnedOff { new.programs[feature] = nil }
        try write(keyMap.change(from: before, to: features, options: new.keyMapOptions), into: &new)
        session = new
        return turnedOff
    }

    /// A change of the session that writes no settings (owner, programs):
    /// journaled first, kept only if that succeeded.
    public func change(_ body: (inout Session) -> Void) throws(GuidedAccessError) {
        guard var new = session else { throw .notInSession("no session is active") }
        body(&new)
        guard new != session else { return }
        try record(new)
        session = new
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
        do {
            try record(new)
            return nil
        } catch {
            return error
        }
    }

    /// What ending a session did.
    public struct Ending {
        public var session: Session
        /// The restrictions that were denied and are allowed again, sorted.
        public var allowedAgain: [String]
        /// Why the end could not be journaled, if it could not (the journal
        /// was removed instead, or even that failed — see `message`).
        public var journalProblem: String?
    }

    /// Puts every written key back, allows every restriction again, forgets
    /// the session. On a backend failure nothing changes and the session
    /// stays, for a retry.
    public func end() throws(GuidedAccessError) -> Ending {
        guard let ending = session else { throw .notInSession("no session is active") }
        do {
            try backend.apply(try backend.check(ending.restoringChanges))
        } catch {
            throw .backendFailed("\(backend.name) backend: cannot restore the settings: \(error.message)")
        }
        let allowedAgain = registry.resetAll()
        session = nil
        var problem: String?
        do {
            try record(nil)
        } catch {
            // The settings are back, but a journal that still holds the
            // session would bring it back at the next start. Remove it (the
            // registered restrictions go with it: better than a session).
            do {
                try journal.discard()
                journalBehind = false
                problem = "cannot record the end of the session: \(error.message); removing the journal"
            } catch let discardError {
                problem = "cannot record the end of the session: \(error.message); removing the journal; cannot remove the journal either: \(discardError); the next start resumes the ended session"
            }
        }
        return Ending(session: ending, allowedAgain: allowedAgain, journalProblem: problem)
    }

    /// Undoes a session that never got going (its program could not be
    /// started): its keys go back and the journal holds no session. If the
    /// keys cannot be put back it stays, for EndSession to retry.
    public func abandon() throws(GuidedAccessError) {
        guard let started = session else { return }
        do {
            try backend.apply(try backend.check(started.restoringChanges))
        } catch {
            throw .backendFailed("\(backend.name) backend: cannot restore the settings: \(error.message)")
        }
        session = nil
        try record(nil)
    }

    // MARK: Restrictions

    /// Replaces the restrictions, journaled first.
    public func commit(_ updated: RestrictionRegistry) throws(GuidedAccessError) {
        do {
            try journal.record(JournalState(session: session, restrictions: updated.restrictions))
        } catch {
            throw .backendFailed("cannot record the restrictions: \(error)")
        }
        journalBehind = false
        registry = updated
    }

    // MARK: The journal

    /// Writes the journal again if it still lists keys given back.
    public func refreshJournal() throws(GuidedAccessError) {
        guard journalBehind, let session else { return }
        try record(session)
    }

    private func record(_ new: Session?) throws(GuidedAccessError) {
        do {
            try journal.record(JournalState(session: new, restrictions: registry.restrictions))
        } catch {
            throw .backendFailed("cannot record the session: \(error)")
        }
        journalBehind = false
    }

    /// The transaction: checks the change's values, records the snapshot of
    /// the keys it writes, journals, then writes — all or nothing. On
    /// success the keys it gave back leave `new`'s snapshot.
    private func write(_ change: KeyMapChange, into new: inout Session) throws(GuidedAccessError) {
        guard !change.isEmpty else {
            try record(new)
            return
        }
        let checked: CheckedChange
        do {
            checked = try backend.check(new.settingChanges(for: change))
        } catch {
            throw .unsupportedFeature(error.message)
        }
        do {
            try new.recordSnapshot(of: change.write.keys) { key throws(SettingsBackendError) in
                try backend.userValue(of: key)
            }
        } catch {
            throw .backendFailed("\(backend.name) backend: \(error.message)")
        }
        let previous = session
        do {
            try record(new)
        } catch {
            throw .backendFailed("cannot record the session before changing settings: \(error.message)")
        }
        do {
            try backend.apply(checked)
        } catch {
            // Nothing was changed (backends apply all or nothing): the journal
            // goes back, best effort — a leftover snapshot entry would only
            // make the session's end restore a key it never wrote.
            try? record(previous)
            throw .backendFailed("\(backend.name) backend: \(error.message)")
        }
        if !change.restore.isEmpty {
            new.forgetSnapshot(of: change.restore)
            journalBehind = true
        }
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
    }

    /// Takes up `state` (the journal as loaded; nil for none) after a start:
    /// the restrictions come back, and the session — its keys put in line
    /// with it (`RecoveryPlan`), its owner dropped unless `ownerConnected`
    /// says it is still on the bus. Without a session the backend lets go
    /// of what it still imposes.
    public func recover(
        _ state: JournalState?, ownerConnected: (String) -> Bool, nowUsec: UInt64
    ) -> Recovery {
        registry = RestrictionRegistry(restrictions: state?.restrictions ?? [])
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
            do {
                recovery.released = .success(try backend.startedWithoutSession())
            } catch {
                recovery.released = .failure(error)
            }
            return recovery
        }
        var forget = plan.givenBack
        if !plan.changes.isEmpty {
            do {
                try backend.apply(try backend.check(plan.changes))
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
        if plan.ownerDropped || !forget.isEmpty {
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
/// A session past its time limit (`expired`) is about to end: nothing is
/// written, the end restores what the snapshot keeps. A key that could not
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
            return
        }
        expired = session.isExpired(nowUsec: nowUsec)
        if session.owner != nil, !ownerConnected {
            session.owner = nil
            ownerDropped = true
        }
        let wanted = keyMap.keyValues(for: session.features, options: session.keyMapOptions)
        for (key, stored) in session.snapshot.sorted(by: { $0.key < $1.key }) {
            guard let current = currentValues[key] else { continue }
            if let value = wanted[key] {
                if !expired && current != value { changes[key] = .some(value) }
                continue
            }
            let sessionValues = Feature.allCases.filter { !session.features.contains($0) }.compactMap {
                keyMap.keyValues(for: session.features.union([$0]), options: session.keyMapOptions)[key]
            }
            if let current, sessionValues.contains(current), current != stored.settingValue {
                // The restore never happened.
                guard !expired else { continue }
                changes[key] = .some(stored.settingValue)
            }
            givenBack.append(key)
        }
        self.session = session
    }
}
