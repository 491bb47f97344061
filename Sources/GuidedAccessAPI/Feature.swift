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
    public static func < (a: Feature, b: Feature) -> Bool { a.order < b.order }

    /// Hashed by its place in that order, not by its name: sets of features
    /// are made and compared on every call.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(order)
    }

    /// The place of its wire name among all, sorted as strings.
    var order: Int {
        switch self {
        case .grayscale: return 0
        case .highContrast: return 1
        case .invertColors: return 2
        case .largeText: return 3
        case .onScreenKeyboard: return 4
        case .reduceMotion: return 5
        case .screenReader: return 6
        case .zoom: return 7
        }
    }
}

extension Sequence where Element == Feature {
    /// The wire names, sorted: the form of `EnabledFeatures` and `SupportedFeatures`.
    public var sortedWireNames: [String] { sorted().map { $0.wireName } }
}

extension Set where Element == Feature {
    /// The wire names, sorted: the form of `EnabledFeatures` and
    /// `SupportedFeatures`. Looked up, not sorted: every announcement and
    /// audit record of a call lists features.
    public var sortedWireNames: [String] {
        var mask = 0
        for feature in self { mask |= 1 << feature.order }
        return Feature.sortedWireNames[mask]
    }
}

extension Feature {
    /// For each set of features, by the bits of their `order`, their wire names sorted.
    fileprivate static let sortedWireNames: [[String]] = (0..<(1 << allCases.count)).map { mask in
        allCases.sorted().filter { mask & (1 << $0.order) != 0 }.map(\.wireName)
    }
}
