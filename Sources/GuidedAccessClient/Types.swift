import DBus

/// An accessibility feature, by its name on the wire.
public enum GuidedAccessFeature: String, CaseIterable, Sendable, Hashable, Comparable {
    case screenReader = "screen-reader"
    case zoom
    case invertColors = "invert-colors"
    case grayscale
    case highContrast = "high-contrast"
    case largeText = "large-text"
    case onScreenKeyboard = "on-screen-keyboard"
    case reduceMotion = "reduce-motion"

    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
}

/// The state of a custom restriction.
public enum RestrictionState: String, Sendable, Hashable, CaseIterable {
    case allow
    case deny
}

/// Options of StartSession; nil means the service's configured default.
public struct SessionOptions: Sendable, Hashable {
    /// Until the session ends by itself; `.zero` = no limit. Whole seconds.
    public var timeLimit: Duration?
    /// Magnification while `zoom` is on, 1.0 to 32.0.
    public var zoomFactor: Double?
    /// Text scaling while `large-text` is on, 1.0 to 3.0.
    public var textScale: Double?
    /// Hold a logind `sleep:idle` inhibitor while the session lasts.
    public var inhibitSleep: Bool?

    public init(timeLimit: Duration? = nil, zoomFactor: Double? = nil, textScale: Double? = nil, inhibitSleep: Bool? = nil) {
        self.timeLimit = timeLimit
        self.zoomFactor = zoomFactor
        self.textScale = textScale
        self.inhibitSleep = inhibitSleep
    }

    /// The `a{sv}` of StartSession, without `features`.
    func dictionary() throws(GuidedAccessError) -> [String: Variant] {
        var options: [String: Variant] = [:]
        if let timeLimit {
            let (seconds, attoseconds) = timeLimit.components
            guard seconds >= 0, attoseconds >= 0 else {
                throw .invalidArguments("time limit \(timeLimit) is negative")
            }
            // Round up: a limit of 1.5 s is not a limit of 1 s.
            options["time-limit"] = Variant(UInt64(seconds) + (attoseconds > 0 ? 1 : 0))
        }
        if let zoomFactor { options["zoom-factor"] = Variant(zoomFactor) }
        if let textScale { options["text-scale"] = Variant(textScale) }
        if let inhibitSleep { options["inhibit-sleep"] = Variant(inhibitSleep) }
        return options
    }
}

/// A registered restriction as ListRestrictions returns it.
public struct Restriction: Sendable, Hashable {
    public var identifier: String
    public var text: String
    /// Empty when there is none.
    public var detailText: String
    public var state: RestrictionState

    public init(identifier: String, text: String, detailText: String = "", state: RestrictionState = .allow) {
        self.identifier = identifier
        self.text = text
        self.detailText = detailText
        self.state = state
    }
}

/// The service's properties at one moment.
public struct GuidedAccessStatus: Sendable, Hashable {
    public var sessionActive: Bool
    /// The owner's unique bus name; empty when there is none or it is gone.
    public var sessionOwner: String
    /// End of the time limit in microseconds since the Unix epoch; 0 = none.
    public var sessionDeadline: UInt64
    /// Wire names, sorted (names this library does not know are kept).
    public var enabledFeatures: [String]
    public var supportedFeatures: [String]
    public var backend: String
    public var version: String
}

/// A signal of the service, in the order the service sent it.
public enum GuidedAccessEvent: Sendable, Hashable {
    /// `SessionChanged`; reason is `started`, `resumed`, `ended`,
    /// `time-limit` or `ended-by-operator`.
    case session(active: Bool, reason: String)
    /// `RestrictionChanged`.
    case restriction(identifier: String, state: RestrictionState)
}

/// Supplies custom restrictions, like `UIGuidedAccessRestrictionDelegate`.
public protocol GuidedAccessRestrictionProvider: Sendable {
    /// The identifiers of the restrictions, reverse-DNS by convention.
    var identifiers: [String] { get }
    /// The short text the operator sees (1 to 200 bytes).
    func text(for identifier: String) -> String
    /// Longer text, or nil for none.
    func detailText(for identifier: String) -> String?
    /// Called when the operator changes one of this provider's restrictions
    /// (and when a session ends and a denied one returns to allow).
    func didChange(identifier: String, state: RestrictionState)
}

extension GuidedAccessRestrictionProvider {
    public func detailText(for identifier: String) -> String? { nil }
}
