import DBus
import GuidedAccessCore

/// RegisterRestrictions, UnregisterRestrictions, SetRestrictionState and
/// GetRestrictionState.
extension GuidedAccessService {
    func registerRestrictions(_ call: Requester, _ batch: [RestrictionRegistration]) async throws {
        var scratch = store.registry
        try scratch.register(batch)  // the whole batch is checked before anything else
        try await admitClient(call)
        var current = store.registry  // as it is after the wait
        try current.register(batch)
        // The same texts again (a client registering at each start): nothing
        // journaled, nothing to log.
        guard try store.commit(current) else { return }
        logger.info("registered restrictions \(batch.map { $0.identifier })")
    }

    func unregisterRestrictions(_ call: Requester, _ identifiers: [String]) async throws {
        var scratch = store.registry
        try scratch.unregister(identifiers)
        try await admitClient(call)
        var current = store.registry
        try current.unregister(identifiers)
        try store.commit(current)
        logger.info("unregistered restrictions \(identifiers)")
    }

    func setRestrictionState(_ call: MethodCall, _ identifier: String, _ state: RestrictionState) async throws {
        _ = try store.registry.state(of: identifier)
        let caller = try await identify(call)
        let generation = store.generation
        try await admit(settings.policy.verdict(for: caller.identity, action: .manageRestrictions), caller, .bus(call))

        guard session != nil else {
            throw GuidedAccessError.notInSession("restriction states can change only inside a session")
        }
        // Asked for the session there was when the call came (an operator's
        // answer to polkit may take long), not one begun since.
        guard store.isCurrent(generation) else {
            throw GuidedAccessError.notInSession("the session ended while this call waited")
        }
        var updated = store.registry
        guard try updated.setState(state, of: identifier) else { return }
        try store.commit(updated)
        logger.info("restriction \(identifier) is now \(state) (by \(caller.uniqueName))")
        settings.audit.record(
            .restrictionChanged, caller: caller.identity, "restriction \(identifier) set to \(state)",
            fields: ["RESTRICTION": identifier, "STATE": state.rawValue])
        await emitRestrictionChanged(identifier, state)
    }

    /// Every registered restriction, sorted by identifier.
    var restrictions: [Restriction] { store.registry.restrictions }

    /// `allow` outside a session, whatever the registry says.
    func restrictionState(_ identifier: String) throws(GuidedAccessError) -> RestrictionState {
        let state = try store.registry.state(of: identifier)
        return session == nil ? .allow : state
    }
}
