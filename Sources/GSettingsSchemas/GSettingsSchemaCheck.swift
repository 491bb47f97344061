import CGio
import GuidedAccessCore

/// Checks keys and values against the installed GSettings schemas (the
/// default schema source) without creating GSettings objects: GLib aborts on
/// `g_settings_new` with an unknown schema and warns or aborts on unknown keys
/// and ill-typed values, so every use of a key is checked here first.
///
/// Each key is looked up once: what the schemas say of it (a `SchemaKey`), or
/// that they lack it, is kept. The default schema source does not change while
/// the process runs, and the keys a backend meets are the few of the key map.
///
/// Used by `GSettingsBackend` (user mode) and by `DconfBackend` (system mode),
/// which writes dconf keyfiles but checks values against the same schemas.
public final class GSettingsSchemaCheck {
    /// The default schema source (not owned; nil when no schemas are installed).
    private let source: OpaquePointer?
    /// Lookups, including misses: a `GSettingsSchema` reference, or nil.
    private var schemas: [String: OpaquePointer?] = [:]
    /// Lookups, including misses.
    private var keys: [SettingKey: Result<SchemaKey, Problem>] = [:]

    public init() {
        source = g_settings_schema_source_get_default()
    }

    deinit {
        for case let schema? in schemas.values { g_settings_schema_unref(schema) }
    }

    /// Whether the key exists with the value's type.
    public func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
        switch lookUp(key) {
        case .success(let schemaKey):
            return schemaKey.typeString == value.typeString ? .available : .wrongType(expected: schemaKey.typeString)
        case .failure(let problem):
            return problem.availability
        }
    }

    /// The key as the installed schemas have it. Throws `.unsupported` when
    /// they have no such schema or key.
    public func schemaKey(_ key: SettingKey) throws(SettingsBackendError) -> SchemaKey {
        switch lookUp(key) {
        case .success(let schemaKey): return schemaKey
        case .failure(let problem): throw problem.error
        }
    }

    /// The key, with the value checked against it: type, then range or
    /// choices. Throws `.unsupported` or `.outOfRange`.
    public func checked(_ value: SettingValue, for key: SettingKey) throws(SettingsBackendError) -> SchemaKey {
        let schemaKey = try schemaKey(key)
        try schemaKey.check(value)
        return schemaKey
    }

    /// The key's default value from its schema.
    public func defaultValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue {
        try schemaKey(key).defaultValue()
    }

    /// Parses GVariant text (as `SettingValue.gvariantText` writes it) with
    /// the key's type from its schema.
    public func parse(_ text: String, for key: SettingKey) throws(SettingsBackendError) -> SettingValue {
        try schemaKey(key).parse(text)
    }

    private func lookUp(_ key: SettingKey) -> Result<SchemaKey, Problem> {
        if let known = keys[key] { return known }
        let found: Result<SchemaKey, Problem>
        if let schema = schema(key.schema) {
            found = g_settings_schema_has_key(schema, key.key) != 0
                ? .success(SchemaKey(key, schema: schema)) : .failure(.missingKey(key))
        } else {
            found = .failure(.missingSchema(key.schema))
        }
        keys[key] = found
        return found
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
}

/// A key of an installed schema, looked up once (`GSettingsSchemaCheck`):
/// its type, what values its schema allows and where dconf keeps it.
public final class SchemaKey {
    public let setting: SettingKey
    /// The key's `GSettingsSchema`, for `g_settings_new_full`. The schema key
    /// holds a reference to it.
    public let schema: OpaquePointer
    /// The key's `GVariantType`, owned by the schema key.
    public let valueType: OpaquePointer
    /// Its type string: `b`, `d`, `s` (enum keys too), or a type no
    /// `SettingValue` has.
    public let typeString: String
    /// Where dconf keeps the key: its schema's path and its name.
    public let dconfPath: String
    /// What the schema allows of the values of its type.
    public let allowed: Allowed

    public enum Allowed: Hashable, Sendable {
        /// Any value of the type.
        case any
        /// A number from `minimum` to `maximum`, both included.
        case range(minimum: Double, maximum: Double)
        /// One of these strings: an enum's nicks, or `<choices>`.
        case choices([String])
    }

    /// The `GSettingsSchemaKey` (a reference of ours).
    private let schemaKey: OpaquePointer

    init(_ setting: SettingKey, schema: OpaquePointer) {
        self.setting = setting
        self.schema = schema
        schemaKey = g_settings_schema_get_key(schema, setting.key)!
        valueType = g_settings_schema_key_get_value_type(schemaKey)!
        let type = g_variant_type_dup_string(valueType)!
        typeString = String(cString: type)
        g_free(type)
        dconfPath = String(cString: g_settings_schema_get_path(schema)!) + setting.key
        allowed = Self.allowed(by: schemaKey, typeString: typeString)
    }

    deinit {
        g_settings_schema_key_unref(schemaKey)
    }

    /// The value's type, then its range or choices, as
    /// `g_settings_schema_key_range_check` has them; and a number must be
    /// finite (GLib takes NaN as in every range). Throws `.unsupported` or
    /// `.outOfRange`.
    public func check(_ value: SettingValue) throws(SettingsBackendError) {
        guard value.typeString == typeString else {
            throw Problem.wrongType(setting, expected: typeString, got: value).error
        }
        switch (value, allowed) {
        case (.double(let d), _) where !d.isFinite:
            throw SettingsBackendError(.outOfRange, "\(setting) \(value) is not a finite number")
        case (.double(let d), .range(let minimum, let maximum)) where !(minimum <= d && d <= maximum):
            throw SettingsBackendError(.outOfRange, "\(setting) \(value) is out of range")
        case (.string(let s), .choices(let choices)) where !choices.contains(s):
            throw SettingsBackendError(.outOfRange, "\(setting) \(value) is out of range")
        default:
            return
        }
    }

    /// The key's default value from its schema.
    public func defaultValue() throws(SettingsBackendError) -> SettingValue {
        let variant = g_settings_schema_key_get_default_value(schemaKey)!
        defer { g_variant_unref(variant) }
        guard let value = SettingValue(variant) else {
            throw SettingsBackendError(
                .unsupported, "\(setting) has a default of type \(variantTypeString(variant)), not b, d or s")
        }
        return value
    }

    /// Parses GVariant text with the key's type.
    public func parse(_ text: String) throws(SettingsBackendError) -> SettingValue {
        var error: UnsafeMutablePointer<GError>? = nil
        guard let variant = g_variant_parse(valueType, text, nil, nil, &error) else {
            let message = error.map { String(cString: $0.pointee.message) } ?? "unknown error"
            g_clear_error(&error)
            throw SettingsBackendError(.unsupported, "\(setting): cannot parse \(text): \(message)")
        }
        let owned = g_variant_ref_sink(variant)!
        defer { g_variant_unref(owned) }
        guard let value = SettingValue(owned) else {
            throw SettingsBackendError(.unsupported, "\(setting) \(text) is of type \(variantTypeString(owned)), not b, d or s")
        }
        return value
    }

    /// `g_settings_schema_key_get_range`, `(sv)`: `range` with the bounds
    /// (read for `d` keys, the only numbers a `SettingValue` has), `enum`
    /// with the strings (enum nicks or choices; aliases are not in it, and
    /// the range check refuses them too), or `type`/`flags` (no check a
    /// `b`, `d` or `s` value meets).
    private static func allowed(by schemaKey: OpaquePointer, typeString: String) -> Allowed {
        let range = g_settings_schema_key_get_range(schemaKey)!
        defer { g_variant_unref(range) }
        let kindVariant = g_variant_get_child_value(range, 0)!
        let kind = String(cString: g_variant_get_string(kindVariant, nil))
        g_variant_unref(kindVariant)
        let boxed = g_variant_get_child_value(range, 1)!
        defer { g_variant_unref(boxed) }
        let detail = g_variant_get_variant(boxed)!
        defer { g_variant_unref(detail) }
        switch (kind, typeString) {
        case ("range", "d"):
            let low = g_variant_get_child_value(detail, 0)!, high = g_variant_get_child_value(detail, 1)!
            defer {
                g_variant_unref(low)
                g_variant_unref(high)
            }
            return .range(minimum: g_variant_get_double(low), maximum: g_variant_get_double(high))
        case ("enum", _):
            var count = 0
            let strings = g_variant_get_strv(detail, &count)!
            defer { g_free(UnsafeMutableRawPointer(mutating: strings)) }
            return .choices((0..<count).map { String(cString: strings[$0]!) })
        default:
            return .any
        }
    }
}

/// Why the schemas do not have a key for a value.
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
