import CGio
import GuidedAccessCore

/// Checks keys and values against the installed GSettings schemas (the
/// default schema source) without creating GSettings objects: GLib aborts on
/// `g_settings_new` with an unknown schema and warns or aborts on unknown keys
/// and ill-typed values, so every use of a key is checked here first.
///
/// Used by `GSettingsBackend` (user mode) and by `DconfBackend` (system mode),
/// which writes dconf keyfiles but checks values against the same schemas.
public final class GSettingsSchemaCheck {
    /// The default schema source (not owned; nil when no schemas are installed).
    private let source: OpaquePointer?
    /// Lookups, including misses: a `GSettingsSchema` reference, or nil.
    private var schemas: [String: OpaquePointer?] = [:]

    public init() {
        source = g_settings_schema_source_get_default()
    }

    deinit {
        for case let schema? in schemas.values { g_settings_schema_unref(schema) }
    }

    /// Whether the key exists with the value's type.
    public func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
        switch check(key, for: value) {
        case .success(let schemaKey):
            g_settings_schema_key_unref(schemaKey)
            return .available
        case .failure(let problem): return problem.availability
        }
    }

    /// Schema, key, type, then range or enum choices. Throws `.unsupported`
    /// or `.outOfRange`.
    public func validate(_ value: SettingValue, for key: SettingKey) throws(SettingsBackendError) {
        let schemaKey = try checked(key, for: value)
        defer { g_settings_schema_key_unref(schemaKey) }
        try checkRange(value, of: key, schemaKey)
    }

    /// The key's default value from its schema
    /// (`g_settings_schema_key_get_default_value`).
    public func defaultValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue {
        let schemaKey = try checked(key, for: nil)
        defer { g_settings_schema_key_unref(schemaKey) }
        let variant = g_settings_schema_key_get_default_value(schemaKey)!
        defer { g_variant_unref(variant) }
        guard let value = SettingValue(variant) else {
            throw SettingsBackendError(
                .unsupported, "\(key) has a default of type \(variantTypeString(variant)), not b, d or s")
        }
        return value
    }

    /// Parses GVariant text (as `SettingValue.gvariantText` writes it) with
    /// the key's type from its schema.
    public func parse(_ text: String, for key: SettingKey) throws(SettingsBackendError) -> SettingValue {
        let schemaKey = try checked(key, for: nil)
        defer { g_settings_schema_key_unref(schemaKey) }
        var error: UnsafeMutablePointer<GError>? = nil
        guard let variant = g_variant_parse(g_settings_schema_key_get_value_type(schemaKey), text, nil, nil, &error)
        else {
            let message = error.map { String(cString: $0.pointee.message) } ?? "unknown error"
            g_clear_error(&error)
            throw SettingsBackendError(.unsupported, "\(key): cannot parse \(text): \(message)")
        }
        let owned = g_variant_ref_sink(variant)!
        defer { g_variant_unref(owned) }
        guard let value = SettingValue(owned) else {
            throw SettingsBackendError(.unsupported, "\(key) \(text) is of type \(variantTypeString(owned)), not b, d or s")
        }
        return value
    }

    // MARK: For GSettingsBackend

    enum Problem: Error {
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

        var error: SettingsBackendError {
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

    /// The key's schema entry (a new reference) when the schema and key exist
    /// and the key has the value's type (any type when `value` is nil).
    func check(_ key: SettingKey, for value: SettingValue?) -> Result<OpaquePointer, Problem> {
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

    func checked(_ key: SettingKey, for value: SettingValue?) throws(SettingsBackendError) -> OpaquePointer {
        switch check(key, for: value) {
        case .success(let schemaKey): return schemaKey
        case .failure(let problem): throw problem.error
        }
    }

    func checkRange(_ value: SettingValue, of key: SettingKey, _ schemaKey: OpaquePointer) throws(SettingsBackendError) {
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
    /// Not owned by the caller.
    func schema(_ id: String) -> OpaquePointer? {
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
}

extension SettingValue {
    /// The GVariant type string of the value (enum keys have type s).
    var typeString: String {
        switch self {
        case .bool: return "b"
        case .double: return "d"
        case .string: return "s"
        }
    }

    /// A new, non-floating GVariant reference: release with g_variant_unref.
    func newVariant() -> OpaquePointer {
        let floating: OpaquePointer
        switch self {
        case .bool(let b): floating = g_variant_new_boolean(b ? 1 : 0)
        case .double(let d): floating = g_variant_new_double(d)
        case .string(let s): floating = g_variant_new_string(s)
        }
        return g_variant_ref_sink(floating)
    }

    init?(_ variant: OpaquePointer) {
        switch variantTypeString(variant) {
        case "b": self = .bool(g_variant_get_boolean(variant) != 0)
        case "d": self = .double(g_variant_get_double(variant))
        case "s": self = .string(String(cString: g_variant_get_string(variant, nil)))
        default: return nil
        }
    }
}

func variantTypeString(_ variant: OpaquePointer) -> String {
    String(cString: g_variant_get_type_string(variant))
}
