#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// What survives a restart of the service: the session, if any, the
/// registered restrictions with their states (restrictions outlive restarts
/// even outside a session), and what each driver keeps of what it changed.
public struct JournalState: Equatable, Sendable {
    public var session: Session?
    public var restrictions: [Restriction]
    /// Each driver's record, by its name (`FeatureDriver.record`).
    package var drivers: [String: JSON]

    public init(session: Session?, restrictions: [Restriction]) {
        self.init(session: session, restrictions: restrictions, drivers: [:])
    }

    package init(session: Session?, restrictions: [Restriction], drivers: [String: JSON]) {
        self.session = session
        self.restrictions = restrictions
        self.drivers = drivers
    }
}

/// Why the journal could not be read or written.
public enum JournalError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The file exists but is not a journal; it was moved to `movedTo`.
    case corrupt(path: String, movedTo: String, reason: String)
    /// Written by a newer service; left in place so that service can read it again.
    case unsupportedVersion(path: String, version: Int)
    /// A system call failed.
    case io(FileError)

    public var description: String {
        switch self {
        case .corrupt(let path, let movedTo, let reason):
            return "journal \(path) is corrupt (\(reason)); kept as \(movedTo)"
        case .unsupportedVersion(let path, let version):
            return "journal \(path) has version \(version); this service reads version \(SessionJournal.version)"
        case .io(let error):
            return "\(error)"
        }
    }
}

/// The crash-safety record of the service, one JSON file in the state
/// directory, replaced atomically on every change.
///
/// `SessionStore` records it before every settings write.
public struct SessionJournal: Sendable {
    public static let version = 2
    public static let fileName = "journal.json"

    public let directory: String
    public var path: String { file.path }
    private let file: DurableFile.RecycledFile

    /// `fileName`: the service's `journal.json`; the session agent keeps its
    /// own beside it.
    public init(directory: String, fileName: String = Self.fileName) {
        self.directory = directory
        file = DurableFile.RecycledFile(directory + "/" + fileName, directory: directory)
    }

    /// More than 256 restrictions of the largest size, escaped, ever take.
    public static let maxBytes = 4 << 20

    /// The stored state, or nil when there is no journal yet. A corrupt file
    /// is moved aside to `journal.corrupt-<seconds since epoch>` and reported:
    /// never silently dropped, never read again as if it were good. The
    /// journal is checked as strictly as a caller's arguments: whatever put
    /// it there, the service takes up only a session and restrictions a
    /// caller could have made, and each driver's record by `check` (given
    /// the driver's name). A journal of version 1 is read as version 2.
    package func load(
        check: (String, JSON) throws(DriverRecordError) -> Void = { _, _ in }
    ) throws(JournalError) -> JournalState? {
        let found: FileContents.Regular
        do {
            found = try FileContents.readRegular(path, limit: Self.maxBytes)
        } catch {
            throw .io(error)
        }
        let bytes: [UInt8]
        switch found {
        case .missing: return nil
        case .unfit(let why): throw try moveAside(reason: why)
        case .bytes(let read): bytes = read
        }
        let record: JournalRecord
        do {
            let json = try JSON.parse(bytes)
            // A newer service's journal is left in place, whatever its shape.
            if case .number(let text)? = json["version"], let version = Int(text), !(1...Self.version).contains(version) {
                throw JournalError.unsupportedVersion(path: path, version: version)
            }
            record = try JournalRecord(json: json)
        } catch let error as JournalError {
            throw error
        } catch {
            throw try moveAside(reason: "\(error)")
        }
        do {
            let state = try record.state()
            for (name, driverRecord) in state.drivers.sorted(by: { $0.key < $1.key }) {
                do {
                    try check(name, driverRecord)
                } catch {
                    throw JournalRecord.Invalid(reason: "the record of '\(name)': \(error.reason)")
                }
            }
            return state
        } catch let invalid as JournalRecord.Invalid {
            throw try moveAside(reason: invalid.reason)
        } catch {
            throw try moveAside(reason: "\(error)")
        }
    }

    /// Replaces the journal with `state`: a temporary file in the same
    /// directory (one of two recycled ones), fdatasync, rename over, fsync
    /// the directory (`DurableFile.replaceRecycling`). Returns when the new
    /// state is durable.
    ///
    /// The directory is made (one level, mode 0700) by the first record of a
    /// process, not by every one: a write into a directory removed since fails
    /// with ENOENT, and then it is made again and the write tried once more,
    /// so the outcome is what a mkdir before every write gave.
    public func record(_ state: JournalState) throws(JournalError) {
        // The file is padded to 4096-byte blocks anyway (`replaceRecycling`).
        let data = JournalRecord(state).json().serializedBytes(reservingCapacity: 4096)
        let madeBefore = Self.madeDirectories.withLock { $0.contains(directory) }
        if !madeBefore { try makeDirectory() }
        do {
            // 0600: the journal holds the owner's identity and the user's settings.
            try DurableFile.replaceRecycling(file, with: data, mode: 0o600)
        } catch where madeBefore && error.errno == ENOENT {
            // Removed since this process made it: made again, as every write once did.
            Self.madeDirectories.withLock { _ = $0.remove(directory) }
            try makeDirectory()
            do {
                try DurableFile.replaceRecycling(file, with: data, mode: 0o600)
            } catch {
                throw .io(error)
            }
        } catch {
            throw .io(error)
        }
    }

    /// Directories `record` made, or found there, in this process.
    private static let madeDirectories = Mutex<Set<String>>([])

    private func makeDirectory() throws(JournalError) {
        // One level only: the parent is the state directory's business (systemd's StateDirectory=).
        if mkdir(directory, 0o700) != 0, errno != EEXIST {
            throw .io(FileError(path: directory, operation: "mkdir", errno: errno))
        }
        Self.madeDirectories.withLock { _ = $0.insert(directory) }
    }

    /// Removes the journal, durably: the next start finds none. For when
    /// writing it failed and a stale one would be worse than none.
    public func discard() throws(JournalError) {
        guard unlink(path) == 0 || errno == ENOENT else {
            throw .io(FileError(path: path, operation: "unlink", errno: errno))
        }
        try syncDirectory()
    }

    // MARK: Files

    private func syncDirectory() throws(JournalError) {
        do {
            try DurableFile.syncDirectory(directory)
        } catch {
            throw .io(error)
        }
    }

    /// Moves the corrupt journal aside and returns the error to report.
    private func moveAside(reason: String) throws(JournalError) -> JournalError {
        let stamp = String(time(nil))
        var target = directory + "/journal.corrupt-" + stamp
        var attempt = 1
        while access(target, F_OK) == 0 {
            attempt += 1
            target = directory + "/journal.corrupt-" + stamp + "." + String(attempt)
        }
        guard rename(path, target) == 0 else { throw .io(FileError(path: path, operation: "rename", errno: errno)) }
        try syncDirectory()
        return .corrupt(path: path, movedTo: target, reason: reason)
    }
}

/// The file format, version 2. Kept apart from the domain types so either
/// can change without the other, and so a stored value says whether it was
/// unset. Version 1 kept the settings' snapshot and the programs in the
/// session, and the keys owed outside one at the top: they are read as the
/// records of the drivers named `settings` and `session-programs`.
struct JournalRecord {
    struct Invalid: Error { var reason: String }

    struct SessionRecord {
        var owner: String?
        var ownerUID: UInt32
        var ownerExecutable: String?
        /// (1.2) The owning page's origin; absent for a bus owner.
        var ownerOrigin: String?
        var features: [String]
        var zoomFactor: Double
        var textScale: Double
        var inhibitSleep: Bool
        var deadlineUsec: UInt64
        var ending: Bool
    }

    /// One key's value before the session: `unset`, or exactly one of the values.
    struct SnapshotEntry {
        var schema: String
        var key: String
        var unset: Bool
        var bool: Bool?
        var double: Double?
        var string: String?
    }

    struct RestrictionRecord {
        var identifier: String
        var text: String
        var detail: String
        var state: String
    }

    var version: Int
    var session: SessionRecord?
    var restrictions: [RestrictionRecord]
    var drivers: [(String, JSON)]

    init(_ state: JournalState) {
        version = SessionJournal.version
        session = state.session.map { s in
            SessionRecord(
                owner: s.owner, ownerUID: s.ownerIdentity.uid, ownerExecutable: s.ownerIdentity.executablePath,
                ownerOrigin: s.ownerIdentity.origin, features: s.features.sortedWireNames, zoomFactor: s.zoomFactor, textScale: s.textScale,
                inhibitSleep: s.inhibitSleep, deadlineUsec: s.deadlineUsec, ending: s.isEnding)
        }
        restrictions = state.restrictions.sorted { $0.identifier < $1.identifier }.map {
            RestrictionRecord(identifier: $0.identifier, text: $0.text, detail: $0.detail, state: $0.state.rawValue)
        }
        drivers = state.drivers.sorted { $0.key < $1.key }
    }

    static func entries(_ snapshot: [SettingKey: StoredValue]) -> [SnapshotEntry] {
        snapshot.sorted { $0.key < $1.key }.map { key, stored in
            var entry = SnapshotEntry(schema: key.schema, key: key.key, unset: stored == .unset)
            switch stored.settingValue {
            case .bool(let b): entry.bool = b
            case .double(let d): entry.double = d
            case .string(let s): entry.string = s
            case nil: break
            }
            return entry
        }
    }

    /// Values before the session, of keys the service writes, each once.
    static func snapshot(_ entries: [SnapshotEntry]) throws(Invalid) -> [SettingKey: StoredValue] {
        let mapped = Set(FeatureKeyMap.allRequirements.map(\.key))
        var snapshot: [SettingKey: StoredValue] = [:]
        for entry in entries {
            let key = SettingKey(schema: entry.schema, key: entry.key)
            guard mapped.contains(key) else { throw Invalid(reason: "the snapshot names a key the service never writes") }
            guard snapshot[key] == nil else { throw Invalid(reason: "the snapshot lists \(key) twice") }
            let values = [entry.bool.map(SettingValue.bool), entry.double.map(SettingValue.double),
                          entry.string.map(SettingValue.string)].compactMap { $0 }
            switch (entry.unset, values.count) {
            case (true, 0): snapshot[key] = .unset
            case (false, 1): snapshot[key] = .set(values[0])
            default: throw Invalid(reason: "snapshot of \(key) is neither unset nor one value")
            }
        }
        return snapshot
    }

    /// The state, checked as a caller's arguments are: a journal that
    /// holds what no caller could have made is corrupt.
    func state() throws -> JournalState {
        let session = try self.session.map { s in
            var features: Set<Feature> = []
            for name in s.features {
                guard let feature = Feature(rawValue: name) else { throw Invalid(reason: "unknown feature '\(name)'") }
                guard features.insert(feature).inserted else { throw Invalid(reason: "feature '\(name)' appears twice") }
            }
            guard SessionLimits.zoomFactor.contains(s.zoomFactor) else {
                throw Invalid(reason: "zoom factor \(s.zoomFactor) is outside \(SessionLimits.zoomFactor)")
            }
            guard SessionLimits.textScale.contains(s.textScale) else {
                throw Invalid(reason: "text scale \(s.textScale) is outside \(SessionLimits.textScale)")
            }
            if let owner = s.owner, !Self.isUniqueBusName(owner) { throw Invalid(reason: "the owner is not a unique bus name") }
            if let path = s.ownerExecutable, !path.hasPrefix("/") || path.utf8.count > 4096 {
                throw Invalid(reason: "the owner's executable is not an absolute path")
            }
            if let origin = s.ownerOrigin, !BrowserOrigin.isValid(origin) {
                throw Invalid(reason: "the owner's origin is not an origin")
            }
            return Session(
                // A page's tab is not journaled: its session comes back ownerless.
                owner: s.ownerOrigin == nil ? s.owner : nil,
                ownerIdentity: OwnerIdentity(uid: s.ownerUID, executablePath: s.ownerExecutable, origin: s.ownerOrigin),
                features: features, zoomFactor: s.zoomFactor, textScale: s.textScale, inhibitSleep: s.inhibitSleep,
                deadlineUsec: s.deadlineUsec, isEnding: s.ending)
        }
        // The registry's own checks: identifiers, text sizes, no duplicate, the limit.
        var registry = RestrictionRegistry()
        if !restrictions.isEmpty {
            do {
                try registry.register(restrictions.map {
                    RestrictionRegistration(identifier: $0.identifier, text: $0.text, detail: $0.detail)
                })
            } catch {
                throw Invalid(reason: "restrictions: \(error.message)")
            }
        }
        let restrictions = try self.restrictions.map { r in
            guard let state = RestrictionState(rawValue: r.state) else {
                throw Invalid(reason: "restriction '\(r.identifier)' has state '\(r.state)'")
            }
            return Restriction(identifier: r.identifier, text: r.text, detail: r.detail, state: state)
        }
        var drivers: [String: JSON] = [:]
        for (name, record) in self.drivers {
            guard Self.isDriverName(name) else { throw Invalid(reason: "'\(name)' is not a driver's name") }
            guard drivers.updateValue(record, forKey: name) == nil else { throw Invalid(reason: "two records of '\(name)'") }
        }
        return JournalState(session: session, restrictions: restrictions, drivers: drivers)
    }

    /// `:` and dot-separated elements of `[A-Za-z0-9_-]`, at most 255 bytes.
    static func isUniqueBusName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard bytes.count >= 2, bytes.count <= 255, bytes[0] == UInt8(ascii: ":") else { return false }
        return bytes.dropFirst().split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false).allSatisfy {
            !$0.isEmpty
                && $0.allSatisfy { b in
                    b == UInt8(ascii: "_") || b == UInt8(ascii: "-") || (0x30...0x39).contains(b)
                        || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b)
                }
        }
    }

    /// `[a-z0-9-]`, 1 to 64 bytes.
    static func isDriverName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 64
            && name.utf8.allSatisfy { $0 == UInt8(ascii: "-") || (0x30...0x39).contains($0) || (0x61...0x7A).contains($0) }
    }
}

extension JournalRecord.SnapshotEntry {
    init(schema: String, key: String, unset: Bool) {
        self.init(schema: schema, key: key, unset: unset, bool: nil, double: nil, string: nil)
    }
}

// MARK: - The JSON form (keys sorted, as the file has always had them)

extension JournalRecord {
    func json() -> JSON {
        var members: [(String, JSON)] = []
        members.reserveCapacity(4)
        if !drivers.isEmpty { members.append(("drivers", .object(drivers))) }
        members.append(("restrictions", .array(restrictions.map { $0.json() })))
        if let session { members.append(("session", session.json())) }
        members.append(("version", .number(String(version))))
        return .object(members)
    }

    init(json: JSON) throws(Invalid) {
        guard case .object = json else { throw Invalid(reason: "the journal is not a JSON object") }
        version = try json.integer("version")
        restrictions = try json.array("restrictions").map { item throws(Invalid) in try RestrictionRecord(json: item) }
        if let session = json["session"], session != .null {
            self.session = try SessionRecord(json: session)
        } else {
            session = nil
        }
        drivers = []
        if version == 1 {
            // The settings' snapshot: the session's, and the keys owed outside one.
            var snapshot: [JSON] = []
            if let session = json["session"], session != .null { snapshot = try session.array("snapshot") }
            if json["owed"] != nil {
                // A key in both: the session's value from before it counts.
                func key(_ entry: JSON) -> [JSON?] { [entry["schema"], entry["key"]] }
                let listed = snapshot.map(key)
                snapshot += try json.array("owed").filter { !listed.contains(key($0)) }
            }
            if !snapshot.isEmpty { drivers.append(("settings", SettingsDriver.record(of: snapshot))) }
            if let programs = json["session"]?["programs"], programs != .null {
                drivers.append(("session-programs", .object([("programs", programs)])))
            }
            return
        }
        if let records = json["drivers"] {
            guard case .object(let members) = records else { throw Invalid(reason: "'drivers' is not an object") }
            drivers = members
        }
    }
}

extension JournalRecord.SessionRecord {
    func json() -> JSON {
        var members: [(String, JSON)] = [
            ("deadlineUsec", .number(String(deadlineUsec))),
        ]
        members.reserveCapacity(9)
        // Only while an end is under way: other journals keep their bytes.
        if ending { members.append(("ending", .bool(true))) }
        members.append(("features", .array(features.map(JSON.string))))
        members.append(("inhibitSleep", .bool(inhibitSleep)))
        if let owner { members.append(("owner", .string(owner))) }
        if let ownerExecutable { members.append(("ownerExecutable", .string(ownerExecutable))) }
        if let ownerOrigin { members.append(("ownerOrigin", .string(ownerOrigin))) }
        members.append(("ownerUID", .number(String(ownerUID))))
        members.append(("textScale", .number(String(textScale))))
        members.append(("zoomFactor", .number(String(zoomFactor))))
        return .object(members)
    }

    init(json: JSON) throws(JournalRecord.Invalid) {
        owner = try json.optionalString("owner")
        ownerUID = try json.integer("ownerUID")
        ownerExecutable = try json.optionalString("ownerExecutable")
        ownerOrigin = try json.optionalString("ownerOrigin")
        features = try json.array("features").map { item throws(JournalRecord.Invalid) in
            guard case .string(let name) = item else { throw .init(reason: "a feature is not a string") }
            return name
        }
        zoomFactor = try json.double("zoomFactor")
        textScale = try json.double("textScale")
        inhibitSleep = try json.bool("inhibitSleep")
        deadlineUsec = try json.integer("deadlineUsec")
        ending = json["ending"] == nil ? false : try json.bool("ending")
    }
}

extension JournalRecord.SnapshotEntry {
    func json() -> JSON {
        var members: [(String, JSON)] = []
        members.reserveCapacity(4)
        if let bool { members.append(("bool", .bool(bool))) }
        if let double { members.append(("double", .number(String(double)))) }
        members.append(("key", .string(key)))
        members.append(("schema", .string(schema)))
        if let string { members.append(("string", .string(string))) }
        members.append(("unset", .bool(unset)))
        return .object(members)
    }

    init(json: JSON) throws(JournalRecord.Invalid) {
        schema = try json.string("schema")
        key = try json.string("key")
        unset = try json.bool("unset")
        bool = json["bool"] == nil ? nil : try json.bool("bool")
        double = json["double"] == nil ? nil : try json.double("double")
        string = try json.optionalString("string")
    }
}

extension JournalRecord.RestrictionRecord {
    func json() -> JSON {
        .object([
            ("detail", .string(detail)), ("identifier", .string(identifier)), ("state", .string(state)),
            ("text", .string(text)),
        ])
    }

    init(json: JSON) throws(JournalRecord.Invalid) {
        identifier = try json.string("identifier")
        text = try json.string("text")
        detail = try json.string("detail")
        state = try json.string("state")
    }
}

extension JSON {
    fileprivate func field(_ key: String) throws(JournalRecord.Invalid) -> JSON {
        guard let value = self[key] else { throw .init(reason: "'\(key)' is missing") }
        return value
    }

    fileprivate func string(_ key: String) throws(JournalRecord.Invalid) -> String {
        guard case .string(let s) = try field(key) else { throw .init(reason: "'\(key)' is not a string") }
        return s
    }

    fileprivate func optionalString(_ key: String) throws(JournalRecord.Invalid) -> String? {
        guard let value = self[key], value != .null else { return nil }
        guard case .string(let s) = value else { throw .init(reason: "'\(key)' is not a string") }
        return s
    }

    fileprivate func bool(_ key: String) throws(JournalRecord.Invalid) -> Bool {
        guard case .bool(let b) = try field(key) else { throw .init(reason: "'\(key)' is not true or false") }
        return b
    }

    fileprivate func integer<T: FixedWidthInteger>(_ key: String) throws(JournalRecord.Invalid) -> T {
        guard case .number(let text) = try field(key), let n = T(text) else {
            throw .init(reason: "'\(key)' is not an integer of type \(T.self)")
        }
        return n
    }

    fileprivate func double(_ key: String) throws(JournalRecord.Invalid) -> Double {
        guard case .number(let text) = try field(key), let d = Double(text), d.isFinite else {
            throw .init(reason: "'\(key)' is not a finite number")
        }
        return d
    }

    fileprivate func array(_ key: String) throws(JournalRecord.Invalid) -> [JSON] {
        guard case .array(let items) = try field(key) else { throw .init(reason: "'\(key)' is not an array") }
        return items
    }
}
