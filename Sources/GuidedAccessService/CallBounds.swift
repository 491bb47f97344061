import DBus
import GuidedAccessCore

/// What a call may carry in each list argument of the interface, from the
/// API's own limits: the dispatcher holds calls to these before it decodes
/// them (see `ArgumentBounds`), and every bound admits all the API allows —
/// what it refuses, the handler would have refused with the same error.
/// Public for the fuzzer, which declares the service's arguments again.
extension ArgumentBounds {
    /// StartSession's options: each key at most once, and within them at
    /// most 64 values (the largest valid options hold 24: the dictionary,
    /// five entries of key, variant and value, a feature list of 8 names).
    public static let sessionOptions = ArgumentBounds(elements: SessionOptionKey.allCases.count, values: 64)

    /// ConfigureForSession's features: each at most once (`Feature.parse`).
    public static let features = ArgumentBounds(elements: Feature.allCases.count)

    /// RegisterRestrictions' batch: no more than may exist (LimitExceeded, as
    /// the registry answers), no field longer than a detail may be.
    public static let restrictionBatch = ArgumentBounds(
        elements: RestrictionRegistry.defaultLimit,
        elementsErrorName: GuidedAccessError.limitExceeded("").dbusErrorName,
        stringBytes: max(
            RestrictionRegistration.maxIdentifierLength, RestrictionRegistration.maxTextBytes,
            RestrictionRegistration.maxDetailBytes))

    /// UnregisterRestrictions' identifiers: each at most once, so no more
    /// than may exist.
    public static let restrictionIdentifiers = ArgumentBounds(elements: RestrictionRegistry.defaultLimit)
}
