/// Where the service is on the bus, and the names of its members: the
/// coordinates every side of the API (the service, the client library, the
/// command-line tool, the tests) takes from here.
public enum GuidedAccessBus {
    /// The well-known bus name, on the system bus (system mode) or the
    /// kiosk user's session bus (user mode).
    public static let name = "org.guidedaccess.GuidedAccess1"
    /// The one object the service exports.
    public static let path = "/org/guidedaccess/GuidedAccess1"
    /// The interface of that object.
    public static let interface = "org.guidedaccess.GuidedAccess1"
    /// The prefix of the service's own error names.
    public static let errorPrefix = "org.guidedaccess.GuidedAccess1.Error."
}

/// The methods of `org.guidedaccess.GuidedAccess1`.
public enum GuidedAccessMethod: String, CaseIterable, Sendable {
    case startSession = "StartSession"
    case endSession = "EndSession"
    case configureForSession = "ConfigureForSession"
    case registerRestrictions = "RegisterRestrictions"
    case unregisterRestrictions = "UnregisterRestrictions"
    case setRestrictionState = "SetRestrictionState"
    case getRestrictionState = "GetRestrictionState"
    case listRestrictions = "ListRestrictions"
    /// (1.2) A session agent registers (system mode).
    case registerAgent = "RegisterAgent"
    /// (1.2) The kiosk browser's launcher hands over its DevTools pipe.
    case attachBrowser = "AttachBrowser"
    /// (1.2) The session agent hands on a call of a page of a browser it
    /// drives (system mode; the agent only).
    case pageCall = "PageCall"
    /// (1.2) The session agent tells that a page that may own the session
    /// is gone (system mode; the agent only).
    case pageLeft = "PageLeft"
}

/// The properties of `org.guidedaccess.GuidedAccess1`.
public enum GuidedAccessProperty: String, CaseIterable, Sendable {
    case sessionActive = "SessionActive"
    case sessionOwner = "SessionOwner"
    case sessionDeadline = "SessionDeadline"
    case enabledFeatures = "EnabledFeatures"
    case supportedFeatures = "SupportedFeatures"
    case desktop = "Desktop"
    case backend = "Backend"
    case version = "Version"
    /// (1.2) The session agent's user name; "" when none is registered.
    case agent = "Agent"
    /// (1.2) The origin of the page that owns the session; "" for a bus
    /// owner and while the owner is gone.
    case sessionOwnerOrigin = "SessionOwnerOrigin"
    /// `a{ss}`: for each feature not in `SupportedFeatures`, why — the text
    /// of the `UnsupportedFeature` error for it (an addition beyond API 1.2).
    case unsupportedReasons = "UnsupportedReasons"
}

/// The signals of `org.guidedaccess.GuidedAccess1`.
public enum GuidedAccessSignal: String, CaseIterable, Sendable {
    /// `(b active, s reason)`; the reason is a `SessionChangeReason`.
    case sessionChanged = "SessionChanged"
    /// `(s identifier, s state)`.
    case restrictionChanged = "RestrictionChanged"
}

/// Why a session began or ended: the `reason` of `SessionChanged`.
public enum SessionChangeReason: String, CaseIterable, Sendable, CustomStringConvertible {
    case started
    /// Taken over by a caller with the departed owner's identity.
    case resumed
    /// By its owner (or a caller taking over).
    case ended
    /// Its time limit passed.
    case timeLimit = "time-limit"
    /// By an operator who does not own it.
    case endedByOperator = "ended-by-operator"

    public var description: String { rawValue }
}

/// The keys of StartSession's options (`a{sv}`), with the D-Bus type of each value.
public enum SessionOptionKey: String, CaseIterable, Sendable, Comparable, CustomStringConvertible {
    case features
    case inhibitSleep = "inhibit-sleep"
    case textScale = "text-scale"
    case timeLimit = "time-limit"
    case zoomFactor = "zoom-factor"

    /// The value's D-Bus signature.
    public var signature: String {
        switch self {
        case .features: return "as"
        case .inhibitSleep: return "b"
        case .textScale, .zoomFactor: return "d"
        case .timeLimit: return "t"
        }
    }

    public var description: String { rawValue }

    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
}

/// The ranges the spec sets for StartSession's options.
public enum SessionLimits {
    /// 31 days, in seconds.
    public static let maxTimeLimitSec: UInt64 = 2_678_400
    public static let zoomFactor: ClosedRange<Double> = 1.0...32.0
    public static let textScale: ClosedRange<Double> = 1.0...3.0
}

/// (1.2) The session agent: `guidedaccessd --agent`, run as the kiosk user
/// in its graphical session, does there what the system service cannot
/// (runs Orca and the on-screen keyboard, drives the kiosk browser's
/// pages). It exports `interface` at `path` on its system-bus connection
/// and registers with `GuidedAccessMethod.registerAgent`.
public enum AgentBus {
    public static let interface = "org.guidedaccess.Agent1"
    public static let path = "/org/guidedaccess/Agent"
    /// The error an agent's `Apply` fails with, naming the feature and why.
    public static let failedError = "org.guidedaccess.Agent1.Error.Failed"
    /// Owned on the kiosk user's session bus by whichever acts in that
    /// session — the user-mode service or the agent — so that the two
    /// never both do.
    public static let sessionName = "org.guidedaccess.SessionAgent"
    /// `Apply`'s parameters (`a{sv}`), each a double.
    public static let zoomFactorParameter = "zoom-factor"
    public static let textScaleParameter = "text-scale"
    /// How long the service waits for `Apply` before it fails the call.
    public static let applyTimeoutSeconds = 5
    /// The exit status of a user-mode service or an agent that refuses to
    /// start because the other acts in its session (EX_CONFIG: the
    /// administrator enabled both); the units do not restart on it.
    public static let refusedExitStatus: Int32 = 78
}

/// (1.2) The members of `org.guidedaccess.Agent1`.
public enum AgentMethod: String, CaseIterable, Sendable {
    /// `(as features, a{sv} parameters) → ()`.
    case apply = "Apply"
    /// `() → ()`: stop everything; no longer the agent.
    case release = "Release"
    /// `(h browser, s launcher, u uid) → (s product)`: a launcher's browser,
    /// attached to the system service (`AttachBrowser`), passed on.
    case attachBrowser = "AttachBrowser"
}

/// The signals of `org.guidedaccess.Agent1` (an addition beyond API 1.2),
/// sent to the service's connection only.
public enum AgentSignal: String, CaseIterable, Sendable {
    /// `(s feature, s message, a{ss} fields)`: a feature of the session the
    /// agent no longer delivers (its program gave up restarting); the
    /// service audits it as it does its own programs' (`programGaveUp`).
    case featureLost = "FeatureLost"
}

/// (1.2) The properties of `org.guidedaccess.Agent1`.
public enum AgentProperty: String, CaseIterable, Sendable {
    /// `as`: what the agent can deliver in its session now.
    case supportedFeatures = "SupportedFeatures"
    /// `s`: the desktop it detected there.
    case desktop = "Desktop"
    /// `a{ss}`: for each feature it cannot deliver, why.
    case unsupportedReasons = "UnsupportedReasons"
}
