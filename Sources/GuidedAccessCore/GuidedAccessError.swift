/// The errors the service answers with. Each message names the offending
/// value, so a kiosk developer reading a log knows what to fix.
public enum GuidedAccessError: Error, Hashable, Sendable, CustomStringConvertible {
    case invalidArgs(String)
    case notAuthorized(String)
    /// polkit wanted to challenge the caller but the call did not allow it.
    case interactiveAuthorizationRequired(String)
    case notInSession(String)
    case sessionBusy(String)
    case unknownFeature(String)
    case unsupportedFeature(String)
    case unknownRestriction(String)
    case limitExceeded(String)
    case backendFailed(String)

    static let namespace = "org.guidedaccess.GuidedAccess1.Error."

    /// The D-Bus error name of the reply.
    public var dbusErrorName: String {
        switch self {
        case .invalidArgs: return "org.freedesktop.DBus.Error.InvalidArgs"
        case .interactiveAuthorizationRequired:
            return "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
        case .notAuthorized: return Self.namespace + "NotAuthorized"
        case .notInSession: return Self.namespace + "NotInSession"
        case .sessionBusy: return Self.namespace + "SessionBusy"
        case .unknownFeature: return Self.namespace + "UnknownFeature"
        case .unsupportedFeature: return Self.namespace + "UnsupportedFeature"
        case .unknownRestriction: return Self.namespace + "UnknownRestriction"
        case .limitExceeded: return Self.namespace + "LimitExceeded"
        case .backendFailed: return Self.namespace + "BackendFailed"
        }
    }

    /// The human-readable message of the reply.
    public var message: String {
        switch self {
        case .invalidArgs(let m), .notAuthorized(let m), .interactiveAuthorizationRequired(let m),
            .notInSession(let m), .sessionBusy(let m), .unknownFeature(let m),
            .unsupportedFeature(let m), .unknownRestriction(let m), .limitExceeded(let m),
            .backendFailed(let m):
            return m
        }
    }

    public var description: String { "\(dbusErrorName): \(message)" }
}
