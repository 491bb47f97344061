/// The polkit actions the service asks about.
public enum PolkitAction: String, Hashable, Sendable, CaseIterable {
    /// Becoming a client: starting sessions, registering restrictions.
    case startSession = "org.guidedaccess.GuidedAccess1.start-session"
    /// Ending someone else's session as an operator.
    case endSession = "org.guidedaccess.GuidedAccess1.end-session"
    /// Setting restriction states as an operator.
    case manageRestrictions = "org.guidedaccess.GuidedAccess1.manage-restrictions"

    public var id: String { rawValue }

    /// Clients are decided by `[Clients]`; the two operator actions by `[Operators]`.
    public var isOperatorAction: Bool { self != .startSession }

    /// The way in for a caller refused this action, for the error's
    /// message: the keys of guidedaccess.conf that would admit it (its
    /// user, its program), and in system mode a polkit rule. `userName`:
    /// the caller's user's name, where it has one.
    public func wayIn(for identity: CallerIdentity, userName: String?, polkit: Bool) -> String {
        let group = isOperatorAction ? "Operators" : "Clients"
        var ways = ["[\(group)] AllowUsers=\(userName ?? String(identity.uid))"]
        if !isOperatorAction, let path = identity.executablePath { ways.append("AllowExecutables=\(path)") }
        var text = "to admit uid \(identity.uid)"
        if let path = identity.executablePath { text += " running \(path)" }
        text += ", add " + ways.joined(separator: " or ") + " to guidedaccess.conf (see guidedaccess.conf(5))"
        if polkit { text += ", or allow \(rawValue) in a polkit rule" }
        return text
    }
}

/// What the lists say about a caller for an action.
public enum AccessVerdict: Hashable, Sendable {
    case admitted
    /// The lists do not admit the caller; polkit decides (done elsewhere).
    case askPolkit(action: String)
}

/// The `[Clients]` and `[Operators]` lists with users and groups resolved to
/// ids, plus the mode's built-in rules.
public struct AccessPolicy: Hashable, Sendable {
    public let mode: ServiceMode
    /// The uid the service runs as; in user mode, the bus's own user.
    public let serviceUID: UInt32

    private let clientsConfigured: Bool
    private let clientUIDs: Set<UInt32>
    private let clientGIDs: Set<UInt32>
    private let clientExecutables: Set<String>
    private let clientUnits: Set<String>
    private let operatorsConfigured: Bool
    private let operatorUIDs: Set<UInt32>
    private let operatorGIDs: Set<UInt32>
    /// (1.2) `[Agent] AllowUsers=` resolved; nil: not configured (logind's
    /// seat0 user is admitted). Never holds root.
    public let agentUIDs: Set<UInt32>?

    /// Resolves names now, so a misspelt user or group is a start-up error
    /// rather than a silent denial. Numeric entries are taken as ids.
    public init(
        configuration: ServiceConfiguration, mode: ServiceMode, serviceUID: UInt32, file: String,
        userID: (String) -> UInt32?, groupID: (String) -> UInt32?
    ) throws(ConfigurationError) {
        func resolve(_ names: [String], group: String, key: String, kind: String, _ lookup: (String) -> UInt32?)
            throws(ConfigurationError) -> Set<UInt32>
        {
            var ids: Set<UInt32> = []
            for name in names {
                guard let id = UInt32(name) ?? lookup(name) else {
                    throw ConfigurationError(
                        file: file, group: group, key: key, value: names.joined(separator: ";"),
                        reason: "no \(kind) '\(name)' on this system")
                }
                ids.insert(id)
            }
            return ids
        }
        self.mode = mode
        self.serviceUID = serviceUID
        let clients = configuration.clients
        clientsConfigured = clients != nil
        clientUIDs = try resolve(clients?.allowUsers ?? [], group: "Clients", key: "AllowUsers", kind: "user", userID)
        clientGIDs = try resolve(clients?.allowGroups ?? [], group: "Clients", key: "AllowGroups", kind: "group", groupID)
        clientExecutables = Set(clients?.allowExecutables ?? [])
        clientUnits = Set(clients?.allowUnits ?? [])
        let operators = configuration.operators
        operatorsConfigured = operators != nil
        operatorUIDs = try resolve(operators?.allowUsers ?? [], group: "Operators", key: "AllowUsers", kind: "user", userID)
        operatorGIDs = try resolve(operators?.allowGroups ?? [], group: "Operators", key: "AllowGroups", kind: "group", groupID)
        if let agents = configuration.agentAllowUsers {
            let uids = try resolve(agents, group: "Agent", key: "AllowUsers", kind: "user", userID)
            if uids.contains(0) {
                throw ConfigurationError(
                    file: file, group: "Agent", key: "AllowUsers", value: agents.joined(separator: ";"),
                    reason: "root is never the session agent: name the kiosk user")
            }
            agentUIDs = uids
        } else {
            agentUIDs = nil
        }
    }

    /// Whether the lists (and the mode's rules) make the caller a client. An
    /// executable is compared as a file with what each listed path names in
    /// the service's namespace now, not by the path the caller shows.
    /// (1.2) A page of the kiosk browser is a client: the driver lets
    /// through only pages of `[Browser] AllowOrigins=`, the administrator's grant.
    public func isClient(_ caller: CallerIdentity) -> Bool {
        if caller.origin != nil { return true }
        if isBuiltIn(caller, groupConfigured: clientsConfigured) { return true }
        return clientUIDs.contains(caller.uid)
            || !clientGIDs.isDisjoint(with: caller.gids)
            || caller.executable.map { executable in clientExecutables.contains(where: executable.isFile(at:)) } == true
            || caller.systemdUnit.map(clientUnits.contains) == true
    }

    /// Whether `[Clients]` admits by executable or unit: by what the caller's
    /// process is, not only by the user the bus vouches for.
    public var admitsByProcess: Bool { !clientExecutables.isEmpty || !clientUnits.isEmpty }

    /// Whether the lists (and the mode's rules) make the caller an operator.
    /// (1.2) A page never is one.
    public func isOperator(_ caller: CallerIdentity) -> Bool {
        if caller.origin != nil { return false }
        if isBuiltIn(caller, groupConfigured: operatorsConfigured) { return true }
        return operatorUIDs.contains(caller.uid) || !operatorGIDs.isDisjoint(with: caller.gids)
    }

    /// Admitted by the lists, or the polkit action to ask.
    public func verdict(for caller: CallerIdentity, action: PolkitAction) -> AccessVerdict {
        let listed = action.isOperatorAction ? isOperator(caller) : isClient(caller)
        return listed ? .admitted : .askPolkit(action: action.id)
    }

    /// Whether the caller is admitted to a session method at all — the check
    /// between the arguments and the session's state in the API's error
    /// order. StartSession and ConfigureForSession want a client. EndSession
    /// admits the owner's identity, clients and operators without polkit
    /// (whether a client may end *this* session is `Session.decide`'s
    /// `needsOperator`), and asks polkit for `end-session` for anyone else.
    public func admission(for method: SessionMethod, session: Session?, caller: BusCaller) -> AccessVerdict {
        switch method {
        case .startSession, .configureForSession:
            return verdict(for: caller.identity, action: .startSession)
        case .endSession:
            if let session, session.role(of: caller) != .other { return .admitted }
            if isClient(caller.identity) || isOperator(caller.identity) { return .admitted }
            return .askPolkit(action: PolkitAction.endSession.id)
        }
    }

    /// System mode: root, as with systemd's services. User mode: the bus's own
    /// user while the group is absent from the configuration.
    private func isBuiltIn(_ caller: CallerIdentity, groupConfigured: Bool) -> Bool {
        switch mode {
        case .system: return caller.uid == 0
        case .user: return !groupConfigured && caller.uid == serviceUID
        }
    }
}
