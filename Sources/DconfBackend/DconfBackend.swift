import GSettingsSchemas
import Glibc
import GuidedAccessCore

/// System mode: the mapped keys imposed and locked through a dconf system
/// database (settings-mapping.md, "System mode"), without touching the
/// user's own database.
///
/// Two layers, each a dconf keyfile and a locks file in
/// `DatabaseDir/DatabaseName.d/` (every key in them locked, except
/// `toolkit-accessibility`, which gnome-settings-daemon writes):
/// - the **session layer**, `imposed`: what sessions impose, in
///   `50-guidedaccess` and `locks/guidedaccess`, written on every `apply`;
/// - the **baseline layer**, `baseline`: with `[Dconf] LockOutsideSession`,
///   the values every mapped key is locked at while no session changes it,
///   in `40-guidedaccess-baseline` and `locks/guidedaccess-baseline`.
///   dconf reads a directory's keyfiles in name order and a later file wins,
///   so a session's value shows over the baseline, and the baseline shows
///   again once the session layer lets go of the key.
/// After writing, `dconf update DatabaseDir` rebuilds `DatabaseDir/DatabaseName`
/// and tells running sessions on the system bus. At start-up `init` reads the
/// session layer back, so a restarted service knows what it imposes.
///
/// How the service's user-mode vocabulary maps onto system mode:
/// - `userValue(of:)` — "the value before the session" — is the value the
///   session layer imposes now, or nil when it imposes none. The service
///   snapshots it before a session writes a key, and at the end of the
///   session applies the snapshot: so the restore removes exactly what the
///   session added, and the baseline (if any) shows again. The user's own
///   values are never read nor written.
/// - `apply` with nil for a key: the key is no longer imposed; the user's own
///   value (or the schema default) reappears.
///
/// Values are checked against the installed schemas (`GSettingsSchemaCheck`)
/// by `check`, before anything is written. Calls come from one serial executor.
public final class DconfBackend: SettingsBackend {
    public let name = "dconf"
    public let databaseDir: String
    public let databaseName: String
    /// `[Dconf] LockOutsideSession`: whether `lockBaseline` writes the
    /// baseline layer (or removes one left from an earlier configuration).
    public let lockOutsideSession: Bool
    /// The dconf command-line tool (`dconf update`).
    public let dconfProgram: String
    /// Told what went wrong that did not stop a write (another database of
    /// `databaseDir` failing to build).
    public var onWarning: ((String) -> Void)?

    /// The key values the session layer imposes (and locks) now.
    public private(set) var imposed: [SettingKey: SettingValue]
    /// The key values the baseline layer imposes (and locks) now.
    public private(set) var baseline: [SettingKey: SettingValue]

    /// Keys that are imposed but never locked: gnome-settings-daemon writes them.
    public static let neverLocked: Set<SettingKey> = [
        SettingKey(schema: "org.gnome.desktop.interface", key: "toolkit-accessibility")
    ]

    private let schemas = GSettingsSchemaCheck()

    public var keyfileDirectory: String { databaseDir + "/" + databaseName + ".d" }
    public var keyfilePath: String { keyfileDirectory + "/50-guidedaccess" }
    public var locksDirectory: String { keyfileDirectory + "/locks" }
    public var locksPath: String { locksDirectory + "/guidedaccess" }
    public var baselineKeyfilePath: String { keyfileDirectory + "/40-guidedaccess-baseline" }
    public var baselineLocksPath: String { locksDirectory + "/guidedaccess-baseline" }
    /// The database `dconf update` builds; profiles name it `system-db:NAME`
    /// (or `file-db:PATH`).
    public var databasePath: String { databaseDir + "/" + databaseName }

    /// Reads what both layers impose (nothing when their files do not exist).
    /// Nothing is written until the first `apply` or `lockBaseline`.
    /// Throws when the keyfile cannot be read or names a key or value the
    /// installed schemas do not have.
    public init(
        databaseDir: String = "/etc/dconf/db", databaseName: String = "guidedaccess",
        lockOutsideSession: Bool = true, dconfProgram: String = "/usr/bin/dconf"
    ) throws(SettingsBackendError) {
        self.databaseDir = databaseDir
        self.databaseName = databaseName
        self.lockOutsideSession = lockOutsideSession
        self.dconfProgram = dconfProgram
        imposed = [:]
        baseline = [:]
        imposed = try readKeyfile(keyfilePath)
        // The baseline is written anew at start-up (`lockBaseline`): what the
        // installed schemas no longer have (an upgrade) is left out, not an error.
        baseline = try readKeyfile(baselineKeyfilePath, skippingUnknown: true)
    }

    // MARK: SettingsBackend

    public func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
        schemas.availability(of: key, for: value)
    }

    /// Every value against its key's schema. A key let go of (nil) needs no
    /// check: whatever the schemas say now, it is no longer imposed.
    public func check(_ changes: [SettingKey: SettingValue?]) throws(SettingsBackendError) -> CheckedChange {
        let change = CheckedChange(changes)
        for entry in change.entries {
            if let value = entry.value { _ = try schemas.checked(value, for: entry.key) }
        }
        return change
    }

    /// What the session layer imposes on the key now; nil when it imposes
    /// nothing (see the type's comment: this is "the value before the session").
    public func userValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue? {
        if let value = imposed[key] { return value }
        _ = try schemas.schemaKey(key)  // only to report a missing schema or key
        return nil
    }

    /// Merges the change into the imposed set (nil: no longer imposed),
    /// writes both files atomically and runs `dconf update`. On a failure the
    /// previous files are put back (without another `dconf update`) and
    /// `imposed` is unchanged. Local files and a local program: nothing to
    /// wait for but the disk.
    nonisolated(nonsending) public func apply(_ change: CheckedChange) async throws(SettingsBackendError) {
        if change.isEmpty { return }
        var new = imposed
        for entry in change.entries { new[entry.key] = entry.value }
        try impose(new)
    }

    /// No session in the journal, yet the session layer imposes keys (a
    /// corrupt journal kept aside, or an install whose layer also held the
    /// baseline): nothing could ever end them, so they go.
    public func startedWithoutSession() throws(SettingsBackendError) -> [SettingKey] {
        guard !imposed.isEmpty else { return [] }
        let released = imposed.keys.sorted()
        try impose([:])
        return released
    }

    // MARK: Outside a session

    /// `[Dconf] LockOutsideSession`: while no session changes them, the
    /// mapped keys are imposed and locked at these values, so the kiosk user
    /// cannot turn features on or off alone. With `lockOutsideSession` the
    /// baseline layer is written (when it differs); without, a baseline layer
    /// left from an earlier configuration is removed, so the keys are the
    /// user's again. The session layer is not touched: a session resumed
    /// from the journal keeps its settings. Call it at start-up, before the
    /// bus name is requested.
    ///
    /// Both layers' files are written anew and the database rebuilt once,
    /// whatever changed: a crash between writing a layer and `dconf update`
    /// left a database that does not say what the files say.
    public func lockBaseline(_ values: [SettingKey: SettingValue]) throws(SettingsBackendError) {
        let wanted = lockOutsideSession ? values : [:]
        for (key, value) in wanted.sorted(by: { $0.key < $1.key }) { _ = try schemas.checked(value, for: key) }
        for path in [keyfilePath, locksPath, baselineKeyfilePath, baselineLocksPath] {
            // A temporary file a crash mid-write left, if any.
            unlink(temporaryPath(of: path))
        }
        do {
            try writeLayer(imposed, keyfile: keyfilePath, locks: locksPath)
            try writeLayer(wanted, keyfile: baselineKeyfilePath, locks: baselineLocksPath)
            try runUpdate()
        } catch {
            try? writeLayer(baseline, keyfile: baselineKeyfilePath, locks: baselineLocksPath)
            throw error
        }
        baseline = wanted
    }

    /// The schema defaults of those keys that the installed schemas have —
    /// the usual baseline. Keys missing here (e.g. `reduced-motion` before
    /// GNOME 50) are left out.
    public func schemaDefaults(of keys: some Sequence<SettingKey>) -> [SettingKey: SettingValue] {
        var defaults: [SettingKey: SettingValue] = [:]
        for key in keys {
            if let value = try? schemas.defaultValue(of: key) { defaults[key] = value }
        }
        return defaults
    }

    // MARK: Writing

    private func impose(_ new: [SettingKey: SettingValue]) throws(SettingsBackendError) {
        try replaceLayer(imposed, with: new, keyfile: keyfilePath, locks: locksPath)
        imposed = new
    }

    /// Writes a layer's files and rebuilds the database. On a failure the
    /// layer's files are put back as `old` had them (the database was not
    /// rebuilt from the new ones, or `dconf update` failed on them).
    private func replaceLayer(
        _ old: [SettingKey: SettingValue], with new: [SettingKey: SettingValue], keyfile: String, locks: String
    ) throws(SettingsBackendError) {
        do {
            try writeLayer(new, keyfile: keyfile, locks: locks)
            try runUpdate()
        } catch {
            try? writeLayer(old, keyfile: keyfile, locks: locks)
            throw error
        }
    }

    /// A layer's keyfile and locks, or neither when it imposes nothing. The
    /// directories are always there afterwards, so `dconf update` always
    /// builds the database (an empty one when nothing is imposed).
    private func writeLayer(
        _ values: [SettingKey: SettingValue], keyfile keyfilePath: String, locks locksPath: String
    ) throws(SettingsBackendError) {
        try makeDirectory(databaseDir)
        try makeDirectory(keyfileDirectory)
        try makeDirectory(locksDirectory)
        let header = "# Written by guidedaccessd (system mode): what it imposes and locks. Do not edit.\n"
        if values.isEmpty {
            try removeFile(keyfilePath, directory: keyfileDirectory)
        } else {
            var text = header
            let groups = Dictionary(grouping: values.keys, by: { $0.dconfGroup })
            for group in groups.keys.sorted() {
                text += "\n[\(group)]\n"
                for key in groups[group]!.sorted() { text += "\(key.key)=\(values[key]!.gvariantText)\n" }
            }
            try writeAtomically(keyfilePath, text, directory: keyfileDirectory)
        }
        let locked = values.keys.filter { !Self.neverLocked.contains($0) }.sorted()
        if locked.isEmpty {
            try removeFile(locksPath, directory: locksDirectory)
        } else {
            try writeAtomically(
                locksPath, header + locked.map { $0.dconfPath + "\n" }.joined(), directory: locksDirectory)
        }
    }

    private func readKeyfile(
        _ keyfilePath: String, skippingUnknown: Bool = false
    ) throws(SettingsBackendError) -> [SettingKey: SettingValue] {
        guard let file = fopen(keyfilePath, "r") else {
            if errno == ENOENT { return [:] }
            throw SettingsBackendError(.writeFailed, "cannot read \(keyfilePath): \(lastError())")
        }
        defer { fclose(file) }
        var values: [SettingKey: SettingValue] = [:]
        var group: String?
        var line: UnsafeMutablePointer<CChar>? = nil
        var capacity = 0
        defer { free(line) }
        var number = 0
        while getline(&line, &capacity, file) != -1 {
            number += 1
            let text = String(String(cString: line!).trimmingASCIIWhitespace)
            if text.isEmpty || text.hasPrefix("#") { continue }
            if text.hasPrefix("[") && text.hasSuffix("]") {
                group = String(text.dropFirst().dropLast())
                continue
            }
            guard let group, let equals = text.firstIndex(of: "=") else {
                throw SettingsBackendError(.unsupported, "\(keyfilePath):\(number): not a key=value line in a group")
            }
            let key = SettingKey(
                schema: group.split(separator: "/").joined(separator: "."),
                key: String(text[..<equals].trimmingASCIIWhitespace))
            let valueText = String(text[text.index(after: equals)...].trimmingASCIIWhitespace)
            do {
                values[key] = try schemas.parse(valueText, for: key)
            } catch where skippingUnknown {
                continue
            } catch {
                throw SettingsBackendError(error.kind, "\(keyfilePath):\(number): \(error.message)")
            }
        }
        return values
    }

    // MARK: dconf update

    /// `dconf update DatabaseDir`, with an empty signal mask and default
    /// signal handlers (the service blocks SIGTERM and SIGINT for its
    /// signalfd; dconf must not inherit that), in this process's environment
    /// (DBUS_SYSTEM_BUS_ADDRESS decides where WritabilityNotify goes).
    private func runUpdate() throws(SettingsBackendError) {
        let command = "\(dconfProgram) update \(databaseDir)"
        // dconf update replaces the database file (a new inode) when it builds it.
        let databaseBefore = inode(of: databasePath)
        var pipeEnds: [Int32] = [-1, -1]
        // pipe2 is not in Swift's Glibc; the descriptors are close-on-exec
        // right after (the dup2 onto stderr clears it for dconf's copy).
        guard pipe(&pipeEnds) == 0 else {
            throw SettingsBackendError(.writeFailed, "\(command): cannot create a pipe: \(lastError())")
        }
        _ = fcntl(pipeEnds[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(pipeEnds[1], F_SETFD, FD_CLOEXEC)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipeEnds[1], 2)

        let argv: [UnsafeMutablePointer<CChar>?] = [strdup(dconfProgram), strdup("update"), strdup(databaseDir), nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, dconfProgram, &actions, &attributes, argv, environ)
        close(pipeEnds[1])
        guard spawned == 0 else {
            close(pipeEnds[0])
            throw SettingsBackendError(.writeFailed, "\(command): cannot run it: \(String(cString: strerror(spawned)))")
        }
        var stderrBytes: [UInt8] = []
        var stderrCut = false
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(pipeEnds[0], $0.baseAddress, $0.count) }
            if count > 0 {
                if stderrBytes.count < 65536 { stderrBytes += buffer[0..<count] } else { stderrCut = true }
            } else if count == 0 || errno != EINTR {
                break
            }
        }
        close(pipeEnds[0])
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        let exited = (status & 0x7f) == 0
        let code = (status >> 8) & 0xff
        let message = String(String(decoding: stderrBytes, as: UTF8.self).trimmingASCIIWhitespace)
        if exited && code == 1, !stderrCut, let rebuilt = inode(of: databasePath), rebuilt != databaseBefore,
            let others = otherDatabasesFailing(message)
        {
            // `dconf update DIR` rebuilds every database of DIR and fails
            // when one fails; ours was rebuilt all the same.
            onWarning?("`\(command)`: \(others.joined(separator: "; ")) (another database of \(databaseDir); \(databaseName) was rebuilt)")
            return
        }
        guard exited && code == 0 else {
            let how = exited ? "exited with status \(code)" : "was killed by signal \(status & 0x7f)"
            throw SettingsBackendError(.writeFailed, "`\(command)` \(how)\(message.isEmpty ? "" : ": \(message)")")
        }
    }

    private func inode(of path: String) -> ino_t? {
        var info = stat()
        return stat(path, &info) == 0 ? info.st_ino : nil
    }

    /// When `dconf update`'s errors name only other databases' directories
    /// (`DIR/OTHER.d: message`, one line each, then `error: …`), those lines.
    private func otherDatabasesFailing(_ stderr: String) -> [String]? {
        let ours = "/" + databaseName + ".d: "
        var others: [String] = []
        for line in stderr.split(separator: "\n").map(String.init) {
            if line.hasPrefix("error: ") || line.hasPrefix("warning: ") || line.includes("Failed to set scheduler settings") {
                continue
            }
            guard !line.includes(ours), line.hasPrefix("/"), line.includes(".d: ") else { return nil }
            others.append(line)
        }
        return others.isEmpty ? nil : others
    }

    // MARK: Files

    private func makeDirectory(_ path: String) throws(SettingsBackendError) {
        if mkdir(path, 0o755) == 0 || errno == EEXIST {
            var info = stat()
            if stat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR { return }
        }
        throw SettingsBackendError(.writeFailed, "cannot create the directory \(path): \(lastError())")
    }

    /// Temporary file, fsync, rename, fsync of the directory (`DurableFile`);
    /// 0644 whatever the umask, so dconf readers can read it.
    private func writeAtomically(_ path: String, _ text: String, directory: String) throws(SettingsBackendError) {
        do {
            try DurableFile.replace(
                path, with: Array(text.utf8), mode: 0o644, temporary: temporaryPath(of: path), directory: directory)
        } catch {
            throw SettingsBackendError(.writeFailed, "cannot write \(path): \(error)")
        }
    }

    /// A dot file beside `path`: dconf compiles every other file of the
    /// directory, so a temporary file left by a crash must not be one of them.
    private func temporaryPath(of path: String) -> String {
        let slash = path.lastIndex(of: "/")!
        return String(path[...slash]) + "." + String(path[path.index(after: slash)...]) + ".tmp"
    }

    private func removeFile(_ path: String, directory: String) throws(SettingsBackendError) {
        if unlink(path) == 0 {
            try syncDirectory(directory)
        } else if errno != ENOENT {
            throw SettingsBackendError(.writeFailed, "cannot remove \(path): \(lastError())")
        }
    }

    private func syncDirectory(_ path: String) throws(SettingsBackendError) {
        do {
            try DurableFile.syncDirectory(path)
        } catch {
            throw SettingsBackendError(.writeFailed, "cannot sync \(path): \(error)")
        }
    }
}

private func lastError() -> String { String(cString: strerror(errno)) }

extension String {
    /// Whether `part` occurs in the string, byte for byte (the service does
    /// not link _StringProcessing, whose `contains(_:)` this would be).
    fileprivate func includes(_ part: String) -> Bool {
        let text = Array(utf8), part = Array(part.utf8)
        guard !part.isEmpty else { return true }
        guard part.count <= text.count else { return false }
        return (0...(text.count - part.count)).contains { start in text[start..<(start + part.count)].elementsEqual(part) }
    }
}
