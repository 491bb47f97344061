import DBus

/// An error of the GuidedAccess API. Each case carries the service's message,
/// which names the offending value.
public enum GuidedAccessError: Error, Sendable, Hashable, CustomStringConvertible {
    case notAuthorized(String)
    case notInSession(String)
    case sessionBusy(String)
    case unknownFeature(String)
    case unsupportedFeature(String)
    case unknownRestriction(String)
    case limitExceeded(String)
    case backendFailed(String)
    /// `org.freedesktop.DBus.Error.InvalidArgs`.
    case invalidArguments(String)
    /// polkit needs to ask, and the call did not allow interaction.
    case interactiveAuthorizationRequired(String)
    /// No bus, no service on it, or no answer.
    case serviceUnavailable(String)
    /// Any other D-Bus error.
    case other(name: String, message: String)

    public static let errorPrefix = "org.guidedaccess.GuidedAccess1.Error."
    static let dbusPrefix = "org.freedesktop.DBus.Error."

    /// Maps a D-Bus error by its name.
    public init(_ error: DBusError) {
        let m = error.message
        switch error.name {
        case Self.errorPrefix + "NotAuthorized": self = .notAuthorized(m)
        case Self.errorPrefix + "NotInSession": self = .notInSession(m)
        case Self.errorPrefix + "SessionBusy": self = .sessionBusy(m)
        case Self.errorPrefix + "UnknownFeature": self = .unknownFeature(m)
        case Self.errorPrefix + "UnsupportedFeature": self = .unsupportedFeature(m)
        case Self.errorPrefix + "UnknownRestriction": self = .unknownRestriction(m)
        case Self.errorPrefix + "LimitExceeded": self = .limitExceeded(m)
        case Self.errorPrefix + "BackendFailed": self = .backendFailed(m)
        case Self.dbusPrefix + "InvalidArgs": self = .invalidArguments(m)
        case Self.dbusPrefix + "InteractiveAuthorizationRequired": self = .interactiveAuthorizationRequired(m)
        // The bus's policy refused the call.
        case Self.dbusPrefix + "AccessDenied": self = .notAuthorized(m)
        case Self.dbusPrefix + "ServiceUnknown", Self.dbusPrefix + "NameHasNoOwner", Self.dbusPrefix + "NoServer",
            Self.dbusPrefix + "Disconnected", Self.dbusPrefix + "NoReply", Self.dbusPrefix + "Timeout",
            Self.dbusPrefix + "TimedOut", Self.dbusPrefix + "FileNotFound", Self.dbusPrefix + "BadAddress",
            Self.dbusPrefix + "NoNetwork":
            self = .serviceUnavailable(m)
        default: self = .other(name: error.name, message: m)
        }
    }

    public var message: String {
        switch self {
        case .notAuthorized(let m), .notInSession(let m), .sessionBusy(let m), .unknownFeature(let m),
            .unsupportedFeature(let m), .unknownRestriction(let m), .limitExceeded(let m), .backendFailed(let m),
            .invalidArguments(let m), .interactiveAuthorizationRequired(let m), .serviceUnavailable(let m):
            return m
        case .other(_, let m): return m
        }
    }

    public var description: String { message }
}
