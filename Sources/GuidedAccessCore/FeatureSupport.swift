/// What the drivers together deliver now: `SupportedFeatures`, the reason
/// for each feature left out, `Desktop`, and which features each driver is
/// to leave to another. A pure function of the drivers' capabilities, in
/// the list's order.
///
/// A feature is supported when no driver finds it impossible and some
/// driver delivers it. The reason for one that is not: the impossibility;
/// else what keeps the drivers that would deliver it from doing so (`orca
/// is not installed`); else why none acts on it, all of them (`the desktop
/// 'sway' does not act on it, and no browser is connected at …`).
package struct FeatureSupport: Hashable, Sendable {
    package var supported: Set<Feature>
    /// For each feature not supported: `feature: why`.
    package var reasons: [Feature: String]
    /// `Desktop`: the first desktop a driver names (`none` if none does),
    /// then each layer as `+name`.
    package var desktop: String
    /// For each driver, by its place in the list: the features some other
    /// driver delivers to the whole screen.
    package var coveredElsewhere: [Set<Feature>]

    package init(capabilities: [[Feature: FeatureCapability]], desktopParts: [DesktopPart?]) {
        var supported: Set<Feature> = []
        var reasons: [Feature: String] = [:]
        var wholeScreen: [Feature: [Int]] = [:]
        for feature in Feature.allCases {
            var impossible: [String] = [], unavailable: [String] = [], notActing: [String] = []
            var delivered = false
            for (index, driver) in capabilities.enumerated() {
                switch driver[feature] {
                case .delivers(let reach)?:
                    delivered = true
                    if reach == .wholeScreen { wholeScreen[feature, default: []].append(index) }
                case .unavailable(let why)?: unavailable.append(why)
                case .notActing(let why)?: notActing.append(why)
                case .impossible(let why)?: impossible.append(why)
                case nil: break
                }
            }
            if let why = impossible.first {
                reasons[feature] = "\(feature): \(why)"
            } else if delivered {
                supported.insert(feature)
            } else if !unavailable.isEmpty {
                reasons[feature] = "\(feature): " + unavailable.joined(separator: "; ")
            } else if !notActing.isEmpty {
                reasons[feature] = "\(feature): " + notActing.joined(separator: ", and ")
            } else {
                reasons[feature] = "\(feature): nothing on this kiosk delivers it"
            }
        }
        self.supported = supported
        self.reasons = reasons
        coveredElsewhere = capabilities.indices.map { index in
            Set(wholeScreen.filter { $0.value.contains { $0 != index } }.keys)
        }
        var desktop: String?
        var layers = ""
        for part in desktopParts {
            switch part {
            case .desktop(let name)?: if desktop == nil { desktop = name }
            case .layer(let name)?: layers += "+" + name
            case nil: break
            }
        }
        self.desktop = (desktop ?? "none") + layers
    }

    /// No driver: nothing supported.
    package static let nothing = FeatureSupport(capabilities: [], desktopParts: [])

    /// `UnsupportedFeature` for the first (sorted) feature not supported, with its reason.
    package func require(_ features: Set<Feature>) throws(GuidedAccessError) {
        guard let missing = features.subtracting(supported).min() else { return }
        throw .unsupportedFeature(reasons[missing] ?? "\(missing): not supported here")
    }
}
