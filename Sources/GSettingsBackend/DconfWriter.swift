import Glibc
import CDBus
import CDconf
import CGio
import GuidedAccessCore

/// dconf-service's `ca.desrt.dconf.Writer.Change` called over a libdbus
/// connection of the backend's own, blocking until dconf-service has written
/// its database — what `dconf_client_change_sync` does through GDBus, without
/// GDBus: no worker thread, none of GDBus's code and buffers in memory, and
/// no hand-over between threads on every write.
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
    private var connection: OpaquePointer?

    init(objectPath: String) {
        self.objectPath = objectPath
    }

    deinit {
        if let connection {
            dbus_connection_close(connection)
            dbus_connection_unref(connection)
        }
    }

    /// Sends the change set and waits for dconf-service's reply (the default
    /// D-Bus timeout, as libdconf's own synchronous change).
    func change(_ changeset: OpaquePointer) throws(SettingsBackendError) {
        let bus = try connect()
        guard let message = dbus_message_new_method_call(
            "ca.desrt.dconf", objectPath, "ca.desrt.dconf.Writer", "Change")
        else { throw SettingsBackendError(.writeFailed, "dconf: out of memory") }
        defer { dbus_message_unref(message) }
        // The body is one `ay`: the change set serialised as dconf's a{smv}.
        let serialised = dconf_changeset_serialise(changeset)!
        defer { g_variant_unref(serialised) }
        var iterator = DBusMessageIter()
        var array = DBusMessageIter()
        dbus_message_iter_init_append(message, &iterator)
        var appended = dbus_message_iter_open_container(&iterator, CDBUS_TYPE_ARRAY, "y", &array) != 0
        if appended {
            var bytes = g_variant_get_data(serialised)
            appended = dbus_message_iter_append_fixed_array(
                &array, CDBUS_TYPE_BYTE, &bytes, Int32(g_variant_get_size(serialised))) != 0
            appended = dbus_message_iter_close_container(&iterator, &array) != 0 && appended
        }
        guard appended else { throw SettingsBackendError(.writeFailed, "dconf: out of memory") }

        var error = DBusError()
        dbus_error_init(&error)
        let reply = dbus_connection_send_with_reply_and_block(bus, message, CDBUS_TIMEOUT_USE_DEFAULT, &error)
        // Nothing else is asked for on this connection; what came anyway
        // (NameAcquired) is dropped, so it cannot pile up.
        while let other = dbus_connection_pop_message(bus) { dbus_message_unref(other) }
        guard let reply else {
            let text = Self.describe(&error)
            if dbus_connection_get_is_connected(bus) == 0 { drop() }
            throw SettingsBackendError(.writeFailed, "dconf: \(text)")
        }
        dbus_message_unref(reply)
    }

    /// The private connection to the session bus, made on first use and again
    /// after the bus went away.
    private func connect() throws(SettingsBackendError) -> OpaquePointer {
        if let connection, dbus_connection_get_is_connected(connection) != 0 { return connection }
        drop()
        var error = DBusError()
        dbus_error_init(&error)
        guard let made = dbus_bus_get_private(DBUS_BUS_SESSION, &error) else {
            throw SettingsBackendError(.writeFailed, "dconf: cannot reach the session bus: \(Self.describe(&error))")
        }
        // A lost bus is an error of the next change, not the end of the service.
        dbus_connection_set_exit_on_disconnect(made, 0)
        connection = made
        return made
    }

    private func drop() {
        guard let connection else { return }
        dbus_connection_close(connection)
        dbus_connection_unref(connection)
        self.connection = nil
    }

    private static func describe(_ error: inout DBusError) -> String {
        defer { dbus_error_free(&error) }
        guard dbus_error_is_set(&error) != 0 else { return "unknown error" }
        let name = error.name.map { String(cString: $0) } ?? ""
        let message = error.message.map { String(cString: $0) } ?? ""
        return name.isEmpty ? message : "\(name): \(message)"
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
