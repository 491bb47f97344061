import DBus

/// Options of StartSession; nil means the service's configured default.
public struct SessionOptions: Sendable, Hashable {
    /// Until the session ends by itself; `.zero` = no limit. Whole seconds.
    public var timeLimit: Duration?
    /// Magnification while `zoom` is on, within `SessionLimits.zoomFactor`.
    public var zoomFactor: Double?
    /// Text scaling while `large-text` is on, within `SessionLimits.textScale`.
    public var textScale: Double?
    /// Hold a logind `sleep:idle` inhibitor while the session lasts.
    public var inhibitSleep: Bool?

    public init(timeLimit: Duration? = nil, zoomFactor: Double? = nil, textScale: Double? = nil, inhibitSleep: Bool? = nil) {
        self.timeLimit = timeLimit
        self.zoomFactor = zoomFactor
        self.textScale = textScale
        self.inhibitSleep = inhibitSleep
    }

    /// The options that are set, without `features`. The ranges are the
    /// service's to judge, so that its message is the one a caller sees.
    func dictionary() throws(GuidedAccessError) -> [SessionOptionKey: Variant] {
        var options: [SessionOptionKey: Variant] = [:]
        if let timeLimit {
            let (seconds, attoseconds) = timeLimit.components
            guard seconds >= 0, attoseconds >= 0 else {
                throw .invalidArgs("time limit \(timeLimit) is negative")
            }
            // Round up: a limit of 1.5 s is not a limit of 1 s.
            options[.timeLimit] = Variant(UInt64(seconds) + (attoseconds > 0 ? 1 : 0))
        }
        if let zoomFactor { options[.zoomFactor] = Variant(zoomFactor) }
        if let textScale { options[.textScale] = Variant(textScale) }
        if let inhibitSleep { options[.inhibitSleep] = Variant(inhibitSleep) }
        return options
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
    /// The graphical session the features act on, e.g. `gnome-shell` or
    /// `cage+browser`; empty from a service older than 1.1, which does not
    /// say.
    public var desktop: String
    public var version: String
    /// (1.2) The user whose session agent is registered with a system-mode
    /// service; empty when none is, in user mode (where the service is its
    /// own agent), and from a service older than 1.2.
    public var agent: String = ""
    /// (1.2) The origin of the kiosk browser's page that owns the session
    /// (the page API); empty for a bus owner, while the owner is gone, and
    /// from a service older than 1.2.
    public var sessionOwnerOrigin: String = ""
    /// For each feature not in `supportedFeatures`, why, by its wire name:
    /// the message of the `UnsupportedFeature` error a call asking for it
    /// gets (an addition beyond API 1.2); empty from an older service.
    public var unsupportedReasons: [String: String] = [:]
}

/// A signal of the service, in the order the service sent it.
public enum GuidedAccessEvent: Sendable, Hashable {
    /// `SessionChanged`. The reason is the wire text, so that a reason a newer
    /// service sends reaches the app (and `guidedaccessctl monitor`) as sent;
    /// `sessionChangeReason` gives the known ones as `SessionChangeReason`.
    case session(active: Bool, reason: String)
    /// `RestrictionChanged`.
    case restriction(identifier: String, state: RestrictionState)

    /// The reason of a `.session` event when this library knows it; nil for
    /// a reason it does not know and for `.restriction`.
    public var sessionChangeReason: SessionChangeReason? {
        guard case .session(_, let reason) = self else { return nil }
        return SessionChangeReason(rawValue: reason)
    }
}

/// Supplies custom restrictions, like `UIGuidedAccessRestrictionDelegate`.
public protocol GuidedAccessRestrictionProvider: Sendable {
    /// The identifiers of the restrictions, reverse-DNS by convention.
    var identifiers: [String] { get }
    /// The short text the operator sees (1 to `RestrictionRegistration.maxTextBytes` bytes).
    func text(for identifier: String) -> String
    /// Longer text, or nil for none: a registration's `detail`. Named as
    /// `UIGuidedAccessRestrictionDelegate` names it.
    func detailText(for identifier: String) -> String?
    /// Called when the operator changes one of this provider's restrictions
    /// (and when a session ends and a denied one returns to allow).
    func didChange(identifier: String, state: RestrictionState)
}

extension GuidedAccessRestrictionProvider {
    public func detailText(for identifier: String) -> String? { nil }

    /// What RegisterRestrictions takes for this provider's restrictions.
    public var registrations: [RestrictionRegistration] {
        identifiers.map {
            RestrictionRegistration(identifier: $0, text: text(for: $0), detail: detailText(for: $0) ?? "")
        }
    }
}
