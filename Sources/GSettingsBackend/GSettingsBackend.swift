import CDconf
import CGio
import DBus
import GSettingsSchemas
import GuidedAccessCore

/// User mode: the mapped keys in the user's own GSettings (dconf on a GNOME
/// session).
///
/// Two ways to the store, chosen once from the environment as GLib would:
/// - **dconf** (GLib's default backend on GNOME; `GSETTINGS_BACKEND` unset or
///   `dconf`): all changes of a call — keys of several schemas — go to
///   dconf-service as one change set, which it writes to disk in one go (one
///   write and fsync instead of one per schema), and reports failures.
///   Readers never see half of a change (invert-colors' two schemas). The
///   change set is sent by `DconfWriter` on the service's event loop, which
///   waits for dconf-service without blocking (libdconf through GDBus, which
///   blocks, for unusual profiles); values are read through libdconf.
/// - **gsettings** (any other `GSETTINGS_BACKEND`, e.g. `keyfile`): GSettings
///   objects in delay mode, one apply per schema, then `g_settings_sync`.
/// The keys and values are the same either way: the dconf path of a key is
/// its schema's path plus the key's name, the value a GVariant of the schema's
/// type.
///
/// GLib aborts the process on `g_settings_new` with an unknown schema and
/// warns or aborts on unknown keys and ill-typed values, so every call checks
/// the key against the default schema source first (`GSettingsSchemaCheck`,
/// which looks each key up once and keeps its type, range and dconf path);
/// GSettings objects are created only for schemas that exist, lazily, and kept.
///
/// GSettings and libdconf deliver change notifications to the thread-default
/// main context of their creator. Nothing iterates GLib's default context in
/// this service, so the objects are created on a private context that each
/// call drains: notifications of other writers cannot pile up there.
public final class GSettingsBackend: SettingsBackend {
    public let name = "gsettings"

    /// How the keys reach the store: `dconf` or `gsettings` (see above).
    public enum Store: String, Sendable, CaseIterable {
        case dconf, gsettings

        /// What GLib itself would use: dconf unless `GSETTINGS_BACKEND` names another backend.
        public static var automatic: Store {
            guard let chosen = getenv("GSETTINGS_BACKEND"), chosen.pointee != 0 else { return .dconf }
            return String(cString: chosen) == "dconf" ? .dconf : .gsettings
        }
    }

    public let store: Store
    /// Where `DconfWriter` waits for dconf-service, and for how long.
    private let loop: EventLoop
    private let writeTimeout: Duration
    private let schemas = GSettingsSchemaCheck()
    /// One delayed-apply GSettings object per schema, created on first use (store `gsettings`).
    private var settings: [String: UnsafeMutablePointer<GSettings>] = [:]
    /// The libdconf client (store `dconf`), created on first use.
    private var dconfClient: OpaquePointer?
    private let context: OpaquePointer

    /// `writeTimeout`: how long dconf-service may take to write a change
    /// before its outcome counts as unknown — a few seconds, far above the
    /// milliseconds a write takes, far below the 25 s a caller waits.
    public init(store: Store = .automatic, loop: EventLoop, writeTimeout: Duration = .seconds(5)) {
        self.store = store
        self.loop = loop
        self.writeTimeout = writeTimeout
        context = g_main_context_new()
    }

    deinit {
        withContext {
            for object in settings.values { g_object_unref(object) }
            if let dconfClient { g_object_unref(UnsafeMutableRawPointer(dconfClient)) }
        }
        g_main_context_unref(context)
    }

    // MARK: SettingsBackend

    public func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
        schemas.availability(of: key, for: value)
    }

    /// Schema, key, type, then range or choices; a reset needs the key only.
    public func check(_ changes: [SettingKey: SettingValue?]) throws(SettingsBackendError) -> CheckedChange {
        let change = CheckedChange(changes)
        for entry in change.entries {
            if let value = entry.value {
                _ = try schemas.checked(value, for: entry.key)
            } else {
                _ = try schemas.schemaKey(entry.key)
            }
        }
        return change
    }

    public func userValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue? {
        let schemaKey = try schemas.schemaKey(key)
        return try withContext { () throws(SettingsBackendError) -> SettingValue? in
            guard let variant = readUserValue(schemaKey) else { return nil }
            defer { g_variant_unref(variant) }
            guard let value = SettingValue(variant) else {
                throw SettingsBackendError(
                    .unsupported, "\(key) has a value of type \(variantTypeString(variant)), not b, d or s")
            }
            return value
        }
    }

    /// Checks that every key is writable, then writes them all — as one
    /// dconf change set, or as one delayed apply per schema with the
    /// `gsettings` store — and returns once the store has written them, so
    /// another process reads the new values.
    nonisolated(nonsending) public func apply(_ change: CheckedChange) async throws(SettingsBackendError) {
        if change.isEmpty { return }
        var writes: [Write] = []
        defer { for write in writes { write.release() } }
        try withContext { () throws(SettingsBackendError) in
            for entry in change.entries {
                // Found by `check`: a lookup in the cache.
                let schemaKey = try schemas.schemaKey(entry.key)
                // GSettings in delay mode cannot report a locked key, and
                // g_settings_apply drops a refused write silently: ask first.
                guard isWritable(schemaKey) else {
                    throw SettingsBackendError(.writeFailed, "\(entry.key) is not writable (locked)")
                }
                writes.append(Write(schemaKey: schemaKey, value: entry.value))
            }
        }
        switch store {
        case .dconf: try await writeChangeSet(writes, of: change)
        case .gsettings: try withContext { () throws(SettingsBackendError) in try applyPerSchema(writes) }
        }
        // A write the store refused after all (GSettings only logs it), that
        // went to another database than the one read, or that another writer
        // overtook. Cheap with the dconf store: libdconf reopens the database
        // dconf-service has just replaced at its first call after a write,
        // the read-back's or else the next writability check's.
        try withContext { () throws(SettingsBackendError) in
            for write in writes { try confirm(write) }
        }
    }

    /// One key of a change on its way to the store, with its value as a
    /// GVariant (nil: a reset), made once for the write and the read-back.
    private struct Write {
        let schemaKey: SchemaKey
        let value: SettingValue?
        let variant: OpaquePointer?

        init(schemaKey: SchemaKey, value: SettingValue?) {
            self.schemaKey = schemaKey
            self.value = value
            variant = value?.newVariant()
        }

        func release() {
            if let variant { g_variant_unref(variant) }
        }
    }

    // MARK: The dconf store

    /// One change set for every key, written by dconf-service before the call
    /// returns: through `DconfWriter` for the usual profile, else libdconf.
    nonisolated(nonsending) private func writeChangeSet(
        _ writes: [Write], of change: CheckedChange
    ) async throws(SettingsBackendError) {
        let changeset = dconf_changeset_new()!
        defer { dconf_changeset_unref(changeset) }
        for write in writes { dconf_changeset_set(changeset, write.schemaKey.dconfPath, write.variant) }
        let dconf = withContext { () -> OpaquePointer in client() }  // and the writer, from the same reading of the profile
        do {
            if let writer {
                try await writer.change(changeset)
            } else {
                try withContext { () throws(SettingsBackendError) in
                    var error: UnsafeMutablePointer<GError>? = nil
                    guard dconf_client_change_sync(dconf, changeset, nil, nil, &error) == 0 else { return }
                    defer { g_clear_error(&error) }
                    throw SettingsBackendError(
                        .writeFailed, "dconf: " + (error.map { String(cString: $0.pointee.message) } ?? "unknown error"))
                }
            }
        } catch {
            throw SettingsBackendError(error.kind, "\(change.summary) could not be written: \(error.message)")
        }
    }

    /// The dconf writer object the dconf store sends its change sets to over
    /// libdbus, or nil when libdconf writes (another store, or a profile whose
    /// first database is not a user database). For logs and tests.
    public var dconfWriterPath: String? {
        guard store == .dconf else { return nil }
        withContext { _ = client() }
        return writer?.objectPath
    }

    /// dconf-service's Change over a libdbus connection of our own when the
    /// profile's first database is a user database (nearly always); else nil,
    /// and libdconf writes through GDBus. Made with the libdconf client.
    private var writer: DconfWriter?

    /// The libdconf client; created inside `withContext`, so its change
    /// notifications go to the private context. The writer is found right
    /// after it, from the profile as libdconf has just read it: a profile
    /// that appears later cannot send writes to one database and reads to
    /// another.
    private func client() -> OpaquePointer {
        if let dconfClient { return dconfClient }
        let made = dconf_client_new()!
        dconfClient = made
        writer = DconfWriter.writerPath().map { DconfWriter(objectPath: $0, loop: loop, timeout: writeTimeout) }
        if store == .dconf {
            onNote?(writer.map { "dconf change sets go to \($0.objectPath) over libdbus" }
                ?? "the dconf profile does not start with a user database: libdconf writes")
        }
        return made
    }

    /// Told once, when the store is first used, how the dconf store writes
    /// (for the service's log). Not at start-up: the libdconf client is made
    /// on first use, not to cost memory before then.
    public var onNote: ((String) -> Void)?

    // MARK: The gsettings store

    private func applyPerSchema(_ writes: [Write]) throws(SettingsBackendError) {
        var touched: [UnsafeMutablePointer<GSettings>] = []
        for write in writes {
            let object = object(for: write.schemaKey)
            if touched.last != object { touched.append(object) }
            if let value = write.value, let variant = write.variant {
                guard g_settings_set_value(object, write.schemaKey.setting.key, variant) != 0 else {
                    for object in touched { g_settings_revert(object) }
                    throw SettingsBackendError(.writeFailed, "\(write.schemaKey.setting) \(value) could not be written")
                }
            } else {
                g_settings_reset(object, write.schemaKey.setting.key)
            }
        }
        for object in touched { g_settings_apply(object) }
        // The backend may write from its own thread (dconf through D-Bus);
        // this waits until it has.
        g_settings_sync()
    }

    /// The GSettings object of the key's schema, made on first use. Runs
    /// inside `withContext`.
    private func object(for schemaKey: SchemaKey) -> UnsafeMutablePointer<GSettings> {
        if let object = settings[schemaKey.setting.schema] { return object }
        let object = g_settings_new_full(schemaKey.schema, nil, nil)!
        // Delay mode for good: a batch for this schema goes out in one apply.
        g_settings_delay(object)
        settings[schemaKey.setting.schema] = object
        return object
    }

    // MARK: Both stores

    /// The user's own value of the key (a new reference), nil when unset.
    /// A value of another type than the schema's counts as unset, as GSettings has it.
    private func readUserValue(_ schemaKey: SchemaKey) -> OpaquePointer? {
        switch store {
        case .gsettings:
            return g_settings_get_user_value(object(for: schemaKey), schemaKey.setting.key)
        case .dconf:
            guard let variant = dconf_client_read_full(client(), schemaKey.dconfPath, DCONF_READ_USER_VALUE, nil) else {
                return nil
            }
            guard g_variant_is_of_type(variant, schemaKey.valueType) != 0 else {
                g_variant_unref(variant)
                return nil
            }
            return variant
        }
    }

    private func isWritable(_ schemaKey: SchemaKey) -> Bool {
        switch store {
        case .gsettings: return g_settings_is_writable(object(for: schemaKey), schemaKey.setting.key) != 0
        case .dconf: return dconf_client_is_writable(client(), schemaKey.dconfPath) != 0
        }
    }

    /// Throws `.writeFailed` unless the store now holds what `write` wrote.
    private func confirm(_ write: Write) throws(SettingsBackendError) {
        let now = readUserValue(write.schemaKey)
        defer { if let now { g_variant_unref(now) } }
        switch (write.variant, now) {
        case (nil, nil): return
        case (let written?, let now?) where g_variant_equal(UnsafeRawPointer(written), UnsafeRawPointer(now)) != 0: return
        default:
            let found = now.flatMap(SettingValue.init).map { "\($0)" } ?? "unset"
            throw SettingsBackendError(
                .writeFailed,
                "\(write.schemaKey.setting) \(write.value.map { "\($0)" } ?? "reset") did not take effect (it is \(found))")
        }
    }

    /// Runs `body` with the private context as the thread's default, so
    /// objects made here notify on it and our own writes dispatch at once,
    /// and drains what other writers' notifications queued there.
    private func withContext<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        g_main_context_push_thread_default(context)
        defer {
            while g_main_context_iteration(context, 0) != 0 {}
            g_main_context_pop_thread_default(context)
        }
        while g_main_context_iteration(context, 0) != 0 {}
        return try body()
    }
}
