import DBus
import Glibc
import GuidedAccessCore
import GuidedAccessWire

/// Who is calling, and whether the lists or polkit admit it.
extension GuidedAccessService {
    /// Who is calling, from the bus and /proc, never from anything the caller
    /// says: the bus's credentials of the connection (cached per unique
    /// name), and — read anew each call, as a process may exec another
    /// program — its executable and systemd unit.
    func identify(_ call: MethodCall) async throws(GuidedAccessError) -> BusCaller {
        let credentials: Credentials
        if let cached = credentialCache[call.sender] {
            credentials = cached
        } else {
            do {
                credentials = try await connection.credentials(of: call.sender)
            } catch {
                throw .notAuthorized("cannot learn who \(call.sender) is: \(error.message)")
            }
            if let fd = credentials.processFD { close(fd) }
            credentialCache[call.sender] = Credentials(
                unixUserID: credentials.unixUserID, unixGroupIDs: credentials.unixGroupIDs,
                processID: credentials.processID)
        }
        guard let uid = credentials.unixUserID else {
            throw .notAuthorized("the bus does not know the user of \(call.sender)")
        }
        let pid = credentials.processID ?? 0
        let identity = CallerIdentity(
            uid: uid, gids: credentials.unixGroupIDs ?? [], pid: pid,
            executablePath: pid == 0 ? nil : ProcessInfo.executable(of: pid),
            systemdUnit: pid == 0 ? nil : ProcessInfo.systemdUnit(of: pid))
        return BusCaller(uniqueName: call.sender, identity: identity)
    }

    /// Runs a handler; a refusal (NotAuthorized, interactive authorization
    /// required) leaves an audit record naming the caller.
    func audited(_ call: MethodCall, _ body: () async throws -> Void) async throws {
        do {
            try await body()
        } catch let error as GuidedAccessError {
            switch error {
            case .notAuthorized, .interactiveAuthorizationRequired:
                let caller = try? await identify(call)
                settings.audit.record(
                    .callDenied, caller: caller?.identity, "\(call.member) by \(call.sender) denied: \(error.message)",
                    fields: ["METHOD": call.member, "ERROR": error.dbusErrorName])
            default:
                break
            }
            throw error
        }
    }

    /// Asks polkit when the lists did not admit the caller.
    func admit(_ verdict: AccessVerdict, _ call: MethodCall) async throws {
        guard case .askPolkit(let action) = verdict else { return }
        try await settings.authority.authorize(
            action: action, busName: call.sender, interactive: call.allowInteractiveAuthorization)
    }

    /// Admits a client (RegisterRestrictions, UnregisterRestrictions).
    func admitClient(_ call: MethodCall) async throws {
        let caller = try await identify(call)
        try await admit(settings.policy.verdict(for: caller.identity, action: .startSession), call)
    }
}

/// A small map of unique bus names to their credentials. Unique names are
/// never reused on a bus, so an entry cannot go stale in a harmful way; the
/// oldest entries go when it is full, which bounds it however many clients
/// come and go.
struct CredentialCache {
    let capacity: Int
    private var entries: [String: Credentials] = [:]
    private var order: [String] = []

    init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    var count: Int { entries.count }

    subscript(name: String) -> Credentials? {
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
