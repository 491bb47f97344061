import DBus
import GuidedAccessCore
import GuidedAccessWire

/// StartSession, ConfigureForSession and EndSession; the owner's connection
/// and the time limit.
extension GuidedAccessService {
    // MARK: Handlers

    func startSession(_ call: Requester, _ raw: [String: Variant]) async throws {
        try await startSession(call, try Self.sessionParameters(raw, defaults: settings.defaults), hasOptions: !raw.isEmpty)
    }

    func startSession(_ call: Requester, _ parameters: SessionParameters, hasOptions: Bool) async throws {
        await lookAgain(for: parameters.features)
        try store.support.require(parameters.features)
        let method = SessionMethod.startSession(hasOptions: hasOptions)

        let caller = try await identify(call)
        try await admit(settings.policy.admission(for: method, session: session, caller: caller), caller, call)

        let decision = try await store.exclusively { () async throws -> SessionDecision in
            let decision = try Session.decide(method, session: session, caller: caller)
            switch decision {
            case .takeOver:
                try takeOver(by: caller)
            case .start:
                do {
                    try await store.begin(Session(owner: caller, options: parameters, nowUsec: Self.nowUsec()))
                    // Keys a session that did not start left were put back.
                    journalSoonIfBehind()
                } catch {
                    // A change of unknown outcome, or one that could not be
                    // undone at once: put back as soon as the drivers can.
                    if store.hasLeftovers { settleSoon() }
                    throw error
                }
            case .asOwner, .needsOperator:
                throw GuidedAccessError.sessionBusy("a session is active; \(Session.wayOut)")
            }
            return decision
        }
        let generation = store.generation
        if decision == .takeOver {
            await tookOver(by: caller)
            guard store.isCurrent(generation) else { return }  // ended meanwhile: its end was announced
            await emitSessionChanged(active: true, .resumed)
            return
        }
        let new = session!
        logger.notice(
            "session started by \(caller.uniqueName) (\(caller.identity.ownerIdentity)), features \(new.features.sortedWireNames)")
        settings.audit.record(
            .sessionStarted, caller: caller.identity, "guided access session started by \(caller.identity.ownerIdentity)",
            fields: [
                "OWNER": caller.uniqueName, "FEATURES": new.features.sortedWireNames.joined(separator: " "),
                "DEADLINE_USEC": String(new.deadlineUsec),
            ])
        scheduleDeadline()
        // Announced before the first wait for the bus; after each wait,
        // nothing more if the session ended meanwhile (an EndSession
        // queued behind this one): no "started" after "ended", no sleep
        // inhibitor for a session that is gone.
        await announce()
        await emitSessionChanged(active: true, .started)
        await watchOwner(caller.uniqueName)
        guard store.isCurrent(generation) else { return }
        if new.inhibitSleep { await inhibitor.acquire() }
    }

    func configureForSession(_ call: Requester, _ names: [String], _ enabled: Bool) async throws {
        let requested = try Self.requestedFeatures(names)
        if enabled {
            await lookAgain(for: requested)
            try store.support.require(requested)
        }

        let caller = try await identify(call)
        let generation = store.generation
        try await admit(settings.policy.admission(for: .configureForSession, session: session, caller: caller), caller, call)

        var takenOver = false
        let (decision, before, features): (SessionDecision, Set<Feature>, Set<Feature>)
        do {
            (decision, before, features) = try await store.exclusively {
                () async throws -> (SessionDecision, Set<Feature>, Set<Feature>) in
                try requireSameSession(generation, orNone: true)
                let decision = try Session.decide(.configureForSession, session: session, caller: caller)
                if decision == .takeOver {
                    try takeOver(by: caller)
                    takenOver = true
                }
                let before = session!.features
                let features = enabled ? before.union(requested) : before.subtracting(requested)
                if features != before {
                    try await store.setFeatures(features)
                    journalSoonIfBehind()
                } else if enabled, let problem = await store.reapply().first {
                    // On already — but what delivers it may have given up (a
                    // program that kept exiting): turning it on again
                    // starts it again.
                    throw GuidedAccessError.backendFailed(problem)
                }
                return (decision, before, features)
            }
        } catch {
            // The new owner is followed and announced all the same.
            if takenOver { await tookOver(by: caller) }
            throw error
        }
        if decision == .takeOver { await tookOver(by: caller) }
        guard features != before else { return }
        // The audit record is the log line: it is in the service's journal.
        let changed = requested.sortedWireNames, now = features.sortedWireNames
        settings.audit.record(
            .featuresChanged, caller: caller.identity,
            "features \(changed.joined(separator: ", ")) turned \(enabled ? "on" : "off")",
            fields: [
                "CHANGED": changed.joined(separator: " "), "ENABLED": enabled ? "true" : "false",
                "FEATURES": now.joined(separator: " "),
            ])
        await announce()
    }

    func endSessionCall(_ call: Requester) async throws {
        let caller = try await identify(call)
        let generation = store.generation
        let admission = settings.policy.admission(for: .endSession, session: session, caller: caller)
        try await admit(admission, caller, call)
        // Ending someone else's session takes an operator. Asked in the same
        // wait as the admission, for the session there is now; polkit
        // already granted end-session if the admission asked it.
        let operatorAsked: Bool
        if admission == .admitted, !settings.policy.isOperator(caller.identity),
            (try? Session.decide(.endSession, session: session, caller: caller)) == .needsOperator
        {
            try await authorize(.endSession, caller, call)
            operatorAsked = true
        } else {
            operatorAsked = admission != .admitted
        }

        var takenOver = false
        let (ending, reason): (SessionStore.Ending, SessionChangeReason)
        do {
            (ending, reason) = try await store.exclusively {
                () async throws -> (SessionStore.Ending, SessionChangeReason) in
                try requireSameSession(generation, orNone: true)
                var reason = SessionChangeReason.ended
                switch try Session.decide(.endSession, session: session, caller: caller) {
                case .needsOperator:
                    // The session changed hands while this call waited, and the
                    // caller was not asked about as an operator for that.
                    guard operatorAsked || settings.policy.isOperator(caller.identity) else {
                        throw GuidedAccessError.notAuthorized(
                            "\(caller.uniqueName) (\(caller.identity.ownerIdentity)) does not own the session of \(session!.ownerIdentity)")
                    }
                    reason = .endedByOperator
                case .takeOver:
                    try takeOver(by: caller)
                    takenOver = true
                case .asOwner, .start:
                    break
                }
                return (try await store.end(), reason)
            }
        } catch {
            if takenOver { await tookOver(by: caller) }
            throw error
        }
        await ended(ending, reason: reason, by: caller)
    }

    /// A call is admitted for the session there is once its caller is known,
    /// then may wait (polkit) while other calls run: that session may have
    /// ended meanwhile, and another — perhaps of another owner — begun. It
    /// must not act on that one.
    ///
    /// `orNone`: also passes when there is no session at all (the call's own
    /// checks then report NotInSession as the spec orders the errors).
    private func requireSameSession(_ generation: UInt64, orNone: Bool = false) throws(GuidedAccessError) {
        if orNone, session == nil { return }
        guard store.isCurrent(generation) else {
            throw .notInSession("the session ended while this call waited")
        }
    }

    /// Undoes what the drivers made real, allows every restriction again,
    /// forgets the session. When the settings cannot be put back the session
    /// stays, nothing is lost.
    func endSession(reason: SessionChangeReason) async throws {
        let ending = try await store.exclusively { try await store.end() }
        await ended(ending, reason: reason)
    }

    /// What follows the store's end of the session: its timers and
    /// inhibitor go, and the end is announced.
    func ended(_ ending: SessionStore.Ending, reason: SessionChangeReason, by endedBy: BusCaller? = nil) async {
        deadlineTask?.cancel()
        deadlineTask = nil
        journalRefresh?.cancel()
        journalRefresh = nil
        journalRefreshDue = nil
        let watch = ownerWatch
        ownerWatch = nil
        inhibitor.release()
        for problem in ending.problems { logger.error("ending the session: \(problem)") }
        if let problem = ending.journalProblem { logger.critical("\(problem)") }
        let summary = ending.summaries.map(\.text)
        logger.notice("session ended (\(reason))\(summary.isEmpty ? "" : "; " + summary.joined(separator: "; "))")
        var fields = ["REASON": reason.rawValue]
        for driver in ending.summaries { fields.merge(driver.fields) { kept, _ in kept } }
        settings.audit.record(.sessionEnded, caller: endedBy?.identity, "guided access session ended (\(reason))", fields: fields)
        // The signals go out before the one wait for the bus below, so none
        // can follow what calls queued behind this one announce.
        for identifier in ending.allowedAgain { await emitRestrictionChanged(identifier, .allow) }
        await announce()
        await emitSessionChanged(active: false, reason)
        if let watch { await connection.unsubscribe(watch) }
    }

    // MARK: The journal after a driver gave something back

    /// What a driver gives back (keys restored) leaves its record only after
    /// that was done, so the journal written before it still lists it; a
    /// restart would then have to guess whether it is still owed
    /// (`SettingsRecoveryPlan`).
    /// The journal is written again once calls have paused for
    /// `journalRefreshDelay` — off every call's path, and once for a burst
    /// of calls. Any journal write in between makes it unnecessary.
    func journalSoonIfBehind() {
        guard store.journalBehind else { return }
        journalRefreshDue = ContinuousClock.now + Self.journalRefreshDelay
        // One waiting task for a burst of calls: each call moves the time
        // it is due, and it waits again until then.
        guard journalRefresh == nil else { return }
        journalRefresh = Task(executorPreference: connection.loop) { [self] in await refreshJournalWhenDue() }
    }

    private func refreshJournalWhenDue() async {
        while let due = journalRefreshDue, due > ContinuousClock.now {
            do {
                try await connection.loop.sleep(for: due - ContinuousClock.now)
            } catch {
                return  // cancelled: the session ended
            }
        }
        refreshJournal()
    }

    static let journalRefreshDelay: Duration = .milliseconds(250)

    private func refreshJournal() {
        journalRefresh = nil
        journalRefreshDue = nil
        do {
            try store.refreshJournal()
        } catch {
            logger.error("cannot bring the journal up to date after a feature was turned off: \(error)")
        }
    }

    /// Puts back what a session that did not start may have changed,
    /// retried with back-off until the drivers manage or a session takes it
    /// over.
    func settleSoon() {
        guard settleTask == nil else { return }
        settleTask = Task(executorPreference: connection.loop) { [self] in await settle() }
    }

    private func settle() async {
        var backoff: Duration = .seconds(1)
        while !Task.isCancelled {
            try? await connection.loop.sleep(for: backoff)
            if (try? await store.exclusively({ await store.settle() })) == true {
                logger.notice("what a session that did not start may have changed is put back")
                break
            }
            backoff = min(backoff * 2, .seconds(60))
            logger.error("cannot put back yet what a session that did not start may have changed; retrying in \(backoff)")
        }
        settleTask = nil
    }

    // MARK: Owner tracking

    /// The caller becomes the owner of the session whose owner is gone.
    private func takeOver(by caller: BusCaller) throws(GuidedAccessError) {
        try store.change { $0.takeOver(by: caller) }
        logger.notice("session taken over by \(caller.uniqueName) (\(caller.identity.ownerIdentity))")
        settings.audit.record(
            .sessionResumed, caller: caller.identity, "guided access session resumed by \(caller.identity.ownerIdentity)",
            fields: ["OWNER": caller.uniqueName])
    }

    /// After a take-over: the new owner is followed and `SessionOwner` announced.
    private func tookOver(by caller: BusCaller) async {
        await announce()
        await watchOwner(caller.uniqueName)
    }

    /// Follows the owner's connection through NameOwnerChanged; a signal,
    /// not polling.
    func watchOwner(_ owner: String) async {
        if let old = ownerWatch {
            ownerWatch = nil
            await connection.unsubscribe(old)
        }
        do {
            let watch = try await connection.subscribe(.nameOwnerChanged(for: owner)) { [self] message in
                guard case .string(let newOwner)? = try? message.arguments().last, newOwner.isEmpty else { return }
                Task(executorPreference: connection.loop) { await self.ownerLeft(owner) }
            }
            // Other calls ran while this waited: the session may have ended,
            // changed hands, or had its owner watched by a later call.
            guard session?.owner == owner, ownerWatch == nil else {
                await connection.unsubscribe(watch)
                return
            }
            ownerWatch = watch
            // It may have left before the match was in place.
            if (try? await connection.nameOwner(owner)) != owner { await ownerLeft(owner) }
        } catch {
            logger.error("cannot watch the session owner \(owner): \(error)")
        }
    }

    private func ownerLeft(_ owner: String) async {
        guard session?.owner == owner else { return }
        if let problem = store.note({ $0.connectionLeft(owner) }) { logger.error("\(problem)") }
        logger.notice("the session owner \(owner) left the bus; the session stays for its successor")
        let watch = ownerWatch
        ownerWatch = nil
        // Announced before the wait for the bus: a Get meanwhile sees what was announced.
        await announce()
        if let watch { await connection.unsubscribe(watch) }
    }

    // MARK: Time limit

    /// One timer for the deadline — nothing wakes the service otherwise.
    func scheduleDeadline() {
        deadlineTask?.cancel()
        deadlineTask = nil
        guard let deadline = session?.deadlineUsec, deadline != 0 else { return }
        scheduleEnd(of: store.generation, atUsec: deadline, reason: .timeLimit)
    }

    /// Ends the session `generation` at `deadline` (microseconds since the
    /// epoch; 0: now), retried with back-off while it fails.
    func scheduleEnd(of generation: UInt64, atUsec deadline: UInt64 = 0, reason: SessionChangeReason) {
        deadlineTask?.cancel()
        deadlineTask = Task(executorPreference: connection.loop) { [self] in
            var backoff: Duration = .seconds(1)
            let now = Self.nowUsec()
            if deadline > now {
                do {
                    try await connection.loop.sleep(for: .microseconds(deadline - now))
                } catch {
                    return
                }
            }
            while !Task.isCancelled {
                do {
                    try await end(generation, reason: reason)
                    return
                } catch {
                    logger.error("ending the session (\(reason)) failed: \(error); retrying in \(backoff)")
                    try? await connection.loop.sleep(for: backoff)
                    backoff = min(backoff * 2, .seconds(60))
                }
            }
        }
    }

    private func end(_ generation: UInt64, reason: SessionChangeReason) async throws {
        let ending = try await store.exclusively { () async throws -> SessionStore.Ending? in
            guard store.isCurrent(generation) else { return nil }
            return try await store.end()
        }
        if let ending { await ended(ending, reason: reason) }
    }

    // MARK: The checks before the caller is identified (also the fuzz target's)

    /// StartSession's options as `SessionParameters` checks them.
    public static func sessionParameters(
        _ raw: [String: Variant], defaults: SessionDefaults
    ) throws(GuidedAccessError) -> SessionParameters {
        try SessionParameters(parsing: raw.mapValues(optionValue), defaults: defaults)
    }

    /// ConfigureForSession's features: not none, each known, none twice.
    public static func requestedFeatures(_ names: [String]) throws(GuidedAccessError) -> Set<Feature> {
        guard !names.isEmpty else { throw .invalidArgs("the list of features is empty") }
        return try Feature.parse(names)
    }

    private static func optionValue(_ variant: Variant) -> OptionValue {
        switch variant.value {
        case .uint64(let v): return .uint64(v)
        case .double(let v): return .double(v)
        case .bool(let v): return .bool(v)
        case .array(.string, let items):
            return .stringArray(items.compactMap { if case .string(let s) = $0 { s } else { nil } })
        default: return .other(signature: variant.value.type.signature)
        }
    }
}
