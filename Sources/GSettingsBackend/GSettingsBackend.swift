import CGio
import GuidedAccessCore

/// User mode: the mapped keys in the user's own GSettings (dconf on a GNOME
/// session).
///
/// GLib aborts the process on `g_settings_new` with an unknown schema and
/// warns or aborts on unknown keys and ill-typed values, so every call checks
/// the key against the default schema source first; GSettings objects are
/// created only for schemas that exist, lazily, and kept.
///
/// GSettings delivers change notifications to the thread-default main context
/// of its creator. Nothing iterates GLib's default context in this service, so
/// the objects are created on a private context that each call drains:
/// notifications of other writers cannot pile up there unboundedly.
public final class GSettingsBackend: SettingsBackend {
    public let name = "gsettings"

    /// The default schema source (not owned; nil when no schemas are installed).
    private let source: OpaquePointer?
    /// Lookups, including misses: a `GSettingsSchema` reference, or nil.
    private var schemas: [String: OpaquePointer?] = [:]
    /// One delayed-apply GSettings object per schema, created on first use.
    private var settings: [String: UnsafeMutablePointer<GSettings>] = [:]
    private let context: OpaquePointer

    public init() {
        source = g_settings_schema_source_get_default()
        context = g_main_context_new()
    }

    deinit {
        withContext {
            for object in settings.values { g_object_unref(object) }
        }
        for case let schema? in schemas.values { g_settings_schema_unref(schema) }
        g_main_context_unref(context)
    }

    // MARK: SettingsBackend

    public func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
        switch check(key, for: value) {
        case .success: return .available
        case .failure(let problem): return problem.availability
        }
    }

    public func validate(_ value: SettingValue, for key: SettingKey) throws(SettingsBackendError) {
        let schemaKey = try checked(key, for: value)
        defer { g_settings_schema_key_unref(schemaKey) }
        try checkRange(value, of: key, schemaKey)
    }

    public func userValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue? {
        let schemaKey = try checked(key, for: nil)
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
                let schemaKey = try checked(key, for: value)
                defer { g_settings_schema_key_unref(schemaKey) }
                if let value { try checkRange(value, of: key, schemaKey) }
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

    // MARK: Checks

    fileprivate enum Problem: Error {
        case missingSchema(String)
        case missingKey(SettingKey)
        case wrongType(SettingKey, expected: String, got: SettingValue)

        var availability: SettingAvailability {
            switch self {
            case .missingSchema: return .missingSchema
            case .missingKey: return .missingKey
            case .wrongType(_, let expected, _): return .wrongType(expected: expected)
            }
        }
    }

    /// The key's schema entry (a new reference) when the schema and key exist
    /// and the key has the value's type (any type when `value` is nil).
    private func check(_ key: SettingKey, for value: SettingValue?) -> Result<OpaquePointer, Problem> {
        guard let schema = schema(key.schema) else { return .failure(.missingSchema(key.schema)) }
        guard g_settings_schema_has_key(schema, key.key) != 0 else { return .failure(.missingKey(key)) }
        let schemaKey = g_settings_schema_get_key(schema, key.key)!
        if let value {
            let typeText = g_variant_type_dup_string(g_settings_schema_key_get_value_type(schemaKey))!
            let expected = String(cString: typeText)
            g_free(typeText)
            guard expected == value.typeString else {
                g_settings_schema_key_unref(schemaKey)
                return .failure(.wrongType(key, expected: expected, got: value))
            }
        }
        return .success(schemaKey)
    }

    private func checked(_ key: SettingKey, for value: SettingValue?) throws(SettingsBackendError) -> OpaquePointer {
        switch check(key, for: value) {
        case .success(let schemaKey): return schemaKey
        case .failure(let problem): throw problem.error
        }
    }

    private func checkRange(_ value: SettingValue, of key: SettingKey, _ schemaKey: OpaquePointer) throws(SettingsBackendError) {
        if case .double(let d) = value, !d.isFinite {
            throw SettingsBackendError(.outOfRange, "\(key) \(value) is not a finite number")
        }
        let variant = value.newVariant()
        defer { g_variant_unref(variant) }
        guard g_settings_schema_key_range_check(schemaKey, variant) != 0 else {
            throw SettingsBackendError(.outOfRange, "\(key) \(value) is out of range")
        }
    }

    /// The schema with this id, when installed and usable with `g_settings_new`
    /// (relocatable schemas have no path and need one: they count as missing).
    private func schema(_ id: String) -> OpaquePointer? {
        if let cached = schemas[id] { return cached }
        var found: OpaquePointer? = nil
        if let source, let schema = g_settings_schema_source_lookup(source, id, 1) {
            if g_settings_schema_get_path(schema) != nil {
                found = schema
            } else {
                g_settings_schema_unref(schema)
            }
        }
        schemas[id] = found
        return found
    }

    /// The GSettings object of a schema `check` has found. Runs inside `withContext`.
    private func object(for schemaID: String) throws(SettingsBackendError) -> UnsafeMutablePointer<GSettings> {
        if let object = settings[schemaID] { return object }
        guard let schema = schema(schemaID) else {
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

extension GSettingsBackend.Problem {
    fileprivate var error: SettingsBackendError {
        switch self {
        case .missingSchema(let id):
            return SettingsBackendError(.unsupported, "\(id): no such schema on this system")
        case .missingKey(let key):
            return SettingsBackendError(.unsupported, "\(key): no such key on this system")
        case .wrongType(let key, let expected, let value):
            return SettingsBackendError(
                .unsupported, "\(key) has type \(expected), not \(value.typeString) as \(value) has")
        }
    }
}

extension SettingValue {
    /// The GVariant type string of the value (enum keys have type s).
    fileprivate var typeString: String {
        switch self {
        case .bool: return "b"
        case .double: return "d"
        case .string: return "s"
        }
    }

    /// A new, non-floating GVariant reference: release with g_variant_unref.
    fileprivate func newVariant() -> OpaquePointer {
        let floating: OpaquePointer
        switch self {
        case .bool(let b): floating = g_variant_new_boolean(b ? 1 : 0)
        case .double(let d): floating = g_variant_new_double(d)
        case .string(let s): floating = g_variant_new_string(s)
        }
        return g_variant_ref_sink(floating)
    }

    fileprivate init?(_ variant: OpaquePointer) {
        switch variantTypeString(variant) {
        case "b": self = .bool(g_variant_get_boolean(variant) != 0)
        case "d": self = .double(g_variant_get_double(variant))
        case "s": self = .string(String(cString: g_variant_get_string(variant, nil)))
        default: return nil
        }
    }
}

private func variantTypeString(_ variant: OpaquePointer) -> String {
    String(cString: g_variant_get_type_string(variant))
}
