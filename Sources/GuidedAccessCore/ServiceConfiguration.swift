/// Which bus and whose settings: the service's mode.
public enum ServiceMode: String, Hashable, Sendable {
    /// The kiosk user's session bus; writes the user's own settings.
    case user
    /// The system bus as root; enforces settings through dconf system databases.
    case system
}

/// The settings backends a configuration can name (`[Service] Backend`).
public enum BackendKind: String, Hashable, Sendable, CaseIterable {
    case gsettings, dconf, memory
}

/// A start-up error in the configuration, naming the file, group, key and value.
public struct ConfigurationError: Error, Hashable, Sendable, CustomStringConvertible {
    public var file: String
    public var group: String
    public var key: String
    public var value: String
    public var reason: String

    public init(file: String, group: String, key: String, value: String, reason: String) {
        self.file = file
        self.group = group
        self.key = key
        self.value = value
        self.reason = reason
    }

    public var description: String {
        key.isEmpty
            ? "\(file): [\(group)]: \(reason)"
            : "\(file): [\(group)] \(key)=\(value): \(reason)"
    }
}

/// The configuration file's contents as plain data. Reading the keyfile (and
/// its drop-ins, in order) is the caller's job: it feeds each entry's raw
/// string to `apply(group:key:value:file:)`, which parses and checks it.
///
/// The service's own keys are here (`keys`); a driver module's keys
/// (`[Service] Desktop=`, `[Browser] DevToolsEndpoint=`) are declared by the
/// module, checked here with its check, and kept as written for it
/// (`driverValue`).
public struct ServiceConfiguration: Sendable {
    /// `[Clients]`: who may start sessions and register restrictions.
    public struct ClientLists: Hashable, Sendable {
        public var allowUsers: [String] = []
        public var allowGroups: [String] = []
        public var allowExecutables: [String] = []
        public var allowUnits: [String] = []
        public init() {}
    }

    /// `[Operators]`: who may end anyone's session and set restriction states.
    public struct OperatorLists: Hashable, Sendable {
        public var allowUsers: [String] = []
        public var allowGroups: [String] = []
        public init() {}
    }

    /// `[Dconf]`: where the system-mode backend writes.
    public struct Dconf: Hashable, Sendable {
        public var databaseDir = "/etc/dconf/db"
        public var databaseName = "guidedaccess"
        public var lockOutsideSession = true
        public init() {}
    }

    public var backend: BackendKind
    /// nil when the file has no `[Clients]` group, which in user mode admits
    /// the bus's own user; a present but empty group admits nobody by list.
    public var clients: ClientLists?
    /// nil when the file has no `[Operators]` group (see `clients`).
    public var operators: OperatorLists?
    public var session: SessionDefaults
    public var dconf: Dconf
    /// (1.2) `[Agent] AllowUsers=`: who may register as the session agent
    /// (system mode); nil when not given: the user of logind's active
    /// session on seat0.
    public var agentAllowUsers: [String]?
    /// The keys driver modules own, and the values given for them.
    package let driverKeys: [DriverConfigurationKey]
    private var driverValues: [String: String] = [:]

    /// The configuration with no file: the mode's defaults. `driverKeys`:
    /// the keys of the drivers `guidedaccessd` builds.
    package init(defaultsFor mode: ServiceMode, driverKeys: [DriverConfigurationKey]) {
        backend = mode == .system ? .dconf : .gsettings
        clients = nil
        operators = nil
        session = SessionDefaults()
        dconf = Dconf()
        self.driverKeys = driverKeys
    }

    public init(defaultsFor mode: ServiceMode) {
        self.init(defaultsFor: mode, driverKeys: [])
    }

    /// The value a file gave a driver's key (trimmed), or nil for none.
    package func driverValue(group: String, key: String) -> String? {
        driverValues[group + "\u{0}" + key]
    }

    /// Every key the configuration knows, by group: the service's own, then
    /// the drivers' (`guidedaccessd --print-configuration-keys`).
    package var allKeys: [(group: String, key: String)] {
        Self.keys.map { ($0.group, $0.key) } + driverKeys.map { ($0.group, $0.key) }
    }

    /// Applies one keyfile entry. A group seen with no keys still counts as
    /// present: call `applyGroup(_:file:)` for each group header.
    public mutating func apply(group: String, key: String, value raw: String, file: String) throws(ConfigurationError) {
        try applyGroup(group, file: file)
        let entry = Entry(file: file, group: group, key: key, raw: raw)
        if let own = Self.keys.first(where: { $0.group == group && $0.key == key }) {
            try own.apply(&self, entry)
        } else if let driverKey = driverKeys.first(where: { $0.group == group && $0.key == key }) {
            if let problem = driverKey.check(entry.trimmed) { throw entry.error(problem) }
            driverValues[group + "\u{0}" + key] = entry.trimmed
        } else {
            throw entry.error("unknown key")
        }
    }

    /// Notes a group header; an unknown group is an error.
    public mutating func applyGroup(_ group: String, file: String) throws(ConfigurationError) {
        switch group {
        case "Clients": if clients == nil { clients = ClientLists() }
        case "Operators": if operators == nil { operators = OperatorLists() }
        case _ where Self.keys.contains(where: { $0.group == group }) || driverKeys.contains(where: { $0.group == group }):
            break
        default:
            throw ConfigurationError(file: file, group: group, key: "", value: "", reason: "unknown group")
        }
    }

    /// The service's own keys: each with how its value is read.
    private struct Key: Sendable {
        let group: String
        let key: String
        let apply: @Sendable (inout ServiceConfiguration, Entry) throws(ConfigurationError) -> Void
    }

    private static let keys: [Key] = [
        Key(group: "Service", key: "Backend") { c, entry throws(ConfigurationError) in
            guard let kind = BackendKind(rawValue: entry.trimmed) else {
                throw entry.error("expected one of " + BackendKind.allCases.map { $0.rawValue }.joined(separator: ", "))
            }
            c.backend = kind
        },
        Key(group: "Clients", key: "AllowUsers") { c, entry throws(ConfigurationError) in c.clients!.allowUsers = try entry.list() },
        Key(group: "Clients", key: "AllowGroups") { c, entry throws(ConfigurationError) in c.clients!.allowGroups = try entry.list() },
        Key(group: "Clients", key: "AllowExecutables") { c, entry throws(ConfigurationError) in
            let paths = try entry.list()
            if let relative = paths.first(where: { !$0.hasPrefix("/") }) {
                throw entry.error("executable '\(relative)' is not an absolute path")
            }
            c.clients!.allowExecutables = paths
        },
        Key(group: "Clients", key: "AllowUnits") { c, entry throws(ConfigurationError) in c.clients!.allowUnits = try entry.list() },
        Key(group: "Operators", key: "AllowUsers") { c, entry throws(ConfigurationError) in c.operators!.allowUsers = try entry.list() },
        Key(group: "Operators", key: "AllowGroups") { c, entry throws(ConfigurationError) in c.operators!.allowGroups = try entry.list() },
        Key(group: "Agent", key: "AllowUsers") { c, entry throws(ConfigurationError) in
            c.agentAllowUsers = try entry.list()
        },
        Key(group: "Session", key: "TimeLimitSec") { c, entry throws(ConfigurationError) in
            c.session.timeLimitSec = try entry.unsigned(max: SessionLimits.maxTimeLimitSec)
        },
        Key(group: "Session", key: "InhibitSleep") { c, entry throws(ConfigurationError) in c.session.inhibitSleep = try entry.bool() },
        Key(group: "Session", key: "ZoomFactor") { c, entry throws(ConfigurationError) in
            c.session.zoomFactor = try entry.double(in: SessionLimits.zoomFactor)
        },
        Key(group: "Session", key: "TextScale") { c, entry throws(ConfigurationError) in
            c.session.textScale = try entry.double(in: SessionLimits.textScale)
        },
        Key(group: "Dconf", key: "DatabaseDir") { c, entry throws(ConfigurationError) in
            guard entry.trimmed.hasPrefix("/") else { throw entry.error("expected an absolute path") }
            c.dconf.databaseDir = entry.trimmed
        },
        Key(group: "Dconf", key: "DatabaseName") { c, entry throws(ConfigurationError) in
            // dconf takes it as a file name in DatabaseDir and in profiles.
            let name = entry.trimmed
            guard !name.isEmpty, !name.contains("/"), name != ".", name != ".." else {
                throw entry.error("expected a database name without '/'")
            }
            c.dconf.databaseName = name
        },
        Key(group: "Dconf", key: "LockOutsideSession") { c, entry throws(ConfigurationError) in
            c.dconf.lockOutsideSession = try entry.bool()
        },
    ]

    /// One raw entry and the parsers GLib keyfiles use for its types.
    private struct Entry: Sendable {
        let file: String, group: String, key: String, raw: String

        var trimmed: String {
            String(raw.drop(while: { $0.isWhitespace }).reversed().drop(while: { $0.isWhitespace }).reversed())
        }

        func error(_ reason: String) -> ConfigurationError {
            ConfigurationError(file: file, group: group, key: key, value: raw, reason: reason)
        }

        func bool() throws(ConfigurationError) -> Bool {
            switch trimmed {
            case "true", "1": return true
            case "false", "0": return false
            default: throw error("expected true or false")
            }
        }

        func unsigned(max: UInt64) throws(ConfigurationError) -> UInt64 {
            guard let n = UInt64(trimmed) else { throw error("expected a non-negative integer") }
            guard n <= max else { throw error("out of range 0…\(max)") }
            return n
        }

        func double(in range: ClosedRange<Double>) throws(ConfigurationError) -> Double {
            guard let d = Double(trimmed) else { throw error("expected a number") }
            guard range.contains(d) else { throw error("out of range \(range.lowerBound)…\(range.upperBound)") }
            return d
        }

        /// `;`-separated, a trailing `;` allowed; an empty item in the middle
        /// is a typo, not a wish. (GLib's `\;` escape is not supported: no
        /// name, path or unit here contains a `;`.)
        func list() throws(ConfigurationError) -> [String] {
            var items = trimmed.split(separator: ";", omittingEmptySubsequences: false).map(String.init)
            if items.last == "" { items.removeLast() }
            if items.contains("") { throw error("empty item in list") }
            return items
        }
    }
}
