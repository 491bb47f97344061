import DBus
import GuidedAccessCore
import Synchronization

/// Decides what the configuration's lists leave open: whether a caller may
/// perform a polkit action. Asked before any state changes, on every call
/// it decides (answers are not cached).
public protocol Authority: Sendable {
    /// Returns when the action is allowed; throws `notAuthorized` (or
    /// `interactiveAuthorizationRequired`) with a message saying why not.
    func authorize(action: String, caller: BusCaller, interactive: Bool) async throws(GuidedAccessError)
}

/// For a service that consults no polkit (user mode): everything the lists
/// do not admit is denied, and the message says so.
public struct ListsOnlyAuthority: Authority {
    public let reason: String

    public init(reason: String) {
        self.reason = reason
    }

    public func authorize(action: String, caller: BusCaller, interactive: Bool) async throws(GuidedAccessError) {
        throw .notAuthorized("\(caller.uniqueName) may not perform \(action): \(reason)")
    }
}

/// polkit's `CheckAuthorization` for the caller as a `system-bus-name`
/// subject, on the bus the service is on (system mode). No answer in time,
/// polkit absent or failing: denied, with a message saying why.
///
/// Until polkit answers a check, the bus counts it against the service's
/// pending replies (dbus-daemon: 128 per connection, never timed out);
/// with those used up the service could ask nobody anything, not even
/// polkit about an operator. So a check counts as in flight until polkit
/// answers, however long after its caller was told "no answer in time",
/// and a user with `perUser` checks in flight (from however many
/// connections), or everyone with `total`, is denied at once.
public final class PolkitAuthority: Authority {
    static let name = "org.freedesktop.PolicyKit1"
    static let path: ObjectPath = "/org/freedesktop/PolicyKit1/Authority"
    static let interface = "org.freedesktop.PolicyKit1.Authority"

    let connection: Connection
    /// How long a non-interactive check may take; an interactive one waits
    /// for the person answering the agent, within the 25 s a D-Bus caller
    /// waits by default.
    let timeout: Duration
    let interactiveTimeout: Duration
    private let inFlight: Mutex<PolkitChecksInFlight>

    /// A person answers one agent at a time, so a few checks per user are
    /// plenty; all users together keep to a quarter of dbus-daemon's 128
    /// pending replies, leaving the rest for logind, dconf and systemd.
    public init(
        connection: Connection, timeout: Duration = .seconds(5), interactiveTimeout: Duration = .seconds(20),
        perUser: Int = 4, total: Int = 32
    ) {
        self.connection = connection
        self.timeout = timeout
        self.interactiveTimeout = interactiveTimeout
        inFlight = Mutex(PolkitChecksInFlight(perUser: perUser, total: total))
    }

    public func authorize(action: String, caller: BusCaller, interactive: Bool) async throws(GuidedAccessError) {
        let busName = caller.uniqueName, uid = caller.identity.uid
        if let full = inFlight.withLock({ $0.begin(uid) }) {
            throw .notAuthorized("\(busName) may not perform \(action): \(full); try again once polkit has answered them")
        }
        let answer = FirstOutcome<Result<[DBusValue], DBusError>?>()
        let loop = connection.loop
        Task(executorPreference: loop) { [self] in
            defer { inFlight.withLock { $0.end(uid) } }
            answer.resolve(await checkAuthorization(action: action, busName: busName, interactive: interactive))
        }
        let limit = interactive ? interactiveTimeout : timeout
        let timer = Task(executorPreference: loop) {
            if (try? await loop.sleep(for: limit)) != nil { answer.resolve(nil) }
        }
        let outcome = await answer.value
        timer.cancel()
        guard let outcome else {
            throw .notAuthorized("\(busName) may not perform \(action): polkit did not answer in time")
        }
        let reply: [DBusValue]
        switch outcome {
        case .success(let values):
            reply = values
        case .failure(let error):
            switch error.name {
            case "org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.Timeout":
                throw .notAuthorized("\(busName) may not perform \(action): polkit did not answer in time")
            case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
                throw .notAuthorized("\(busName) may not perform \(action): polkit is not available")
            default:
                throw .notAuthorized("\(busName) may not perform \(action): polkit failed: \(error.message)")
            }
        }
        guard case .structure(let fields)? = reply.first, fields.count == 3,
            case .bool(let authorized) = fields[0], case .bool(let challenge) = fields[1]
        else {
            throw .notAuthorized("\(busName) may not perform \(action): polkit's answer was malformed")
        }
        if authorized { return }
        if challenge && !interactive {
            throw .interactiveAuthorizationRequired(
                "\(action) needs authentication, which an unattended kiosk cannot give; a person at a terminal can call again with ALLOW_INTERACTIVE_AUTHORIZATION (guidedaccessctl asks for a password)")
        }
        throw .notAuthorized("polkit does not allow \(busName) to perform \(action)")
    }

    /// The call itself, waiting for polkit's answer however long it takes.
    private func checkAuthorization(action: String, busName: String, interactive: Bool)
        async -> Result<[DBusValue], DBusError>
    {
        let subject = DBusValue.structure([
            .string("system-bus-name"),
            .dictionary(key: .string, value: .variant, [.init(.string("name"), .variant(.string(busName)))]),
        ])
        do {
            return .success(
                try await connection.call(
                    destination: Self.name, path: Self.path, interface: Self.interface, member: "CheckAuthorization",
                    [
                        subject, .string(action), .dictionary(key: .string, value: .string, []),
                        .uint32(interactive ? 1 : 0), .string(""),
                    ],
                    timeout: Connection.noTimeout))
        } catch {
            return .failure(error)
        }
    }
}

/// polkit checks sent and not answered yet, per user and in all.
struct PolkitChecksInFlight {
    let perUser: Int
    let total: Int
    private var byUser: [UInt32: Int] = [:]
    private(set) var count = 0

    init(perUser: Int, total: Int) {
        precondition(perUser > 0 && total >= perUser)
        self.perUser = perUser
        self.total = total
    }

    /// Counts a check about to be sent; returns why not instead when there is no room.
    mutating func begin(_ uid: UInt32) -> String? {
        if byUser[uid, default: 0] >= perUser { return "too many polkit checks in flight for uid \(uid) (\(perUser))" }
        if count >= total { return "too many polkit checks in flight (\(total))" }
        byUser[uid, default: 0] += 1
        count += 1
        return nil
    }

    /// polkit answered a check of `uid` (or the bus said it never will).
    mutating func end(_ uid: UInt32) {
        guard let checks = byUser[uid] else { return }
        byUser[uid] = checks > 1 ? checks - 1 : nil
        count -= 1
    }
}

/// Whichever of several racers gives a value first; later ones are ignored.
private final class FirstOutcome<Value: Sendable>: Sendable {
    private enum State {
        case waiting(CheckedContinuation<Value, Never>?)
        case resolved(Value)
    }

    private let state = Mutex(State.waiting(nil))

    func resolve(_ value: Value) {
        let waiter: CheckedContinuation<Value, Never>?? = state.withLock { state in
            guard case .waiting(let waiter) = state else { return nil }
            state = .resolved(value)
            return .some(waiter)
        }
        if case .some(.some(let waiter)) = waiter { waiter.resume(returning: value) }
    }

    var value: Value {
        get async {
            await withCheckedContinuation { continuation in
                let resolved: Value? = state.withLock { state in
                    if case .resolved(let value) = state { return value }
                    state = .waiting(continuation)
                    return nil
                }
                if let resolved { continuation.resume(returning: resolved) }
            }
        }
    }
}
