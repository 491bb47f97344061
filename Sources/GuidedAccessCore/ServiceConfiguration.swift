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
public struct ServiceConfiguration: Hashable, Sendable {
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
    /// `[Service] Desktop=`: the session the features act on; nil (`auto`) = detect it.
    public var desktop: Desktop?
    /// nil when the file has no `[Clients]` group, which in user mode admits
    /// the bus's own user; a present but empty group admits nobody by list.
    public var clients: ClientLists?
    /// nil when the file has no `[Operators]` group (see `clients`).
    public var operators: OperatorLists?
    public var session: SessionDefaults
    public var dconf: Dconf
    /// `[Browser] DevToolsEndpoint=`: the kiosk browser the browser layer
    /// acts in; nil (empty, the default) = no browser layer.
    public var devToolsEndpoint: DevToolsEndpoint?

    /// The configuration with no file: the mode's defaults.
    public init(defaultsFor mode: ServiceMode) {
        backend = mode == .system ? .dconf : .gsettings
        desktop = nil
        clients = nil
        operators = nil
        session = SessionDefaults()
        dconf = Dconf()
        devToolsEndpoint = nil
    }

    /// Applies one keyfile entry. A group seen with no keys still counts as
    /// present: call `applyGroup(_:file:)` for each group header.
    public mutating func apply(group: String, key: String, value raw: String, file: String) throws(ConfigurationError) {
        try applyGroup(group, file: file)
        let entry = Entry(file: file, group: group, key: key, raw: raw)
        switch (group, key) {
        case ("Service", "Backend"):
            guard let kind = BackendKind(rawValue: entry.trimmed) else {
                throw entry.error("expected one of " + BackendKind.allCases.map { $0.rawValue }.joined(separator: ", "))
            }
            backend = kind
        case ("Service", "Desktop"):
            if entry.trimmed == "auto" {
                desktop = nil
            } else if let named = Desktop(rawValue: entry.trimmed) {
                desktop = named
            } else {
                throw entry.error("expected auto or one of " + Desktop.allCases.map { $0.rawValue }.joined(separator: ", "))
            }
        case ("Clients", "AllowUsers"): clients!.allowUsers = try entry.list()
        case ("Clients", "AllowGroups"): clients!.allowGroups = try entry.list()
        case ("Clients", "AllowExecutables"):
            let paths = try entry.list()
            if let relative = paths.first(where: { !$0.hasPrefix("/") }) {
                throw entry.error("executable '\(relative)' is not an absolute path")
            }
            clients!.allowExecutables = paths
        case ("Clients", "AllowUnits"): clients!.allowUnits = try entry.list()
        case ("Operators", "AllowUsers"): operators!.allowUsers = try entry.list()
        case ("Operators", "AllowGroups"): operators!.allowGroups = try entry.list()
        case ("Session", "TimeLimitSec"):
            session.timeLimitSec = try entry.unsigned(max: SessionLimits.maxTimeLimitSec)
        case ("Session", "InhibitSleep"): session.inhibitSleep = try entry.bool()
        case ("Session", "ZoomFactor"): session.zoomFactor = try entry.double(in: SessionLimits.zoomFactor)
        case ("Session", "TextScale"): session.textScale = try entry.double(in: SessionLimits.textScale)
        case ("Dconf", "DatabaseDir"):
            guard entry.trimmed.hasPrefix("/") else { throw entry.error("expected an absolute path") }
            dconf.databaseDir = entry.trimmed
        case ("Dconf", "DatabaseName"):
            // dconf takes it as a file name in DatabaseDir and in profiles.
            let name = entry.trimmed
            guard !name.isEmpty, !name.contains("/"), name != ".", name != ".." else {
                throw entry.error("expected a database name without '/'")
            }
            dconf.databaseName = name
        case ("Dconf", "LockOutsideSession"): dconf.lockOutsideSession = try entry.bool()
        case ("Browser", "DevToolsEndpoint"):
            guard !entry.trimmed.isEmpty else {
                devToolsEndpoint = nil
                break
            }
            switch DevToolsEndpoint.parse(entry.trimmed) {
            case .success(let endpoint): devToolsEndpoint = endpoint
            case .failure(let problem): throw entry.error(problem.description)
            }
        default:
            throw entry.error("unknown key")
        }
    }

    /// Notes a group header; an unknown group is an error.
    public mutating func applyGroup(_ group: String, file: String) throws(ConfigurationError) {
        switch group {
        case "Service", "Session", "Dconf", "Browser": break
        case "Clients": if clients == nil { clients = ClientLists() }
        case "Operators": if operators == nil { operators = OperatorLists() }
        default:
            throw ConfigurationError(file: file, group: group, key: "", value: "", reason: "unknown group")
        }
    }

    /// One raw entry and the parsers GLib keyfiles use for its types.
    private struct Entry {
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
