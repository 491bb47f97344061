/// An error of the GuidedAccess API, as the service answers with it and a
/// client receives it. Each message names the offending value, so a kiosk
/// developer reading a log knows what to fix.
public enum GuidedAccessError: Error, Hashable, Sendable, CustomStringConvertible {
    /// `org.freedesktop.DBus.Error.InvalidArgs`.
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
    /// A client's view: no bus, no service on it, or no answer.
    case serviceUnavailable(String)
    /// A client's view: any other D-Bus error.
    case other(name: String, message: String)

    static let dbusPrefix = "org.freedesktop.DBus.Error."

    /// The D-Bus error name of the reply.
    public var dbusErrorName: String {
        switch self {
        case .invalidArgs: return Self.dbusPrefix + "InvalidArgs"
        case .interactiveAuthorizationRequired: return Self.dbusPrefix + "InteractiveAuthorizationRequired"
        case .notAuthorized: return GuidedAccessBus.errorPrefix + "NotAuthorized"
        case .notInSession: return GuidedAccessBus.errorPrefix + "NotInSession"
        case .sessionBusy: return GuidedAccessBus.errorPrefix + "SessionBusy"
        case .unknownFeature: return GuidedAccessBus.errorPrefix + "UnknownFeature"
        case .unsupportedFeature: return GuidedAccessBus.errorPrefix + "UnsupportedFeature"
        case .unknownRestriction: return GuidedAccessBus.errorPrefix + "UnknownRestriction"
        case .limitExceeded: return GuidedAccessBus.errorPrefix + "LimitExceeded"
        case .backendFailed: return GuidedAccessBus.errorPrefix + "BackendFailed"
        case .serviceUnavailable: return Self.dbusPrefix + "ServiceUnknown"
        case .other(let name, _): return name
        }
    }

    /// The error a D-Bus error reply stands for, by its name.
    public init(dbusErrorName name: String, message m: String) {
        switch name {
        case GuidedAccessBus.errorPrefix + "NotAuthorized": self = .notAuthorized(m)
        case GuidedAccessBus.errorPrefix + "NotInSession": self = .notInSession(m)
        case GuidedAccessBus.errorPrefix + "SessionBusy": self = .sessionBusy(m)
        case GuidedAccessBus.errorPrefix + "UnknownFeature": self = .unknownFeature(m)
        case GuidedAccessBus.errorPrefix + "UnsupportedFeature": self = .unsupportedFeature(m)
        case GuidedAccessBus.errorPrefix + "UnknownRestriction": self = .unknownRestriction(m)
        case GuidedAccessBus.errorPrefix + "LimitExceeded": self = .limitExceeded(m)
        case GuidedAccessBus.errorPrefix + "BackendFailed": self = .backendFailed(m)
        case Self.dbusPrefix + "InvalidArgs": self = .invalidArgs(m)
        case Self.dbusPrefix + "InteractiveAuthorizationRequired": self = .interactiveAuthorizationRequired(m)
        // The bus's policy refused the call.
        case Self.dbusPrefix + "AccessDenied": self = .notAuthorized(m)
        case Self.dbusPrefix + "ServiceUnknown", Self.dbusPrefix + "NameHasNoOwner", Self.dbusPrefix + "NoServer",
            Self.dbusPrefix + "Disconnected", Self.dbusPrefix + "NoReply", Self.dbusPrefix + "Timeout",
            Self.dbusPrefix + "TimedOut", Self.dbusPrefix + "FileNotFound", Self.dbusPrefix + "BadAddress",
            Self.dbusPrefix + "NoNetwork":
            self = .serviceUnavailable(m)
        default: self = .other(name: name, message: m)
        }
    }

    /// The human-readable message of the reply.
    public var message: String {
        switch self {
        case .invalidArgs(let m), .notAuthorized(let m), .interactiveAuthorizationRequired(let m),
            .notInSession(let m), .sessionBusy(let m), .unknownFeature(let m),
            .unsupportedFeature(let m), .unknownRestriction(let m), .limitExceeded(let m),
            .backendFailed(let m), .serviceUnavailable(let m), .other(_, let m):
            return m
        }
    }

    public var description: String { "\(dbusErrorName): \(message)" }
}
