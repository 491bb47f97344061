/// (1.2) The session agent as the system service sees it: who may register
/// as the agent, and which one has. The agent's driver implements it (it
/// is also the driver that sends the agent the session); the service's
/// `RegisterAgent` and `Agent` go through it, and its audit records come
/// from what it reports.
package protocol AgentRegistry: AnyObject {
    /// The registered agent's user name; "" when none is.
    var agentUser: String { get }

    /// The registered agent as a caller; nil when none is.
    var agentCaller: BusCaller? { get }

    /// `RegisterAgent` by `caller`: admits it — it becomes the agent and is
    /// sent the current state — or throws `.notAuthorized` naming why not.
    nonisolated(nonsending) func register(_ caller: BusCaller) async throws(GuidedAccessError) -> AgentRegistration

    /// `handler` hears, on the service's executor, of what changes without
    /// a call: an agent that left the bus or is no longer admitted.
    func follow(_ handler: @escaping (AgentChange) -> Void)
}

/// What a registration did.
package struct AgentRegistration: Sendable {
    /// The agent's user name.
    package var user: String
    /// The agent it took the place of, if any.
    package var replaced: Replaced?

    package struct Replaced: Sendable {
        package var caller: BusCaller
        package var user: String
        /// The same user's agent (restarted): what it runs is taken over, it
        /// is not sent `Release()`. Another user's is.
        package var tookOver: Bool

        package init(caller: BusCaller, user: String, tookOver: Bool) {
            self.caller = caller
            self.user = user
            self.tookOver = tookOver
        }
    }

    package init(user: String, replaced: Replaced?) {
        self.user = user
        self.replaced = replaced
    }
}

/// A change of the agent no call made.
package enum AgentChange: Sendable {
    /// The agent left the bus, or its user is no longer admitted (`reason`).
    case lost(BusCaller, user: String, reason: String)
}
