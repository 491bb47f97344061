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
public struct BusCaller: Hashable, Sendable {
    public var uniqueName: String
    public var identity: CallerIdentity

    public init(uniqueName: String, identity: CallerIdentity) {
        self.uniqueName = uniqueName
        self.identity = identity
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

/// An active session: who owns it, what it turned on, and what to put back.
///
/// A value type: the service keeps one in its state, journals it before each
/// settings write, and replaces it when a change has succeeded.
public struct Session: Hashable, Sendable {
    /// The owner's unique bus name; nil while the owner is gone.
    public var owner: String?
    public var ownerIdentity: OwnerIdentity
    public var features: Set<Feature>
    public var zoomFactor: Double
    public var textScale: Double
    public var inhibitSleep: Bool
    /// End of the time limit in microseconds since the Unix epoch; 0 = none.
    public var deadlineUsec: UInt64
    /// For each key the session wrote, its value before the session.
    public var snapshot: [SettingKey: StoredValue]
    /// The programs the service runs for this session's features (the
    /// screen reader, an on-screen keyboard): a restarted service adopts
    /// them, or stops them when the session is over.
    public var programs: [Feature: ProgramRecord]
    /// Its end is under way (journaled before the keys are put back): a
    /// restart finishes the end rather than resume the session.
    public var isEnding: Bool

    /// A session about to start. Its features are already the requested
    /// ones: the handler writes `keyMap.change(from: [], to: features)`.
    public init(owner: BusCaller, options: SessionParameters, nowUsec: UInt64) {
        self.init(
            owner: owner.uniqueName, ownerIdentity: owner.identity.ownerIdentity, features: options.features,
            zoomFactor: options.zoomFactor, textScale: options.textScale, inhibitSleep: options.inhibitSleep,
            deadlineUsec: Self.deadline(nowUsec: nowUsec, timeLimitSec: options.timeLimitSec), snapshot: [:])
    }

    /// Every field, as the journal stores them.
    public init(
        owner: String?, ownerIdentity: OwnerIdentity, features: Set<Feature>, zoomFactor: Double,
        textScale: Double, inhibitSleep: Bool, deadlineUsec: UInt64, snapshot: [SettingKey: StoredValue],
        programs: [Feature: ProgramRecord] = [:], isEnding: Bool = false
    ) {
        self.isEnding = isEnding
        self.owner = owner
        self.ownerIdentity = ownerIdentity
        self.features = features
        self.zoomFactor = zoomFactor
        self.textScale = textScale
        self.inhibitSleep = inhibitSleep
        self.deadlineUsec = deadlineUsec
        self.snapshot = snapshot
        self.programs = programs
    }

    public var keyMapOptions: FeatureKeyMap.Options {
        FeatureKeyMap.Options(zoomFactor: zoomFactor, textScale: textScale)
    }

    /// `SessionOwner`: "" while the owner is gone.
    public var ownerProperty: String { owner ?? "" }

    /// The deadline for a time limit; 0 (none) for a limit of 0.
    public static func deadline(nowUsec: UInt64, timeLimitSec: UInt64) -> UInt64 {
        timeLimitSec == 0 ? 0 : nowUsec + timeLimitSec * 1_000_000
    }

    public func isExpired(nowUsec: UInt64) -> Bool {
        deadlineUsec != 0 && nowUsec >= deadlineUsec
    }

    // MARK: Ownership

    public func role(of caller: BusCaller) -> SessionRole {
        if let owner { return owner == caller.uniqueName ? .owner : .other }
        return ownerIdentity.matches(caller.identity) ? .successor : .other
    }

    /// The owner's connection left the bus. Returns whether that changed
    /// anything (`SessionOwner` changes only then).
    @discardableResult
    public mutating func connectionLeft(_ uniqueName: String) -> Bool {
        guard owner == uniqueName else { return false }
        owner = nil
        return true
    }

    public mutating func takeOver(by caller: BusCaller) {
        owner = caller.uniqueName
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
                    throw .invalidArgs("resuming the session of \(session.ownerIdentity) takes no options")
                }
                return .takeOver
            case .owner:
                throw .sessionBusy("the caller \(caller.uniqueName) already owns the active session")
            case .other:
                throw .sessionBusy("a session owned by \(session.owner ?? "a departed \(session.ownerIdentity)") is active")
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

    // MARK: Settings bookkeeping

    /// Records, for each key not yet in the snapshot, its value now. Call it
    /// before writing `keys`, and journal the result before the write, so a
    /// crash in between still knows what to put back.
    public mutating func recordSnapshot(
        of keys: some Sequence<SettingKey>,
        currentValue: (SettingKey) throws(SettingsBackendError) -> SettingValue?
    ) throws(SettingsBackendError) {
        for key in keys where snapshot[key] == nil {
            snapshot[key] = StoredValue(try currentValue(key))
        }
    }

    /// The backend changes that realise `change`: new values, and the keys no
    /// longer required put back to their snapshot. A key with no snapshot was
    /// never written by the session and is left alone.
    public func settingChanges(for change: KeyMapChange) -> [SettingKey: SettingValue?] {
        var changes: [SettingKey: SettingValue?] = change.write.mapValues { $0 }
        for key in change.restore {
            if let stored = snapshot[key] { changes[key] = .some(stored.settingValue) }
        }
        return changes
    }

    /// After a successful write of `change`: the restored keys are the
    /// user's again, so the end of the session will not touch them.
    public mutating func forgetSnapshot(of keys: some Sequence<SettingKey>) {
        for key in keys { snapshot[key] = nil }
    }

    /// The backend changes that end the session: every written key back to
    /// its state before the session.
    public var restoringChanges: [SettingKey: SettingValue?] {
        snapshot.mapValues { $0.settingValue }
    }
}
