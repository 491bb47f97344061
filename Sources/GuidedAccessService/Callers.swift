import DBus
import Glibc
import GuidedAccessCore
import GuidedAccessWire

/// Who is calling, and whether the lists or polkit admit it.
extension GuidedAccessService {
    /// Who is calling, from the bus and /proc, never from anything the caller
    /// says: the bus's credentials of the connection (cached per unique
    /// name), and — read anew each call, as a process may exec another
    /// program — its executable and systemd unit. `warn`: log a process
    /// not taken as the caller's (once per call: not again for its audit).
    func identify(_ call: MethodCall, warn: Bool = true) async throws(GuidedAccessError) -> BusCaller {
        let credentials: CallerCredentials
        if let cached = credentialCache[call.sender] {
            credentials = cached
        } else {
            do {
                credentials = CallerCredentials(try await connection.credentials(of: call.sender))
            } catch {
                throw .notAuthorized("cannot learn who \(call.sender) is: \(error.message)")
            }
            credentialCache[call.sender] = credentials
        }
        guard let uid = credentials.uid else {
            throw .notAuthorized("the bus does not know the user of \(call.sender)")
        }
        let process = connectingProcess(credentials, uid: uid, of: call.sender, warn: warn)
        let identity = CallerIdentity(
            uid: uid, gids: credentials.gids, pid: process?.pid ?? credentials.pid ?? 0,
            executable: process?.executable, systemdUnit: process?.systemdUnit)
        return BusCaller(uniqueName: call.sender, identity: identity)
    }

    /// The process that made the connection, as /proc shows it; nil when it
    /// has gone or cannot be shown to be the one: a connection outlives its
    /// process, whose pid may then be given to any process of any user.
    /// With the bus's pidfd it is the process that connected; without one,
    /// it must have started before the connection appeared on the bus
    /// (`connectionAges`, followed only where the lists admit by executable
    /// or unit: elsewhere the executable decides only take-over, which a
    /// process of the same user can have by exec'ing the owner's program
    /// anyway). Either way it must run as the connection's user.
    ///
    /// Once shown, the process's `/proc/PID` directory is kept with the
    /// connection's credentials: the next calls read through it (it reads
    /// nothing once the process is gone) and need not show it again.
    private func connectingProcess(
        _ credentials: CallerCredentials, uid: UInt32, of sender: String, warn: Bool
    ) -> CallerProcess? {
        if let (directory, startTicks) = credentials.process {
            // Read again: it may have exec'd another program, or changed its uid.
            guard let process = CallerProcess(directory, startTicks: startTicks) else { return nil }
            guard process.effectiveUID == uid else {
                if warn {
                    logger.warning(
                        "pid \(process.pid) of \(sender) runs as uid \(process.effectiveUID), not as the connection's uid \(uid): its executable and unit are not taken as the caller's"
                    )
                }
                return nil
            }
            return process
        }
        // With a pidfd, its own pid: the bus's may be of another pid namespace.
        let pid = if let pidFD = credentials.pidFD { pidFD.pid } else { credentials.pid }
        guard let pid, pid != 0, let directory = ProcDirectory(pid: pid), let process = CallerProcess(directory) else {
            return nil
        }
        func refuse(_ why: String) -> CallerProcess? {
            guard warn else { return nil }
            logger.warning("pid \(pid) of \(sender) \(why): its executable and unit are not taken as the caller's")
            return nil
        }
        guard process.effectiveUID == uid else {
            return refuse("runs as uid \(process.effectiveUID), not as the connection's uid \(uid)")
        }
        if let pidFD = credentials.pidFD {
            // Not reaped after the reads: they were of the process that connected.
            guard pidFD.isAlive else { return nil }
        } else if let connectionAges {
            guard let appeared = connectionAges.appearance(of: sender) else {
                return refuse("cannot be dated: the service did not see \(sender) appear on the bus")
            }
            guard process.started(before: appeared) else { return refuse("started after its connection") }
        }
        credentialCache[sender]?.process = (directory, process.startTicks)
        return process
    }

    // MARK: Connections' ages

    /// Start-up: where the lists admit by executable or unit and the bus
    /// gives no pidfds, follows unique names appearing and leaving the bus
    /// (see `connectingProcess`). Otherwise it costs nothing: no match, no
    /// wake-up for other connections.
    func followConnectionAges() async {
        guard settings.policy.admitsByProcess else { return }
        if let own = try? await connection.credentials(of: connection.uniqueName), let fd = own.processFD {
            close(fd)
            return
        }
        connectionAges = ConnectionAges(capacity: Self.connectionAgesCapacity)
        do {
            _ = try await connection.subscribe(.nameOwnerChanged()) { [self] message in
                let now = ConnectionAges.now()
                guard let arguments = try? message.arguments(), arguments.count == 3,
                    case .string(let name) = arguments[0], name.hasPrefix(":"),
                    case .string(let oldOwner) = arguments[1], case .string(let newOwner) = arguments[2]
                else { return }
                Task(executorPreference: connection.loop) {
                    await self.connectionChanged(name, appeared: oldOwner.isEmpty, left: newOwner.isEmpty, at: now)
                }
            }
            let names = try await connection.listNames()
            let now = ConnectionAges.now()
            for name in names where name.hasPrefix(":") { connectionAges?.noteAppeared(name, atBoottime: now) }
        } catch {
            logger.error("cannot follow connections on the bus (\(error)): no caller is admitted by executable or unit")
        }
    }

    /// Unique names on dbus-daemon's system bus are at most its 2048
    /// connections (`max_completed_connections`); a session bus allows more,
    /// and beyond this they go undated (denied by executable or unit).
    static let connectionAgesCapacity = 4096

    private func connectionChanged(_ name: String, appeared: Bool, left: Bool, at time: UInt64) {
        if appeared { connectionAges?.noteAppeared(name, atBoottime: time) }
        if left { connectionAges?.noteLeft(name) }
    }

    /// Runs a handler; a refusal (NotAuthorized, interactive authorization
    /// required) leaves an audit record naming the caller.
    func audited(_ call: MethodCall, _ body: () async throws -> Void) async throws {
        do {
            try await body()
        } catch let error as GuidedAccessError {
            switch error {
            case .notAuthorized, .interactiveAuthorizationRequired:
                let caller = try? await identify(call, warn: false)
                settings.audit.record(
                    .callDenied, caller: caller?.identity, "\(call.member) by \(call.sender) denied: \(error.message)",
                    fields: ["METHOD": call.member, "ERROR": error.dbusErrorName])
            default:
                break
            }
            throw error
        }
    }

    /// Who is calling: a bus caller as `identify` finds it; a page as the
    /// browser layer found it (its launcher, its origin, its tab).
    func identify(_ call: Requester) async throws(GuidedAccessError) -> BusCaller {
        switch call {
        case .bus(let call): try await identify(call)
        case .page(let page): page
        }
    }

    /// Asks polkit when the lists did not admit the caller.
    func admit(_ verdict: AccessVerdict, _ caller: BusCaller, _ call: Requester) async throws {
        guard case .askPolkit(let action) = verdict else { return }
        guard let polkitAction = PolkitAction(rawValue: action) else {
            throw GuidedAccessError.notAuthorized("unknown polkit action \(action)")
        }
        try await authorize(polkitAction, caller, call)
    }

    /// Asks polkit for `action`. A page is never asked about: what
    /// `[Browser] AllowOrigins=` grants is all it has.
    func authorize(_ action: PolkitAction, _ caller: BusCaller, _ call: Requester) async throws {
        switch call {
        case .bus(let call):
            do throws(GuidedAccessError) {
                try await settings.authority.authorize(
                    action: action.id, caller: caller, interactive: call.allowInteractiveAuthorization)
            } catch {
                // The way in, named: the keys (or the polkit rule) that would admit this caller.
                let wayIn = action.wayIn(
                    for: caller.identity, userName: SystemUsers.name(of: caller.identity.uid),
                    polkit: settings.mode == .system)
                switch error {
                case .notAuthorized(let message): throw GuidedAccessError.notAuthorized("\(message); \(wayIn)")
                case .interactiveAuthorizationRequired(let message):
                    throw GuidedAccessError.interactiveAuthorizationRequired("\(message); \(wayIn)")
                default: throw error
                }
            }
        case .page:
            throw GuidedAccessError.notAuthorized(
                "the page \(caller.identity.origin ?? "") may not \(action.pageDescription): [Browser] AllowOrigins makes a page a client, never an operator (an operator ends it with guidedaccessctl end)")
        }
    }

    /// Admits a client (RegisterRestrictions, UnregisterRestrictions).
    func admitClient(_ call: Requester) async throws {
        let caller = try await identify(call)
        try await admit(settings.policy.verdict(for: caller.identity, action: .startSession), caller, call)
    }
}

/// Who a call comes from: the bus, or (1.2) a page of the kiosk browser
/// (`PageCalls`).
enum Requester {
    case bus(MethodCall)
    case page(BusCaller)
}

extension PolkitAction {
    /// What a page would need an operator for, in a refusal.
    var pageDescription: String {
        switch self {
        case .startSession: "start a session"
        case .endSession: "end a session it does not own"
        case .manageRestrictions: "change restriction states"
        }
    }
}

/// The bus's credentials of a connection, as the service keeps them.
struct CallerCredentials {
    var uid: UInt32?
    var gids: [UInt32]
    var pid: UInt32?
    var pidFD: ConnectionPidFD?
    /// The process once shown to be the connection's, and its start time.
    var process: (ProcDirectory, UInt64)?

    init(uid: UInt32?, gids: [UInt32] = [], pid: UInt32? = nil, pidFD: ConnectionPidFD? = nil) {
        self.uid = uid
        self.gids = gids
        self.pid = pid
        self.pidFD = pidFD
    }

    /// Takes over the pidfd, if the bus gave one.
    init(_ credentials: Credentials) {
        self.init(
            uid: credentials.unixUserID, gids: credentials.unixGroupIDs ?? [], pid: credentials.processID,
            pidFD: credentials.processFD.map(ConnectionPidFD.init(adopting:)))
    }
}

/// A small map of unique bus names to their credentials. Unique names are
/// never reused on a bus, so an entry cannot go stale in a harmful way; the
/// oldest entries go when it is full, which bounds it however many clients
/// come and go.
struct CredentialCache {
    let capacity: Int
    private var entries: [String: CallerCredentials] = [:]
    private var order: [String] = []

    init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    var count: Int { entries.count }

    subscript(name: String) -> CallerCredentials? {
        get { entries[name] }
        set {
            guard let newValue else {
                if entries.removeValue(forKey: name) != nil { order.removeAll { $0 == name } }
                return
            }
            if entries.updateValue(newValue, forKey: name) == nil {
                order.append(name)
                if order.count > capacity {
                    let evicted = order.count - capacity
                    for old in order.prefix(evicted) { entries[old] = nil }
                    order.removeFirst(evicted)
                }
            }
        }
    }
}
