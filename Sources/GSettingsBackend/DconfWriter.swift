import CDconf
import CGio
import DBus
import Glibc
import GuidedAccessCore

/// dconf-service's `ca.desrt.dconf.Writer.Change`, called over a connection
/// of the backend's own to the session bus on the service's event loop —
/// what `dconf_client_change_sync` does through GDBus, without GDBus's
/// worker thread and buffers, and without blocking: the loop serves other
/// callers while dconf-service writes, and a dconf-service that does not
/// answer within `timeout` makes the change's outcome unknown (it may still
/// write it once it runs again), not the service stall.
///
/// Only for the common profile whose first database is `user-db:NAME`
/// (dconf's default, and what the system mode's profile starts with): the
/// writer is then `/ca/desrt/dconf/Writer/NAME` on the session bus. For any
/// other profile `writerPath()` is nil and libdconf writes. Reads stay with
/// libdconf, which reads the database file and needs no bus; the backend's
/// read-back after every change would report a writer that missed the
/// database libdconf reads.
final class DconfWriter {
    let objectPath: String
    private let path: ObjectPath
    let loop: EventLoop
    let timeout: Duration
    private var connection: Connection?

    /// `objectPath` comes from `writerPath()`, which admits only names that
    /// make a valid object path.
    init(objectPath: String, loop: EventLoop, timeout: Duration) {
        self.objectPath = objectPath
        path = ObjectPath(stringLiteral: objectPath)
        self.loop = loop
        self.timeout = timeout
    }

    /// Sends the change set and waits for dconf-service's reply: once it
    /// comes, dconf-service has written its database.
    nonisolated(nonsending) func change(_ changeset: OpaquePointer) async throws(SettingsBackendError) {
        // The body is one `ay`: the change set serialised as dconf's a{smv}.
        let serialised = dconf_changeset_serialise(changeset)!
        let bytes = UnsafeRawBufferPointer(start: g_variant_get_data(serialised), count: Int(g_variant_get_size(serialised)))
            .map { DBusValue.byte($0) }
        g_variant_unref(serialised)
        let bus = try await connect()
        do throws(DBusError) {
            _ = try await bus.call(
                destination: "ca.desrt.dconf", path: path, interface: "ca.desrt.dconf.Writer",
                member: "Change", [.array(.byte, bytes)], timeout: timeout)
        } catch {
            // libdbus's own timeout, or a bus gone while the call was out:
            // dconf-service may have the change, and may still write it.
            let connected = await bus.isConnected
            if error.name == DBusError.noReply("").name || !connected {
                throw SettingsBackendError(
                    .outcomeUnknown, "dconf: dconf-service did not answer within \(timeout): \(error.message)")
            }
            throw SettingsBackendError(.writeFailed, "dconf: \(error.name): \(error.message)")
        }
    }

    /// The connection to the session bus, made on first use and again after
    /// the bus went away.
    nonisolated(nonsending) private func connect() async throws(SettingsBackendError) -> Connection {
        if let connection, await connection.isConnected { return connection }
        connection = nil
        do {
            let made = try await Connection.connect(to: .session, loop: loop)
            connection = made
            return made
        } catch {
            throw SettingsBackendError(.writeFailed, "dconf: cannot reach the session bus: \(error.message)")
        }
    }

    // MARK: The profile in effect

    /// The object path of the writer of the profile's first database when
    /// that is `user-db:NAME`, found as libdconf finds the profile (dconf
    /// 0.40, engine/dconf-engine-profile.c): the mandatory profile
    /// `/run/dconf/user/UID`; `DCONF_PROFILE` (a name or a path); the runtime
    /// profile `$XDG_RUNTIME_DIR/dconf/profile`; the profile `user` in
    /// `/etc/dconf/profile` or the system data directories; else the default,
    /// `user-db:user`. Nil for any other first database, or a profile that
    /// cannot be read: libdconf writes then.
    static func writerPath() -> String? {
        if let text = readFile("/run/dconf/user/\(getuid())") { return firstUserDatabase(text) }
        if let profile = getenv("DCONF_PROFILE").map({ String(cString: $0) }) {
            guard !profile.isEmpty else { return nil }
            if profile.hasPrefix("/") { return readFile(profile).flatMap(firstUserDatabase) }
            guard case .found(let text) = profileFile(profile) else { return nil }
            return firstUserDatabase(text)
        }
        if let runtime = g_get_user_runtime_dir(), let text = readFile(String(cString: runtime) + "/dconf/profile") {
            return firstUserDatabase(text)
        }
        switch profileFile("user") {
        case .found(let text): return firstUserDatabase(text)
        case .missing, .unreadable: return firstUserDatabase("user-db:user")
        }
    }

    enum ProfileFile: Equatable { case found(String), missing, unreadable }

    /// A named profile: the first of `/etc/dconf/profile/NAME` and
    /// `DIR/dconf/profile/NAME` for the system data directories that exists;
    /// the search stops at one that exists but cannot be read.
    static func profileFile(_ name: String) -> ProfileFile {
        var prefixes = ["/etc"]
        if var dirs = g_get_system_data_dirs() {
            while let dir = dirs.pointee {
                prefixes.append(String(cString: dir))
                dirs += 1
            }
        }
        for prefix in prefixes {
            let found = profileText(prefix + "/dconf/profile/" + name)
            if found != .missing { return found }
        }
        return .missing
    }

    /// The writer's object path if the first database line libdconf accepts
    /// is `user-db:NAME`; lines are stripped of comments and blanks, and
    /// descriptions dconf does not know are skipped, as dconf does.
    static func firstUserDatabase(_ profile: String) -> String? {
        for raw in profile.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = raw.prefix { $0 != "#" }.trimmingASCIIWhitespace
            guard let colon = line.firstIndex(of: ":") else { continue }
            let kind = line[..<colon]
            let name = line[line.index(after: colon)...]
            guard !name.isEmpty, ["user-db", "service-db", "system-db", "file-db"].contains(kind) else { continue }
            // The name becomes an object path element.
            guard kind == "user-db",
                name.utf8.allSatisfy({ $0 == UInt8(ascii: "_") || (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) })
            else { return nil }
            return "/ca/desrt/dconf/Writer/" + name
        }
        return nil
    }

    /// The whole file as text; nil when it is missing or unreadable.
    private static func readFile(_ path: String) -> String? {
        guard case .found(let text) = profileText(path) else { return nil }
        return text
    }

    private static func profileText(_ path: String) -> ProfileFile {
        do {
            guard let bytes = try FileContents.read(path) else { return .missing }
            return .found(String(decoding: bytes, as: UTF8.self))
        } catch {
            return .unreadable
        }
    }
}
