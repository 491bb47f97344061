/// An accessibility feature a session can turn on, named on the wire as in
/// the API's vocabulary.
public enum Feature: String, CaseIterable, Hashable, Sendable, Comparable, CustomStringConvertible {
    case screenReader = "screen-reader"
    case zoom = "zoom"
    case invertColors = "invert-colors"
    case grayscale = "grayscale"
    case highContrast = "high-contrast"
    case largeText = "large-text"
    case onScreenKeyboard = "on-screen-keyboard"
    case reduceMotion = "reduce-motion"

    /// The name used in `features`, `EnabledFeatures` and `SupportedFeatures`.
    public var wireName: String { rawValue }

    public var description: String { rawValue }

    /// Parses a wire name; an unknown one is `UnknownFeature` naming it.
    public init(wireName: String) throws(GuidedAccessError) {
        guard let feature = Feature(rawValue: wireName) else {
            throw .unknownFeature("unknown feature '\(wireName)'")
        }
        self = feature
    }

    /// Parses a list of wire names into a set. The list is checked first
    /// (arguments before names, as the API orders its errors): a name given
    /// twice is InvalidArgs naming it, so that no valid list is longer than
    /// there are features — the bound a caller's list is held to before it
    /// is read. Then the first unknown name, in list order, is the error.
    public static func parse(_ wireNames: [String]) throws(GuidedAccessError) -> Set<Feature> {
        var seen: Set<String> = []
        for name in wireNames where !seen.insert(name).inserted {
            throw .invalidArgs("feature '\(name)' is named twice")
        }
        var features: Set<Feature> = []
        for name in wireNames { features.insert(try Feature(wireName: name)) }
        return features
    }

    /// Wire-name order, so every sorted list the API sends is sorted as strings.
    public static func < (a: Feature, b: Feature) -> Bool { a.rawValue < b.rawValue }
}

extension Sequence where Element == Feature {
    /// The wire names, sorted: the form of `EnabledFeatures` and `SupportedFeatures`.
    public var sortedWireNames: [String] { map { $0.wireName }.sorted() }
}
