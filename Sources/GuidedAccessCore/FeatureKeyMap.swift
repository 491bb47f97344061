/// The GNOME keys the features map onto (settings-mapping.md).
extension SettingKey {
    static let a11yApplications = "org.gnome.desktop.a11y.applications"
    static let a11yMagnifier = "org.gnome.desktop.a11y.magnifier"
    static let a11yInterface = "org.gnome.desktop.a11y.interface"
    static let desktopInterface = "org.gnome.desktop.interface"

    public static let screenReaderEnabled = SettingKey(schema: a11yApplications, key: "screen-reader-enabled")
    public static let screenMagnifierEnabled = SettingKey(schema: a11yApplications, key: "screen-magnifier-enabled")
    public static let screenKeyboardEnabled = SettingKey(schema: a11yApplications, key: "screen-keyboard-enabled")
    public static let magFactor = SettingKey(schema: a11yMagnifier, key: "mag-factor")
    public static let screenPosition = SettingKey(schema: a11yMagnifier, key: "screen-position")
    public static let invertLightness = SettingKey(schema: a11yMagnifier, key: "invert-lightness")
    public static let colorSaturation = SettingKey(schema: a11yMagnifier, key: "color-saturation")
    public static let highContrast = SettingKey(schema: a11yInterface, key: "high-contrast")
    /// Exists from GNOME 50 only; `enable-animations` alone carries reduce-motion before.
    public static let reducedMotion = SettingKey(schema: a11yInterface, key: "reduced-motion")
    public static let textScalingFactor = SettingKey(schema: desktopInterface, key: "text-scaling-factor")
    public static let enableAnimations = SettingKey(schema: desktopInterface, key: "enable-animations")
}

/// One key a feature needs, with a value of the key's type so a backend can
/// check the type (`SettingsBackend.availability(of:for:)`).
public struct KeyRequirement: Hashable, Sendable {
    public let key: SettingKey
    public let exampleValue: SettingValue
    /// An optional key is written where it exists; its absence does not make
    /// the feature unsupported.
    public let isOptional: Bool
}

/// What changes between two key maps: keys to write and keys to give back.
public struct KeyMapChange: Hashable, Sendable {
    /// Keys the new map requires whose value differs from the old map's (or
    /// that the old map did not hold), with the value to write.
    public var write: [SettingKey: SettingValue]
    /// Keys the old map held and the new one does not: they go back to the
    /// session's snapshot of them.
    public var restore: Set<SettingKey>

    public var isEmpty: Bool { write.isEmpty && restore.isEmpty }
}

/// The pure function from enabled features (plus the session's zoom factor and
/// text scale) to settings values. The whole map is computed from the whole
/// set because zoom, invert-colors and grayscale share the magnifier.
///
/// A key appears in a map only while some enabled feature *requires* it: the
/// session writes a key when it changes it and gives it back when nothing
/// needs it any more, so keys no feature touches stay as the user left them.
public struct FeatureKeyMap: Hashable, Sendable {
    /// The session parameters that enter values.
    public struct Options: Hashable, Sendable {
        public var zoomFactor: Double
        public var textScale: Double
        public init(zoomFactor: Double, textScale: Double) {
            self.zoomFactor = zoomFactor
            self.textScale = textScale
        }
    }

    /// Optional keys this system lacks (the caller asks its backend); they are
    /// left out of every map.
    public let missingOptionalKeys: Set<SettingKey>

    public init(missingOptionalKeys: Set<SettingKey> = []) {
        self.missingOptionalKeys = missingOptionalKeys
    }

    /// The values of every key `features` requires.
    public func keyValues(for features: Set<Feature>, options: Options) -> [SettingKey: SettingValue] {
        var values: [SettingKey: SettingValue] = [:]
        for feature in features {
            for requirement in Self.requirements(of: feature)
            where !(requirement.isOptional && missingOptionalKeys.contains(requirement.key)) {
                values[requirement.key] = Self.value(of: requirement.key, for: features, options: options)
            }
        }
        return values
    }

    /// The change from the map of `old` to the map of `new`, same options.
    public func change(from old: Set<Feature>, to new: Set<Feature>, options: Options) -> KeyMapChange {
        Self.change(from: keyValues(for: old, options: options), to: keyValues(for: new, options: options))
    }

    /// The change between two computed maps.
    public static func change(
        from old: [SettingKey: SettingValue], to new: [SettingKey: SettingValue]
    ) -> KeyMapChange {
        KeyMapChange(
            write: new.filter { old[$0.key] != $0.value },
            restore: Set(old.keys).subtracting(new.keys))
    }

    /// The keys a feature needs, sorted; for `SupportedFeatures`.
    public static func requirements(of feature: Feature) -> [KeyRequirement] {
        func required(_ key: SettingKey, _ example: SettingValue) -> KeyRequirement {
            KeyRequirement(key: key, exampleValue: example, isOptional: false)
        }
        let magnifier = [
            required(.screenMagnifierEnabled, .bool(true)),
            required(.magFactor, .double(1.0)),
            required(.screenPosition, .string("full-screen")),
        ]
        let keys: [KeyRequirement]
        switch feature {
        case .screenReader: keys = [required(.screenReaderEnabled, .bool(true))]
        case .zoom: keys = magnifier
        case .invertColors: keys = magnifier + [required(.invertLightness, .bool(true))]
        case .grayscale: keys = magnifier + [required(.colorSaturation, .double(0.0))]
        case .highContrast: keys = [required(.highContrast, .bool(true))]
        case .largeText: keys = [required(.textScalingFactor, .double(1.5))]
        case .onScreenKeyboard: keys = [required(.screenKeyboardEnabled, .bool(true))]
        case .reduceMotion:
            keys = [
                required(.enableAnimations, .bool(false)),
                KeyRequirement(key: .reducedMotion, exampleValue: .string("reduce"), isOptional: true),
            ]
        }
        return keys.sorted { $0.key < $1.key }
    }

    /// Every key any feature maps onto, sorted.
    public static var allRequirements: [KeyRequirement] {
        var seen: Set<SettingKey> = []
        return Feature.allCases.flatMap(requirements(of:))
            .filter { seen.insert($0.key).inserted }
            .sorted { $0.key < $1.key }
    }

    /// The features whose required keys all pass `isAvailable`, and the map
    /// that leaves out the optional keys that do not.
    public static func probe(
        _ isAvailable: (KeyRequirement) -> Bool
    ) -> (supported: Set<Feature>, keyMap: FeatureKeyMap) {
        var available: [SettingKey: Bool] = [:]
        for requirement in allRequirements { available[requirement.key] = isAvailable(requirement) }
        let supported = Feature.allCases.filter { feature in
            requirements(of: feature).allSatisfy { $0.isOptional || available[$0.key] == true }
        }
        let missingOptional = allRequirements.filter { $0.isOptional && available[$0.key] != true }.map { $0.key }
        return (Set(supported), FeatureKeyMap(missingOptionalKeys: Set(missingOptional)))
    }

    private static func value(of key: SettingKey, for features: Set<Feature>, options: Options) -> SettingValue {
        switch key {
        case .magFactor:
            // Invert and grayscale keep the magnifier on only for its effects:
            // at 1.0 the whole screen is shown at normal size.
            return .double(features.contains(.zoom) ? options.zoomFactor : 1.0)
        case .screenPosition: return .string("full-screen")
        case .colorSaturation: return .double(0.0)
        case .textScalingFactor: return .double(options.textScale)
        case .enableAnimations: return .bool(false)
        case .reducedMotion: return .string("reduce")
        case .screenReaderEnabled, .screenMagnifierEnabled, .screenKeyboardEnabled,
            .invertLightness, .highContrast:
            return .bool(true)
        default: preconditionFailure("\(key) is in no feature's requirements")
        }
    }
}
