/// Settings kept in the process only: for tests and benchmarks (`Backend=memory`).
///
/// It knows a configurable set of keys with their types and ranges, so tests
/// can model a system that lacks a key (GNOME 43 has no `reduced-motion`),
/// and it can be told to fail the next `apply`.
public final class MemorySettingsBackend: SettingsBackend {
    /// A key's type as its schema declares it.
    public enum KeyType: Hashable, Sendable {
        case bool
        case double(ClosedRange<Double>)
        case choice([String])

        func accepts(_ value: SettingValue) -> Bool {
            switch (self, value) {
            case (.bool, .bool), (.double, .double), (.choice, .string): return true
            default: return false
            }
        }

        var name: String {
            switch self {
            case .bool: return "b"
            case .double: return "d"
            case .choice: return "enum"
            }
        }
    }

    /// The mapped keys of GNOME 43 (Debian 12), with the schemas' ranges.
    public static let gnome43Keys: [SettingKey: KeyType] = [
        .screenReaderEnabled: .bool,
        .screenMagnifierEnabled: .bool,
        .screenKeyboardEnabled: .bool,
        .magFactor: .double(0.1...32.0),
        .screenPosition: .choice(["none", "full-screen", "top-half", "bottom-half", "left-half", "right-half"]),
        .invertLightness: .bool,
        .colorSaturation: .double(0.0...1.0),
        .highContrast: .bool,
        .textScalingFactor: .double(0.5...3.0),
        .enableAnimations: .bool,
    ]

    /// GNOME 50 and later: the GNOME 43 keys plus `reduced-motion`.
    public static let gnome50Keys: [SettingKey: KeyType] =
        gnome43Keys.merging([.reducedMotion: .choice(["no-preference", "reduce"])]) { old, _ in old }

    public let name = "memory"
    public var realisesEveryFeature: Bool { true }
    public let knownKeys: [SettingKey: KeyType]
    /// The user values; a key not in it is unset.
    public private(set) var values: [SettingKey: SettingValue]
    /// How many `apply` calls succeeded, for tests that check nothing was written.
    public private(set) var appliedCount = 0
    private var applyFailures: [(error: SettingsBackendError, appliedAnyway: Bool)] = []

    public init(knownKeys: [SettingKey: KeyType] = MemorySettingsBackend.gnome43Keys, values: [SettingKey: SettingValue] = [:]) {
        self.knownKeys = knownKeys
        self.values = values
    }

    /// Makes the next `apply` not failed yet throw `error` and change
    /// nothing — or, with `appliedAnyway`, make the change and throw (a
    /// store that answered too late: `.outcomeUnknown`).
    public func failNextApply(
        with error: SettingsBackendError = SettingsBackendError(.writeFailed, "injected failure"), appliedAnyway: Bool = false
    ) {
        applyFailures.append((error, appliedAnyway))
    }

    public func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
        guard let type = knownKeys[key] else {
            return knownKeys.keys.contains { $0.schema == key.schema } ? .missingKey : .missingSchema
        }
        return type.accepts(value) ? .available : .wrongType(expected: type.name)
    }

    public func check(_ changes: [SettingKey: SettingValue?]) throws(SettingsBackendError) -> CheckedChange {
        for (key, value) in changes.sorted(by: { $0.key < $1.key }) {
            if let value { try validate(value, for: key) } else if knownKeys[key] == nil {
                throw SettingsBackendError(.unsupported, "no key \(key) on this system")
            }
        }
        return CheckedChange(changes)
    }

    private func validate(_ value: SettingValue, for key: SettingKey) throws(SettingsBackendError) {
        guard let type = knownKeys[key] else { throw SettingsBackendError(.unsupported, "no key \(key) on this system") }
        switch (type, value) {
        case (.bool, .bool): return
        case (.double(let range), .double(let d)):
            guard range.contains(d) else {
                throw SettingsBackendError(.outOfRange, "\(key) \(value) is out of range \(range.lowerBound)…\(range.upperBound)")
            }
        case (.choice(let choices), .string(let s)):
            guard choices.contains(s) else {
                throw SettingsBackendError(.outOfRange, "\(key) \(value) is not one of \(choices.joined(separator: ", "))")
            }
        default:
            throw SettingsBackendError(.unsupported, "\(key) has type \(type.name), not the type of \(value)")
        }
    }

    public func userValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue? {
        guard knownKeys[key] != nil else { throw SettingsBackendError(.unsupported, "no key \(key) on this system") }
        return values[key]
    }

    nonisolated(nonsending) public func apply(_ change: CheckedChange) async throws(SettingsBackendError) {
        let failure = applyFailures.isEmpty ? nil : applyFailures.removeFirst()
        if let failure, !failure.appliedAnyway { throw failure.error }
        for entry in change.entries { values[entry.key] = entry.value }
        appliedCount += 1
        if let failure { throw failure.error }
    }
}
