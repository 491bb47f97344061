/// The session, the restrictions and what makes them survive a crash: the
/// one owner of every change to them, and the session transaction across the
/// drivers (`FeatureDriver`).
///
/// A change is one transaction, in the drivers' order: each driver prepares
/// it (checks it, and records what a restart would need to undo it), the
/// journal learns the session as it is to be with every driver's record,
/// then each driver applies it. A driver that fails undoes the change: every
/// driver that took part, the failing one included, applies the session as
/// it was — all or nothing. The journal catches up later with records that
/// only shrank (`journalBehind`, `refreshJournal`); one that grew (a program
/// started) is journaled at once.
///
/// Bus-free: the service calls it from its one executor, and tests drive it
/// with the memory backend. A driver's work is awaited, so changes take
/// turns (`exclusively`) while reads go on; changes that apply nothing
/// (`change`, `note`, `commit`) need no turn and are journaled together
/// with a change that is out.
public final class SessionStore {
    public let journal: SessionJournal
    /// In the order the transaction runs them.
    package let drivers: [any FeatureDriver]

    /// The active session, if any: what is in effect.
    public private(set) var session: Session?
    public private(set) var registry = RestrictionRegistry()
    /// One more for every session begun or resumed: which session a call was
    /// admitted for (`isCurrent`).
    public private(set) var generation: UInt64 = 0
    /// The journal holds records bigger than the drivers' now (what was
    /// given back): written again by `refreshJournal`, off the calls' path.
    /// Any journal write clears it.
    public private(set) var journalBehind = false
    /// What the drivers deliver together now (`updateSupport`).
    package private(set) var support = FeatureSupport.nothing
    /// While a change is out: the session as the journal has it, one change
    /// ahead of `session` (beginning, changing features, ending).
    private var ahead: Session?
    private var journaled: [String: JSON] = [:]
    private let turns = Turns()
    /// Whether the journal keeps the session and the restrictions, or only
    /// the drivers' records (a session agent: the service keeps the session,
    /// and sends it again at every registration).
    private let journalsSessions: Bool

    /// `journalsSessions` false: the journal keeps only the drivers' records,
    /// and is written only when they change.
    package init(journal: SessionJournal, drivers: [any FeatureDriver], journalsSessions: Bool = true) {
        self.journal = journal
        self.drivers = drivers
        self.journalsSessions = journalsSessions
        updateSupport()
    }

    /// Whether `generation` is the active session's.
    public func isCurrent(_ generation: UInt64) -> Bool {
        session != nil && self.generation == generation
    }

    /// Runs `body` — a call's checks of the session and the change it makes
    /// — as the only one of its kind: checks made in it still hold when its
    /// change is done. Every change the drivers apply runs in one.
    public func exclusively<T>(
        isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> T
    ) async throws -> T {
        await turns.take()
        defer { turns.give() }
        return try await body()
    }

    // MARK: The drivers' events

    /// Starts every driver, in order, then computes what they deliver.
    /// `handler` gets each driver's events with its name, called as the
    /// driver calls it (on the host's executor): it hands them to the host.
    nonisolated(nonsending) package func startDrivers(_ handler: @escaping @Sendable (String, DriverEvent) -> Void) async {
        for driver in drivers {
            let name = driver.name
            await driver.start { event in handler(name, event) }
        }
        updateSupport()
    }

    /// A driver's `.changed`: what is supported is computed again, and the
    /// session's features are applied again — what a driver can do now
    /// starts, what it no longer can stops — in a turn, so that a session
    /// beginning meanwhile is applied with what its drivers can do then.
    /// Returns whether support changed (the host announces it) and the
    /// drivers' failures (for its log).
    package func driversChanged(
        isolation: isolated (any Actor)? = #isolation
    ) async -> (supportChanged: Bool, problems: [String]) {
        let changed = updateSupport()
        let problems = (try? await exclusively { await reapply() }) ?? []
        return (changed, problems)
    }

    // MARK: What is supported

    /// Computes `support` from the drivers now; whether it changed.
    @discardableResult
    package func updateSupport() -> Bool {
        let new = FeatureSupport(capabilities: drivers.map(\.capabilities), desktopParts: drivers.map(\.desktopPart))
        guard new != support else { return false }
        support = new
        return true
    }

    /// What driver `index` is to make real for `session` (nil: none).
    private func target(_ index: Int, for session: Session?) -> DriverTarget {
        guard var target = session?.target else { return .none }
        if index < support.coveredElsewhere.count {
            target.coveredElsewhere = support.coveredElsewhere[index].intersection(target.features)
        }
        return target
    }

    // MARK: Sessions

    /// Starts `new` with its features made real, all or nothing.
    nonisolated(nonsending) package func begin(_ new: Session) async throws(GuidedAccessError) {
        precondition(session == nil, "a session is active")
        let urgent = try await transact(to: new, journaling: new)
        session = new
        generation &+= 1
        caughtUp(urgent: urgent)
    }

    /// Turns the session's features into `features`, all or nothing.
    nonisolated(nonsending) package func setFeatures(_ features: Set<Feature>) async throws(GuidedAccessError) {
        guard var new = session else { throw .notInSession("no session is active") }
        guard features != new.features else { return }
        new.features = features
        let urgent = try await transact(to: new, journaling: new)
        // What happened meanwhile (an owner that left) is kept.
        session?.features = features
        caughtUp(urgent: urgent)
    }

    /// What ending a session did.
    public struct Ending: Sendable {
        public var session: Session
        /// The restrictions that were denied and are allowed again, sorted.
        public var allowedAgain: [String]
        /// What the drivers add to the log line and the audit record.
        package var summaries: [DriverSummary]
        /// Drivers that could not release everything (after the first had:
        /// the session is over all the same), for the log.
        public var problems: [String]
        /// Why the end could not be journaled after the drivers released
        /// it, if it could not (the journal still marks the session as
        /// ending: the next start finishes the end).
        public var journalProblem: String?
    }

    /// Releases what every driver made real for the session, allows every
    /// restriction again, forgets the session. The journal first marks the
    /// session as ending, so that a restart finishes the end instead of
    /// resuming it. An end that cannot be recorded, or that the first driver
    /// cannot release (the keys cannot be put back), changes nothing: the
    /// session stays, for a retry.
    nonisolated(nonsending) package func end() async throws(GuidedAccessError) -> Ending {
        precondition(turns.isTaken, "a change outside `exclusively`")
        guard var ending = session else { throw .notInSession("no session is active") }
        ending.isEnding = true
        ahead = ending
        do {
            try record(ending)
        } catch {
            ahead = nil
            throw .backendFailed("cannot record the end of the session: \(error.message)")
        }
        let problems: [String]
        do {
            problems = try await release()
        } catch {
            // The session goes on; best effort, for the next start too.
            ahead = nil
            try? record(session)
            throw error.apiError
        }
        ahead = nil
        let ended = session!
        let allowedAgain = registry.resetAll()
        session = nil
        var problem: String?
        do {
            try record(nil)
        } catch {
            problem = "the session's changes are undone, but the journal cannot record that the session ended: \(error.message); the next start finishes the end"
        }
        return Ending(
            session: ended, allowedAgain: allowedAgain, summaries: drivers.compactMap(\.endSummary), problems: problems,
            journalProblem: problem)
    }

    /// Whether a driver still holds something outside a session (a write
    /// of unknown outcome for a session that did not start): `settle` puts
    /// it back.
    public var hasLeftovers: Bool {
        session == nil && drivers.contains { $0.record != nil }
    }

    /// Puts back what the drivers still hold outside a session; true once
    /// nothing is left.
    nonisolated(nonsending) public func settle() async -> Bool {
        precondition(turns.isTaken, "a change outside `exclusively`")
        guard session == nil else { return true }
        guard hasLeftovers else { return true }
        _ = try? await release()
        try? record(nil)
        return !hasLeftovers
    }

    /// Applies the session again to every driver: what they can do changed
    /// (the desktop, a browser came). Returns the drivers' failures, for the
    /// log; nothing is undone.
    nonisolated(nonsending) package func reapply() async -> [String] {
        precondition(turns.isTaken, "a change outside `exclusively`")
        guard let current = session else { return [] }
        var problems: [String] = []
        var prepared: [Int] = []
        for (index, driver) in drivers.enumerated() {
            do {
                try driver.prepare(target(index, for: current))
                prepared.append(index)
            } catch {
                problems.append(error.message)
            }
        }
        // What a driver is about to do that a restart must know: first.
        if currentRecords() != journaled, let problem = recordNow() {
            for index in prepared.reversed() { drivers[index].cancel() }
            return problems + ["cannot record the session before applying it again: \(problem.message)"]
        }
        for index in prepared {
            do {
                _ = try await drivers[index].apply(target(index, for: current))
            } catch {
                problems.append(error.message)
            }
        }
        // Rare: journaled at once, whatever changed (a program started, or
        // one that failed half-way).
        if currentRecords() != journaled, let problem = recordNow() { problems.append(problem.message) }
        return problems
    }

    /// A change of the session that applies nothing (owner): journaled
    /// first, kept only if that succeeded.
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
    /// (its owner left the bus): kept, and journaled as well as can be.
    /// Returns the journal's error, for the log.
    @discardableResult
    public func note(_ body: (inout Session) -> Void) -> GuidedAccessError? {
        guard var new = session else { return nil }
        body(&new)
        guard new != session else { return nil }
        session = new
        if ahead != nil { body(&ahead!) }
        return recordNow()
    }

    /// A driver's record changed outside a change (a program started
    /// again): journaled now. Returns the journal's error, for the log.
    @discardableResult
    package func noteRecords() -> GuidedAccessError? {
        guard drivers.contains(where: { $0.record != journaled[$0.name] }) else { return nil }
        return recordNow()
    }

    private func recordNow() -> GuidedAccessError? {
        do {
            try record(ahead ?? session)
            return nil
        } catch {
            return error
        }
    }

    // MARK: Restrictions

    /// Replaces the restrictions, journaled first. Returns false, having
    /// written nothing, when nothing changed.
    @discardableResult
    public func commit(_ updated: RestrictionRegistry) throws(GuidedAccessError) -> Bool {
        guard updated != registry else { return false }
        let records = currentRecords()
        do {
            try journal.record(JournalState(session: ahead ?? session, restrictions: updated.restrictions, drivers: records))
        } catch {
            throw .backendFailed("cannot record the restrictions: \(error)")
        }
        journaled = records
        journalBehind = false
        registry = updated
        return true
    }

    // MARK: The journal

    /// Writes the journal again if it still holds what was given back.
    public func refreshJournal() throws(GuidedAccessError) {
        guard journalBehind, ahead == nil else { return }
        try record(session)
    }

    private func currentRecords() -> [String: JSON] {
        var records: [String: JSON] = [:]
        for driver in drivers {
            if let record = driver.record { records[driver.name] = record }
        }
        return records
    }

    private func record(_ new: Session?) throws(GuidedAccessError) {
        let records = currentRecords()
        if !journalsSessions, records == journaled {
            journalBehind = false
            return
        }
        let state =
            journalsSessions
            ? JournalState(session: new, restrictions: registry.restrictions, drivers: records)
            : JournalState(session: nil, restrictions: [], drivers: records)
        do {
            try journal.record(state)
        } catch {
            throw .backendFailed("cannot record the session: \(error)")
        }
        journaled = records
        journalBehind = false
    }

    /// After drivers applied: a record that grew is journaled now; one that
    /// only shrank is left for `refreshJournal`.
    private func caughtUp(urgent: Bool) {
        if urgent, ahead == nil, recordNow() == nil { return }
        if currentRecords() != journaled { journalBehind = true }
    }

    /// The transaction to `target` (nil: no session), journaling `journaled`
    /// (the session as the journal must have it meanwhile), all or nothing.
    /// Returns whether a driver's record grew while applying: the caller,
    /// once it has made `target` the session, journals it (`caughtUp`).
    nonisolated(nonsending) private func transact(
        to target: Session?, journaling journaled: Session?
    ) async throws(GuidedAccessError) -> Bool {
        precondition(turns.isTaken, "a change outside `exclusively`")
        let previous = session
        let targets = drivers.indices.map { self.target($0, for: target) }
        for (index, driver) in drivers.enumerated() {
            do {
                try driver.prepare(targets[index])
            } catch {
                for prepared in drivers[..<index].reversed() { prepared.cancel() }
                throw error.apiError
            }
        }
        do {
            try record(journaled)
        } catch {
            for driver in drivers.reversed() { driver.cancel() }
            throw .backendFailed("cannot record the session before changing it: \(error.message)")
        }
        ahead = journaled
        defer { ahead = nil }
        var urgent = false
        for (index, driver) in drivers.enumerated() {
            do {
                urgent = try await driver.apply(targets[index]) || urgent
            } catch {
                for unapplied in drivers[(index + 1)...] { unapplied.cancel() }
                // Undone by every driver that took part, last first; one
                // whose outcome is unknown keeps in its record what it may
                // have done, for its next change or the end.
                var problems: [String] = []
                for undone in (0...index).reversed() where undone != index || error.kind != .outcomeUnknown {
                    let before = self.target(undone, for: previous)
                    do {
                        try drivers[undone].prepare(before)
                        _ = try await drivers[undone].apply(before)
                    } catch {
                        drivers[undone].cancel()
                        problems.append(error.message)
                    }
                }
                ahead = nil
                // The session as it is now: what happened meanwhile (an
                // owner that left) stays.
                do {
                    try record(session)
                } catch {
                    problems.append("the journal cannot record that the change was undone: \(error.message)")
                }
                guard !problems.isEmpty else { throw error.apiError }
                throw DriverFailure(error.kind, error.message + "; undoing it: " + problems.joined(separator: "; ")).apiError
            }
        }
        return urgent
    }

    /// Every driver releases what it made real, in order. The first
    /// failure of the first driver to fail stops the release when nothing
    /// was released yet (thrown); later failures are returned.
    nonisolated(nonsending) private func release() async throws(DriverFailure) -> [String] {
        var problems: [String] = []
        for (index, driver) in drivers.enumerated() {
            do {
                try driver.prepare(.none)
                _ = try await driver.apply(.none)
            } catch {
                driver.cancel()
                if index == 0 { throw error }
                problems.append(error.message)
            }
        }
        return problems
    }

    // MARK: Recovery

    /// What `recover` found and did, for the log.
    public struct Recovery {
        /// The session taken up (its owner dropped if gone), if any.
        public var session: Session?
        /// Its time limit passed while the service was down: it is to end now.
        public var expired = false
        /// Its end was under way when the service stopped: it is to end now.
        public var unfinishedEnd = false
        /// The session is to end now, not to be resumed.
        public var endsNow: Bool { expired || unfinishedEnd }
        /// The journal named an owner that is no longer on the bus.
        public var ownerDropped = false
        /// What the drivers did and found.
        package var notes: [DriverNote] = []
        /// The journal could not be brought up to date.
        public var journalProblem: String?
    }

    /// Takes up `state` (the journal as loaded; nil for none) after a start:
    /// the restrictions come back, and the session — its owner dropped unless
    /// `ownerConnected` says it is still on the bus — with each driver
    /// taking up its record (`FeatureDriver.recover`). Without a session the
    /// drivers put back what they still hold.
    nonisolated(nonsending) public func recover(
        _ state: JournalState?, ownerConnected: (String) -> Bool, nowUsec: UInt64
    ) async -> Recovery {
        precondition(turns.isTaken, "a change outside `exclusively`")
        registry = RestrictionRegistry(restrictions: state?.restrictions ?? [])
        let records = state?.drivers ?? [:]
        var recovery = Recovery()
        var recovered = state?.session
        if let session = recovered {
            recovery.expired = session.isExpired(nowUsec: nowUsec)
            recovery.unfinishedEnd = session.isEnding
            if let owner = session.owner, !ownerConnected(owner) {
                recovered?.owner = nil
                recovery.ownerDropped = true
            }
        }
        session = recovered
        for (index, driver) in drivers.enumerated() {
            let target = recovered.map { _ in self.target(index, for: recovered) }
            recovery.notes += await driver.recover(records[driver.name], target: target, endsNow: recovery.endsNow)
        }
        for name in records.keys.sorted() where !drivers.contains(where: { $0.name == name }) {
            recovery.notes.append(DriverNote(
                .error, "the journal holds a record of '\(name)', which this configuration does not run: what it recorded is not undone, and the record is dropped"))
        }
        journaled = records
        if recovered != nil { generation &+= 1 }
        recovery.session = recovered
        if recovery.ownerDropped || currentRecords() != records {
            do {
                try record(recovered)
            } catch {
                recovery.journalProblem = error.message
            }
        }
        return recovery
    }
}

/// Turns, first come first served (`SessionStore.exclusively`, the calls
/// to a session agent): a task that finds them taken waits, and the turn
/// passes to it directly. Used on one executor.
package final class Turns {
    package private(set) var isTaken = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    package init() {}

    package func take(isolation: isolated (any Actor)? = #isolation) async {
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

    package func give() {
        if waiting.isEmpty {
            isTaken = false
        } else {
            waiting.removeFirst().resume()  // still taken: by the one resumed
        }
    }
}
