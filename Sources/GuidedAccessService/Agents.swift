import DBus
import GuidedAccessCore
import GuidedAccessWire

/// (1.2) The session agent seen from the service's interface:
/// `RegisterAgent`, the `Agent` property and the audit records of agents
/// registered, refused and lost (spec 1.2, section 1). Who is admitted, and
/// what the agent is sent, is the registry's (the agent's driver).
extension GuidedAccessService {
    func followAgents() {
        guard let agents else { return }
        let loop = connection.loop
        agents.follow { [self] change in
            Task(executorPreference: loop) { await self.agentChanged(change) }
        }
    }

    /// `Agent`: the agent's user name, "" when none is registered (and in user mode).
    var agentUser: String { agents?.agentUser ?? "" }

    func registerAgent(_ call: MethodCall) async throws {
        guard let agents else {
            throw DBusError(
                name: "org.freedesktop.DBus.Error.NotSupported",
                message: "the service runs in user mode, where it is its own session agent; agents register with the system service (guidedaccessd --system)")
        }
        let caller = try await identify(call)
        do {
            let registration = try await agents.register(caller)
            var fields = ["AGENT_USER": registration.user, "AGENT": call.sender]
            var replaced = ""
            if let old = registration.replaced {
                fields["REPLACED_AGENT"] = old.caller.uniqueName
                fields["REPLACED_USER"] = old.user
                replaced = old.tookOver ? ", taking over from \(old.caller.uniqueName)" : ", replacing the agent of \(old.user)"
            }
            settings.audit.record(
                .agentRegistered, caller: caller.identity,
                "session agent of \(registration.user) registered (\(call.sender))\(replaced)", fields: fields)
        } catch {
            settings.audit.record(
                .agentRefused, caller: caller.identity, "RegisterAgent by \(call.sender) refused: \(error.message)",
                fields: ["AGENT": call.sender, "ERROR": error.dbusErrorName])
            throw error
        }
        await announce()
    }

    private func agentChanged(_ change: AgentChange) async {
        switch change {
        case .lost(let caller, let user, let reason):
            settings.audit.record(
                .agentLost, caller: caller.identity, "session agent of \(user) lost (\(caller.uniqueName)): \(reason)",
                fields: ["AGENT_USER": user, "AGENT": caller.uniqueName, "REASON": reason])
        }
        await announce()
    }
}
