import GuidedAccessAPI

/// `guidedaccessctl doctor`: what this kiosk will deliver, feature by
/// feature, and why not where not. The findings are gathered by the ctl
/// (the service's properties, the files and programs it looks at); what
/// they add up to — the verdict, the exit status, the text and the JSON —
/// is worked out here, from them alone.

/// One finding of the ctl's own: `orca`, `display`, `unit`…
public struct DoctorCheck: Hashable, Sendable, Encodable {
    public var name: String
    public var ok: Bool
    public var detail: String

    public init(_ name: String, ok: Bool, _ detail: String) {
        self.name = name
        self.ok = ok
        self.detail = detail
    }
}

/// What the service says about this kiosk: its properties.
public struct DoctorService: Hashable, Sendable {
    public var desktop: String
    public var supportedFeatures: [String]
    /// `UnsupportedReasons`: for each feature not supported, the message of
    /// its `UnsupportedFeature` error (empty from a service without it).
    public var unsupportedReasons: [String: String]
    public var agent: String
    public var backend: String
    public var version: String

    public init(
        desktop: String, supportedFeatures: [String], unsupportedReasons: [String: String], agent: String,
        backend: String, version: String
    ) {
        self.desktop = desktop
        self.supportedFeatures = supportedFeatures
        self.unsupportedReasons = unsupportedReasons
        self.agent = agent
        self.backend = backend
        self.version = version
    }
}

/// How the doctor's run ends: the ctl's exit codes for these (its table:
/// 0, 6 unsupported feature, 10 no service).
public enum DoctorOutcome: Hashable, Sendable {
    /// Every required feature is supported.
    case ok
    /// The service answered; some required feature is not supported.
    case unsupported
    /// No bus, or no service on it: nothing is known to be delivered.
    case serviceUnavailable
}

public struct DoctorReport: Sendable {
    /// What the doctor requires when not told (`--feature`): what a kiosk
    /// for the public is expected to offer.
    public static let defaultRequired: [Feature] = [.screenReader, .zoom, .invertColors, .grayscale]

    /// `user` or `system`.
    public var mode: String
    /// The bus, as the ctl names it (`session bus`, `system bus`, an address).
    public var bus: String
    /// nil: the service did not answer (`serviceError` says why).
    public var service: DoctorService?
    public var serviceError: String
    public var checks: [DoctorCheck]
    /// The features that must be supported for `ok`, in the order given.
    public var required: [Feature]

    public init(
        mode: String, bus: String, service: DoctorService?, serviceError: String = "", checks: [DoctorCheck],
        required: [Feature]
    ) {
        self.mode = mode
        self.bus = bus
        self.service = service
        self.serviceError = serviceError
        self.checks = checks
        var seen: Set<Feature> = []
        self.required = (required.isEmpty ? Self.defaultRequired : required).filter { seen.insert($0).inserted }
    }

    /// Whether the service supports `feature`, and if not, why: the
    /// service's reason (`UnsupportedReasons`) as it gives it.
    public func verdict(_ feature: Feature) -> (supported: Bool, reason: String?) {
        guard let service else {
            return (false, "\(feature.wireName): no service answered on the \(bus)")
        }
        if service.supportedFeatures.contains(feature.wireName) { return (true, nil) }
        return (false, service.unsupportedReasons[feature.wireName] ?? "\(feature.wireName): not supported here (the service gives no reason)")
    }

    /// The required features not supported, in `required`'s order.
    public var missing: [Feature] { required.filter { !verdict($0).supported } }

    public var outcome: DoctorOutcome {
        if service == nil { return .serviceUnavailable }
        return missing.isEmpty ? .ok : .unsupported
    }

    public var desktop: String { service?.desktop ?? "" }

    /// A reason without the feature's name in front, which the line already shows.
    static func shortReason(_ reason: String, of feature: Feature) -> String {
        let prefix = feature.wireName + ": "
        return reason.hasPrefix(prefix) ? String(reason.dropFirst(prefix.count)) : reason
    }

    /// The text report: a line per feature (`yes`, or `no: REASON`), a line
    /// per check (`ok` or `no`, and what was found), and a last line naming
    /// the required features missing.
    public var text: String {
        var lines: [String] = []
        let width = Feature.allCases.map(\.wireName.count).max()! + 2
        for feature in Feature.allCases {
            let (supported, reason) = verdict(feature)
            let mark = required.contains(feature) ? "*" : " "
            let verdict = supported ? "yes" : "no: " + Self.shortReason(reason ?? "", of: feature)
            lines.append(mark + " " + (feature.wireName + ":").padded(to: width) + verdict)
        }
        lines.append("")
        let checkWidth = max(width, (checks.map(\.name.count).max() ?? 0) + 2)
        for check in checks {
            lines.append("  " + (check.name + ":").padded(to: checkWidth) + (check.ok ? "ok" : "no") + "  " + check.detail)
        }
        lines.append("")
        let requiredNames = required.map(\.wireName).joined(separator: ", ")
        switch outcome {
        case .ok:
            lines.append("Missing: nothing; every required feature (*) is delivered: \(requiredNames)")
        case .unsupported:
            lines.append(
                "Missing: \(missing.map(\.wireName).joined(separator: ", ")) (required, *: \(requiredNames))")
        case .serviceUnavailable:
            lines.append(
                "Missing: \(missing.map(\.wireName).joined(separator: ", ")) — no service answered on the \(bus), "
                    + "so nothing is delivered (required, *: \(requiredNames))")
        }
        return lines.joined(separator: "\n")
    }

    /// The JSON report's object.
    public var json: DoctorJSON {
        var features: [String: DoctorJSON.FeatureVerdict] = [:]
        for feature in Feature.allCases {
            let (supported, reason) = verdict(feature)
            features[feature.wireName] = .init(supported: supported, reason: reason)
        }
        return DoctorJSON(
            desktop: desktop, mode: mode, bus: bus, serviceReachable: service != nil, serviceError: serviceError,
            backend: service?.backend ?? "", version: service?.version ?? "", agent: service?.agent ?? "",
            features: features, checks: checks, required: required.map(\.wireName),
            missing: missing.map(\.wireName), ok: outcome == .ok)
    }
}

/// `guidedaccessctl doctor --json`.
public struct DoctorJSON: Encodable, Sendable {
    public struct FeatureVerdict: Encodable, Sendable {
        public var supported: Bool
        /// The service's reason (`UnsupportedReasons`); null when supported.
        public var reason: String?

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(supported, forKey: .supported)
            try container.encode(reason, forKey: .reason)
        }

        enum CodingKeys: String, CodingKey { case supported, reason }
    }

    public var desktop: String
    public var mode: String
    public var bus: String
    public var serviceReachable: Bool
    public var serviceError: String
    public var backend: String
    public var version: String
    public var agent: String
    public var features: [String: FeatureVerdict]
    public var checks: [DoctorCheck]
    public var required: [String]
    public var missing: [String]
    public var ok: Bool
}

// MARK: - Checks from what was read

extension DoctorCheck {
    /// System mode: whether the dconf profile every user without one of
    /// their own reads (`/etc/dconf/profile/user`) lists the service's
    /// database. `text` nil: the file cannot be read (or is not there).
    public static func dconfProfile(path: String, text: String?, database: String = "guidedaccess") -> DoctorCheck {
        let line = "system-db:" + database
        guard let text else {
            return DoctorCheck(
                "dconf-profile", ok: false,
                "\(path) does not exist: the kiosk user's session sees none of the session's settings; "
                    + "run guidedaccess-dconf-profile once")
        }
        let lines = text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: " \t") }
        if lines.contains(line) { return DoctorCheck("dconf-profile", ok: true, "\(path) lists \(line)") }
        return DoctorCheck(
            "dconf-profile", ok: false,
            "\(path) does not list \(line): sessions would change nothing on the screen; "
                + "run guidedaccess-dconf-profile once")
    }

    /// The service's systemd unit, from `systemctl is-enabled UNIT` and
    /// `systemctl is-active UNIT`: each the first line of its output, or nil
    /// when systemctl could not be run (not installed, no manager).
    public static func unit(
        _ unit: String, scope: String, enabled: String?, active: String?, failure: String? = nil
    ) -> DoctorCheck {
        let name = "unit"
        guard let enabled, let active, !enabled.isEmpty || !active.isEmpty else {
            return DoctorCheck(name, ok: false, "\(unit) (\(scope)): \(failure ?? "systemd gave no answer")")
        }
        let state = "\(unit) (\(scope)): \(enabled.isEmpty ? "?" : enabled), \(active.isEmpty ? "?" : active)"
        // A D-Bus-activated service need not be enabled; one running is fine.
        if active == "active" { return DoctorCheck(name, ok: true, state) }
        if ["enabled", "static", "alias", "indirect", "generated", "enabled-runtime"].contains(enabled) {
            return DoctorCheck(name, ok: true, state + " (started when first called, through D-Bus activation)")
        }
        return DoctorCheck(name, ok: false, state)
    }
}

extension Substring {
    fileprivate func trimmingCharacters(in set: String) -> String {
        var s = self
        while let first = s.first, set.contains(first) { s = s.dropFirst() }
        while let last = s.last, set.contains(last) { s = s.dropLast() }
        return String(s)
    }
}

extension String {
    /// Followed by spaces up to `width` characters (never cut).
    fileprivate func padded(to width: Int) -> String {
        self + String(repeating: " ", count: max(0, width - count))
    }
}
