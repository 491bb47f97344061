import DBus
import GuidedAccessCore
import GuidedAccessWire

/// What a call may carry in each list argument of the interface, from the
/// API's own limits: the dispatcher holds calls to these before it decodes
/// them (see `ArgumentBounds`), and every bound admits all the API allows —
/// what it refuses, the handler would have refused with the same error.
extension ArgumentBounds {
    /// StartSession's options: each key at most once, and within them at
    /// most 64 values (the largest valid options hold 24: the dictionary,
    /// five entries of key, variant and value, a feature list of 8 names).
    static let sessionOptions = ArgumentBounds(elements: SessionOptionKey.allCases.count, values: 64)

    /// ConfigureForSession's features: each at most once (`Feature.parse`).
    static let features = ArgumentBounds(elements: Feature.allCases.count)

    /// RegisterRestrictions' batch: no more than may exist (LimitExceeded, as
    /// the registry answers), no field longer than a detail may be.
    static let restrictionBatch = ArgumentBounds(
        elements: RestrictionRegistry.defaultLimit,
        elementsErrorName: GuidedAccessError.limitExceeded("").dbusErrorName,
        stringBytes: max(
            RestrictionRegistration.maxIdentifierLength, RestrictionRegistration.maxTextBytes,
            RestrictionRegistration.maxDetailBytes))

    /// UnregisterRestrictions' identifiers: each at most once, so no more
    /// than may exist.
    static let restrictionIdentifiers = ArgumentBounds(elements: RestrictionRegistry.defaultLimit)
}

/// The methods' arguments, declared once: for the interface table
/// (`GuidedAccessService.interface()`) and for the fuzz target, which reads
/// calls as the dispatcher does.
public enum MethodArguments {
    public static let options = Argument("options", [String: Variant].self, bounds: .sessionOptions)
    public static let features = Argument("features", [String].self, bounds: .features)
    public static let enabled = Argument("enabled", Bool.self)
    public static let restrictions = Argument("restrictions", [RestrictionRegistration].self, bounds: .restrictionBatch)
    public static let identifiers = Argument("identifiers", [String].self, bounds: .restrictionIdentifiers)
    public static let identifier = Argument("identifier", String.self)
    public static let state = Argument("state", RestrictionState.self)
}
