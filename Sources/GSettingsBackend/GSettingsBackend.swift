import CGio
import GuidedAccessCore

/// User mode: the mapped keys in the user's own GSettings (dconf on a GNOME
/// session).
///
/// GLib aborts the process on `g_settings_new` with an unknown schema and
/// warns or aborts on unknown keys and ill-typed values, so every call checks
/// the key against the default schema source first (`GSettingsSchemaCheck`);
/// GSettings objects are created only for schemas that exist, lazily, and kept.
///
/// GSettings delivers change notifications to the thread-default main context
/// of its creator. Nothing iterates GLib's default context in this service, so
/// the objects are created on a private context that each call drains:
/// notifications of other writers cannot pile up there unboundedly.
public final class GSettingsBackend: SettingsBackend {
    public let name = "gsettings"

    private let schemaCheck = GSettingsSchemaCheck()
    /// One delayed-apply GSettings object per schema, created on first use.
    private var settings: [String: UnsafeMutablePointer<GSettings>] = [:]
    private let context: OpaquePointer

    public init() {
        context = g_main_context_new()
    }

    deinit {
        withContext {
            for object in settings.values { g_object_unref(object) }
        }
        g_main_context_unref(context)
    }

    // MARK: SettingsBackend

    public func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
        schemaCheck.availability(of: key, for: value)
    }

    public func validate(_ value: SettingValue, for key: SettingKey) throws(SettingsBackendError) {
        try schemaCheck.validate(value, for: key)
    }

    public func userValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue? {
        let schemaKey = try schemaCheck.checked(key, for: nil)
        g_settings_schema_key_unref(schemaKey)
        return try withContext { () throws(SettingsBackendError) -> SettingValue? in
            guard let variant = g_settings_get_user_value(try object(for: key.schema), key.key) else {
                return nil
            }
            defer { g_variant_unref(variant) }
            guard let value = SettingValue(variant) else {
                throw SettingsBackendError(
                    .unsupported, "\(key) has a value of type \(variantTypeString(variant)), not b, d or s")
            }
            return value
        }
    }

    /// Checks every change first (schema, key, type, range, writability), then
    /// writes each schema's changes in one delayed apply — one dconf change
    /// set per schema — and syncs. Changes of different schemas are separate
    /// change sets: a reader can see one schema's changes before another's.
    public func apply(_ changes: [SettingKey: SettingValue?]) throws(SettingsBackendError) {
        if changes.isEmpty { return }
        try withContext { () throws(SettingsBackendError) in
            let sorted = changes.sorted { $0.key < $1.key }
            for (key, value) in sorted {
                let schemaKey = try schemaCheck.checked(key, for: value)
                defer { g_settings_schema_key_unref(schemaKey) }
                if let value { try schemaCheck.checkRange(value, of: key, schemaKey) }
                // In delay mode g_settings_set_value cannot report a locked key,
                // and g_settings_apply drops a refused write silently: ask first.
                guard g_settings_is_writable(try object(for: key.schema), key.key) != 0 else {
                    throw SettingsBackendError(.writeFailed, "\(key) is not writable (locked)")
                }
            }

            var touched: [UnsafeMutablePointer<GSettings>] = []
            for (key, value) in sorted {
                let object = try object(for: key.schema)
                if touched.last != object { touched.append(object) }
                if let value {
                    let variant = value.newVariant()
                    defer { g_variant_unref(variant) }
                    guard g_settings_set_value(object, key.key, variant) != 0 else {
                        for object in touched { g_settings_revert(object) }
                        throw SettingsBackendError(.writeFailed, "\(key) \(value) could not be written")
                    }
                } else {
                    g_settings_reset(object, key.key)
                }
            }
            for object in touched { g_settings_apply(object) }
            // dconf writes through D-Bus from its own thread; this waits until
            // dconf-service has written the database.
            g_settings_sync()

            // A write the backend refused after all (dconf-service failed, no
            // bus) is only logged by GLib: read the values back.
            for (key, value) in sorted {
                let now = try readBack(key)
                guard now == value else {
                    throw SettingsBackendError(
                        .writeFailed,
                        "\(key) \(value.map { "\($0)" } ?? "reset") did not take effect (it is \(now.map { "\($0)" } ?? "unset"))")
                }
            }
        }
    }

    /// The GSettings object of a schema `check` has found. Runs inside `withContext`.
    private func object(for schemaID: String) throws(SettingsBackendError) -> UnsafeMutablePointer<GSettings> {
        if let object = settings[schemaID] { return object }
        guard let schema = schemaCheck.schema(schemaID) else {
            throw SettingsBackendError(.unsupported, "\(schemaID): no such schema")
        }
        let object = g_settings_new_full(schema, nil, nil)!
        // Delay mode for good: a batch for this schema goes out in one apply.
        g_settings_delay(object)
        settings[schemaID] = object
        return object
    }

    private func readBack(_ key: SettingKey) throws(SettingsBackendError) -> SettingValue? {
        guard let variant = g_settings_get_user_value(try object(for: key.schema), key.key) else { return nil }
        defer { g_variant_unref(variant) }
        return SettingValue(variant)
    }

    /// Runs `body` with the private context as the thread's default, so
    /// GSettings objects made here notify on it and our own writes dispatch
    /// at once, and drains what other writers' notifications queued there.
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
