/// A key's value before the session wrote it.
public enum StoredValue: Hashable, Sendable, CustomStringConvertible {
    /// The key was unset (its default applied); restoring resets it, not
    /// writes the default.
    case unset
    case set(SettingValue)

    public init(_ userValue: SettingValue?) {
        self = userValue.map(StoredValue.set) ?? .unset
    }

    /// The form `SettingsBackend.apply` takes: nil resets the key.
    public var settingValue: SettingValue? {
        switch self {
        case .unset: return nil
        case .set(let value): return value
        }
    }

    public var description: String { settingValue?.description ?? "unset" }
}

/// A caller as the bus names it: its unique name and its credentials.
///
/// (1.2) A page of the kiosk browser calls as its tab: `uniqueName` is
/// the launcher's connection that attached the browser (the service's own
/// for `DevToolsEndpoint`), `identity` the launcher's with the page's
/// origin, `tab` the browser's target id of the tab.
public struct BusCaller: Hashable, Sendable {
    public var uniqueName: String
    public var identity: CallerIdentity
    public var tab: String?

    public init(uniqueName: String, identity: CallerIdentity, tab: String? = nil) {
        self.uniqueName = uniqueName
        self.identity = identity
        self.tab = tab
    }
}

/// What a caller is to the active session.
public enum SessionRole: Hashable, Sendable {
    /// The connection that started or last took over the session.
    case owner
    /// The owner is gone and the caller has its identity: it may take over.
    case successor
    case other
}

/// The session methods whose state and ownership checks `Session.decide` makes.
public enum SessionMethod: Hashable, Sendable {
    /// `hasOptions`: the options dictionary was not empty.
    case startSession(hasOptions: Bool)
    case configureForSession
    case endSession
}

/// What a session method may go on to do.
public enum SessionDecision: Hashable, Sendable {
    /// StartSession with no session active.
    case start
    /// The caller becomes the owner (StartSession answers with
    /// `SessionChanged(true, "resumed")`).
    case takeOver
    /// The caller is the connected owner.
    case asOwner
    /// EndSession by someone who is neither owner nor successor: allowed only
    /// to an operator. The handler checks `AccessPolicy.isOperator` and, if the
    /// lists say no, asks polkit for `end-session` (unless it already did while
    /// admitting the caller); a refusal is NotAuthorized.
    case needsOperator
}

/// An active session: who owns it, what it turned on, and for how long. What
/// the drivers changed for it, and must put back, is theirs (`FeatureDriver.record`).
///
/// A value type: the store keeps one, journals it before each change, and
/// replaces it when a change has succeeded.
public struct Session: Hashable, Sendable {
    /// The owner's unique bus name; nil while the owner is gone.
    public var owner: String?
    /// (1.2) The owning page's tab, when a page owns it (not journaled: a
    /// page's session is ownerless after a restart of the service until a
    /// page of its origin takes it over).
    public var ownerTab: String?
    public var ownerIdentity: OwnerIdentity
    public var features: Set<Feature>
    public var zoomFactor: Double
    public var textScale: Double
    public var inhibitSleep: Bool
    /// End of the time limit in microseconds since the Unix epoch; 0 = none.
    public var deadlineUsec: UInt64
    /// Its end is under way (journaled before the keys are put back): a
    /// restart finishes the end rather than resume the session.
    public var isEnding: Bool

    /// A session about to start, with the requested features.
    public init(owner: BusCaller, options: SessionParameters, nowUsec: UInt64) {
        self.init(
            owner: owner.uniqueName, ownerIdentity: owner.identity.ownerIdentity, features: options.features,
            zoomFactor: options.zoomFactor, textScale: options.textScale, inhibitSleep: options.inhibitSleep,
            deadlineUsec: Self.deadline(nowUsec: nowUsec, timeLimitSec: options.timeLimitSec))
        ownerTab = owner.tab
    }

    /// Every field, as the journal stores them.
    public init(
        owner: String?, ownerIdentity: OwnerIdentity, features: Set<Feature>, zoomFactor: Double,
        textScale: Double, inhibitSleep: Bool, deadlineUsec: UInt64, isEnding: Bool = false
    ) {
        self.isEnding = isEnding
        self.owner = owner
        self.ownerIdentity = ownerIdentity
        self.features = features
        self.zoomFactor = zoomFactor
        self.textScale = textScale
        self.inhibitSleep = inhibitSleep
        self.deadlineUsec = deadlineUsec
    }

    /// What the drivers are to make real for it.
    package var target: DriverTarget {
        DriverTarget(features: features, zoomFactor: zoomFactor, textScale: textScale)
    }

    /// `SessionOwner`: "" while the owner is gone.
    public var ownerProperty: String { owner ?? "" }

    /// (1.2) `SessionOwnerOrigin`: the owning page's origin; "" for a bus
    /// owner and while the owner is gone.
    public var ownerOriginProperty: String { owner == nil ? "" : ownerIdentity.origin ?? "" }

    /// The deadline for a time limit; 0 (none) for a limit of 0.
    public static func deadline(nowUsec: UInt64, timeLimitSec: UInt64) -> UInt64 {
        timeLimitSec == 0 ? 0 : nowUsec + timeLimitSec * 1_000_000
    }

    public func isExpired(nowUsec: UInt64) -> Bool {
        deadlineUsec != 0 && nowUsec >= deadlineUsec
    }

    // MARK: Ownership

    public func role(of caller: BusCaller) -> SessionRole {
        if let owner { return owner == caller.uniqueName && ownerTab == caller.tab ? .owner : .other }
        return ownerIdentity.matches(caller.identity) ? .successor : .other
    }

    /// The owner's connection left the bus. Returns whether that changed
    /// anything (`SessionOwner` changes only then).
    @discardableResult
    public mutating func connectionLeft(_ uniqueName: String) -> Bool {
        guard owner == uniqueName else { return false }
        owner = nil
        ownerTab = nil
        return true
    }

    /// (1.2) The owning page is gone: its tab closed or left the owner's
    /// origin (`tab`), or its browser's attachment ended (`tab` nil: every
    /// tab of the launcher `uniqueName`). Returns whether that changed anything.
    @discardableResult
    public mutating func pageLeft(_ uniqueName: String, tab: String?) -> Bool {
        guard owner == uniqueName, let ownerTab, tab == nil || tab == ownerTab else { return false }
        owner = nil
        self.ownerTab = nil
        return true
    }

    public mutating func takeOver(by caller: BusCaller) {
        owner = caller.uniqueName
        ownerTab = caller.tab
    }

    /// The state and ownership checks of a session method, in the API's
    /// order. Call it after the arguments were checked and the caller was
    /// admitted (see `AccessPolicy.admission(for:session:caller:)`):
    /// NotInSession or SessionBusy first, then ownership (NotAuthorized).
    public static func decide(
        _ method: SessionMethod, session: Session?, caller: BusCaller
    ) throws(GuidedAccessError) -> SessionDecision {
        switch method {
        case .startSession(let hasOptions):
            guard let session else { return .start }
            switch session.role(of: caller) {
            case .successor:
                // Options cannot change a running session: resuming takes it as it is.
                guard !hasOptions else {
                    throw .invalidArgs(
                        "resuming the session of \(session.ownerIdentity) takes no options: call StartSession with none to take it over, then ConfigureForSession")
                }
                return .takeOver
            case .owner:
                throw .sessionBusy(
                    "the caller \(caller.uniqueName) already owns the active session: change its features with ConfigureForSession, or end it with EndSession")
            case .other:
                throw .sessionBusy("a session owned by \(session.owner ?? "a departed \(session.ownerIdentity)") is active; \(Self.wayOut)")
            }
        case .configureForSession, .endSession:
            guard let session else { throw .notInSession("no session is active (caller \(caller.uniqueName))") }
            switch session.role(of: caller) {
            case .owner: return .asOwner
            case .successor: return .takeOver
            case .other:
                if method == .endSession { return .needsOperator }
                throw .notAuthorized(
                    "\(caller.uniqueName) (\(caller.identity.ownerIdentity)) does not own the session of \(session.ownerIdentity)")
            }
        }
    }
}

extension Session {
    /// How a caller that finds another's session active gets its turn, for
    /// `SessionBusy`.
    public static let wayOut =
        "it ends with EndSession by its owner or an operator (guidedaccessctl end), or at its time limit; once its owner has left the bus, a program of the same user and executable takes it over with StartSession and no options"
}
