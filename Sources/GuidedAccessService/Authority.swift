import DBus
import GuidedAccessCore

/// Decides what the configuration's lists leave open: whether a caller may
/// perform a polkit action. Asked before any state changes, on every call
/// it decides (answers are not cached).
public protocol Authority: Sendable {
    /// Returns when the action is allowed; throws `notAuthorized` (or
    /// `interactiveAuthorizationRequired`) with a message saying why not.
    func authorize(action: String, busName: String, interactive: Bool) async throws(GuidedAccessError)
}

/// For a service that consults no polkit (user mode): everything the lists
/// do not admit is denied, and the message says so.
public struct ListsOnlyAuthority: Authority {
    public let reason: String

    public init(reason: String) {
        self.reason = reason
    }

    public func authorize(action: String, busName: String, interactive: Bool) async throws(GuidedAccessError) {
        throw .notAuthorized("\(busName) may not perform \(action): \(reason)")
    }
}

/// polkit's `CheckAuthorization` for the caller as a `system-bus-name`
/// subject, on the bus the service is on (system mode). No answer in time,
/// polkit absent or failing: denied, with a message saying why.
public struct PolkitAuthority: Authority {
    static let name = "org.freedesktop.PolicyKit1"
    static let path: ObjectPath = "/org/freedesktop/PolicyKit1/Authority"
    static let interface = "org.freedesktop.PolicyKit1.Authority"

    let connection: Connection
    /// How long a non-interactive check may take; an interactive one waits
    /// for the person answering the agent, within the 25 s a D-Bus caller
    /// waits by default.
    let timeout: Duration
    let interactiveTimeout: Duration

    public init(connection: Connection, timeout: Duration = .seconds(5), interactiveTimeout: Duration = .seconds(20)) {
        self.connection = connection
        self.timeout = timeout
        self.interactiveTimeout = interactiveTimeout
    }

    public func authorize(action: String, busName: String, interactive: Bool) async throws(GuidedAccessError) {
        let subject = DBusValue.structure([
            .string("system-bus-name"),
            .dictionary(key: .string, value: .variant, [.init(.string("name"), .variant(.string(busName)))]),
        ])
        let reply: [DBusValue]
        do {
            reply = try await connection.call(
                destination: Self.name, path: Self.path, interface: Self.interface, member: "CheckAuthorization",
                [
                    subject, .string(action), .dictionary(key: .string, value: .string, []),
                    .uint32(interactive ? 1 : 0), .string(""),
                ],
                timeout: interactive ? interactiveTimeout : timeout)
        } catch {
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
                "\(action) needs authentication; call again with ALLOW_INTERACTIVE_AUTHORIZATION")
        }
        throw .notAuthorized("polkit does not allow \(busName) to perform \(action)")
    }
}
