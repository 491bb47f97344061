/// A settings key as GSettings names it: a schema id and a key in it.
public struct SettingKey: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let schema: String
    public let key: String
    /// Worked out once: keys are looked up in dictionaries many times a call.
    private let fingerprint: UInt64

    public init(schema: String, key: String) {
        self.schema = schema
        self.key = key
        // FNV-1a over both names, a NUL between them.
        var value: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in schema.utf8 { value = (value ^ UInt64(byte)) &* 0x100_0000_01b3 }
        value = value &* 0x100_0000_01b3
        for byte in key.utf8 { value = (value ^ UInt64(byte)) &* 0x100_0000_01b3 }
        fingerprint = value
    }

    public static func == (a: SettingKey, b: SettingKey) -> Bool {
        a.fingerprint == b.fingerprint && a.schema == b.schema && a.key == b.key
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(fingerprint)
    }

    /// The dconf path of the key, for schemas without a path of their own
    /// ("org.gnome.desktop.a11y.magnifier" · "mag-factor" →
    /// "/org/gnome/desktop/a11y/magnifier/mag-factor").
    public var dconfPath: String {
        "/" + schema.split(separator: ".").joined(separator: "/") + "/" + key
    }

    /// The keyfile group dconf's system databases use for this key's directory
    /// ("org/gnome/desktop/a11y/magnifier").
    public var dconfGroup: String {
        schema.split(separator: ".").joined(separator: "/")
    }

    public var description: String { "\(schema) \(key)" }

    public static func < (a: SettingKey, b: SettingKey) -> Bool {
        (a.schema, a.key) < (b.schema, b.key)
    }
}

/// A value of one of the types the mapped keys have. Enum-typed keys
/// (e.g. `screen-position`) take their nick as a string.
public enum SettingValue: Hashable, Sendable, CustomStringConvertible {
    case bool(Bool)
    case double(Double)
    case string(String)

    /// The value in GVariant text form, as `gsettings get` prints it and as
    /// dconf keyfiles take it: `true`, `2.0`, `'full-screen'`.
    public var gvariantText: String {
        switch self {
        case .bool(let b): return b ? "true" : "false"
        case .double(let d):
            let text = String(d)
            return text.contains(".") || text.contains("e") || text.contains("n") ? text : text + ".0"
        case .string(let s):
            var escaped = ""
            for c in s {
                if c == "'" || c == "\\" { escaped.append("\\") }
                escaped.append(c)
            }
            return "'" + escaped + "'"
        }
    }

    public var description: String { gvariantText }
}

/// Why a backend cannot realise a key.
public enum SettingAvailability: Hashable, Sendable {
    case available
    case missingSchema
    case missingKey
    case wrongType(expected: String)
}

/// The errors every backend reports. `message` names the key and the value.
public struct SettingsBackendError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Kind: Hashable, Sendable {
        /// The schema or key does not exist on this system, or has another type.
        case unsupported
        /// The value is outside the key's range or choices.
        case outOfRange
        /// Writing or syncing failed; nothing changed.
        case writeFailed
        /// The store did not answer in time: the change may have been made,
        /// or may still be made (a stalled dconf-service writes once it
        /// runs again).
        case outcomeUnknown
    }
    public let kind: Kind
    public let message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { message }
}

/// One place where the mapped keys live. Implementations: GSettings (user
/// mode), dconf system databases with locks (system mode), memory (tests).
///
/// Calls come from one serial executor; implementations need no locking of
/// their own but must not block for long: a store in another process is
/// waited for asynchronously (`apply`), with a timeout.
public protocol SettingsBackend: AnyObject {
    /// The name reported in the `Backend` property (`gsettings`, `dconf`, `memory`).
    var name: String { get }

    /// True for a backend that stands for a whole kiosk by itself (memory,
    /// for tests and benchmarks): every feature whose keys it has counts as
    /// delivered, whatever the desktop.
    var realisesEveryFeature: Bool { get }

    /// Whether the key exists on this system with the expected value type.
    func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability

    /// Checks every change against its key's schema (the key exists with
    /// the value's type, the value is in its range or choices) without
    /// writing anything. Throws `.unsupported` or `.outOfRange` naming the
    /// key and the value. What it returns is what `apply` writes.
    func check(_ changes: [SettingKey: SettingValue?]) throws(SettingsBackendError) -> CheckedChange

    /// The value the user (or the session) set, or nil when the key is unset
    /// and its default applies — `g_settings_get_user_value`.
    func userValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue?

    /// Applies a change this backend checked, all of it together: a value to
    /// set, or nil to reset the key to unset. Returns when the change is
    /// durable (synced). Throws `.writeFailed` (nothing changed) when the
    /// store refuses it (a locked key, a failed write), `.outcomeUnknown`
    /// when it did not answer in time. Runs on the caller's executor, which
    /// it leaves free for other work while it waits for another process.
    nonisolated(nonsending) func apply(_ change: CheckedChange) async throws(SettingsBackendError)

    /// Called at start-up when the journal holds no session (none, or a
    /// corrupt journal kept aside): whatever the backend still applies for a
    /// session that no journal can end goes. Returns the keys it let go of;
    /// the default (user settings, which keep no record of their own) does
    /// nothing.
    func startedWithoutSession() throws(SettingsBackendError) -> [SettingKey]
}

extension SettingsBackend {
    public var realisesEveryFeature: Bool { false }

    /// Checks, then applies.
    nonisolated(nonsending) public func apply(_ changes: [SettingKey: SettingValue?]) async throws(SettingsBackendError) {
        try await apply(try check(changes))
    }

    public func startedWithoutSession() throws(SettingsBackendError) -> [SettingKey] { [] }
}

/// Settings changes a backend has checked (`SettingsBackend.check`), carried
/// as they are to its `apply`: what was validated is what is written. Only
/// the package's backends make one.
public struct CheckedChange: Hashable, Sendable {
    public struct Entry: Hashable, Sendable {
        public let key: SettingKey
        /// nil resets the key.
        public let value: SettingValue?
    }

    /// Sorted by key.
    public let entries: [Entry]

    package init(_ changes: [SettingKey: SettingValue?]) {
        entries = changes.sorted { $0.key < $1.key }.map { Entry(key: $0.key, value: $0.value) }
    }

    public var isEmpty: Bool { entries.isEmpty }
    public var keys: [SettingKey] { entries.map(\.key) }

    /// `schema key value, …` (`reset` for a key going back to unset), for messages.
    public var summary: String {
        entries.map { "\($0.key) \($0.value.map { "\($0)" } ?? "reset")" }.joined(separator: ", ")
    }
}
