/// An option value as the D-Bus layer decoded it from `a{sv}`; anything of
/// another type keeps only its signature, for the error message.
public enum OptionValue: Hashable, Sendable, CustomStringConvertible {
    case uint64(UInt64)
    case double(Double)
    case bool(Bool)
    case stringArray([String])
    case other(signature: String)

    public var signature: String {
        switch self {
        case .uint64: return "t"
        case .double: return "d"
        case .bool: return "b"
        case .stringArray: return "as"
        case .other(let signature): return signature
        }
    }

    public var description: String {
        switch self {
        case .uint64(let v): return String(v)
        case .double(let v): return String(v)
        case .bool(let v): return String(v)
        case .stringArray(let v): return "[" + v.map { "'\($0)'" }.joined(separator: ", ") + "]"
        case .other(let signature): return "a value of type '\(signature)'"
        }
    }
}

/// The `[Session]` defaults of the configuration.
public struct SessionDefaults: Hashable, Sendable {
    public var timeLimitSec: UInt64
    public var inhibitSleep: Bool
    public var zoomFactor: Double
    public var textScale: Double

    public init(timeLimitSec: UInt64 = 0, inhibitSleep: Bool = true, zoomFactor: Double = 2.0, textScale: Double = 1.5) {
        self.timeLimitSec = timeLimitSec
        self.inhibitSleep = inhibitSleep
        self.zoomFactor = zoomFactor
        self.textScale = textScale
    }
}

/// The options of StartSession, validated, with defaults filled in.
public struct SessionParameters: Hashable, Sendable {
    public var timeLimitSec: UInt64
    public var features: Set<Feature>
    public var zoomFactor: Double
    public var textScale: Double
    public var inhibitSleep: Bool

    public init(timeLimitSec: UInt64, features: Set<Feature>, zoomFactor: Double, textScale: Double, inhibitSleep: Bool) {
        self.timeLimitSec = timeLimitSec
        self.features = features
        self.zoomFactor = zoomFactor
        self.textScale = textScale
        self.inhibitSleep = inhibitSleep
    }

    /// Validates `options`. Every InvalidArgs (unknown key, wrong type, out of
    /// range; keys in name order) comes before UnknownFeature, matching the
    /// API's error order; UnsupportedFeature is the caller's next check
    /// (the service's), as only it knows what the kiosk delivers.
    public init(parsing options: [String: OptionValue], defaults: SessionDefaults) throws(GuidedAccessError) {
        timeLimitSec = defaults.timeLimitSec
        features = []
        zoomFactor = defaults.zoomFactor
        textScale = defaults.textScale
        inhibitSleep = defaults.inhibitSleep
        var featureNames: [String] = []

        for (name, value) in options.sorted(by: { $0.key < $1.key }) {
            guard let key = SessionOptionKey(rawValue: name) else {
                throw .invalidArgs("unknown option '\(name)' (value \(value))")
            }
            switch (key, value) {
            case (.timeLimit, .uint64(let seconds)):
                guard seconds <= SessionLimits.maxTimeLimitSec else {
                    throw .invalidArgs("time-limit \(seconds) is out of range 0…\(SessionLimits.maxTimeLimitSec)")
                }
                timeLimitSec = seconds
            case (.features, .stringArray(let names)):
                featureNames = names
            case (.zoomFactor, .double(let factor)):
                zoomFactor = try Self.checked(factor, key: key, range: SessionLimits.zoomFactor)
            case (.textScale, .double(let scale)):
                textScale = try Self.checked(scale, key: key, range: SessionLimits.textScale)
            case (.inhibitSleep, .bool(let inhibit)):
                inhibitSleep = inhibit
            default:
                // A value of a type the D-Bus layer does not decode is named by its type alone.
                let shown = if case .other = value { name } else { "\(name) \(value)" }
                throw .invalidArgs("\(shown) has type '\(value.signature)', expected '\(key.signature)'")
            }
        }
        features = try Feature.parse(featureNames)
    }

    private static func checked(
        _ value: Double, key: SessionOptionKey, range: ClosedRange<Double>
    ) throws(GuidedAccessError) -> Double {
        // NaN is in no range, so it fails here too.
        guard range.contains(value) else {
            throw .invalidArgs("\(key) \(value) is out of range \(range.lowerBound)…\(range.upperBound)")
        }
        return value
    }
}
