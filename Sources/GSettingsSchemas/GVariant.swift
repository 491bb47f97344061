import CGio
import GuidedAccessCore

extension SettingValue {
    /// The GVariant type string of the value (enum keys have type s).
    public var typeString: String {
        switch self {
        case .bool: return "b"
        case .double: return "d"
        case .string: return "s"
        }
    }

    /// A new, non-floating GVariant reference: release with g_variant_unref.
    public func newVariant() -> OpaquePointer {
        let floating: OpaquePointer
        switch self {
        case .bool(let b): floating = g_variant_new_boolean(b ? 1 : 0)
        case .double(let d): floating = g_variant_new_double(d)
        case .string(let s): floating = g_variant_new_string(s)
        }
        return g_variant_ref_sink(floating)
    }

    /// The value of a GVariant of type b, d or s; nil for any other type.
    public init?(_ variant: OpaquePointer) {
        switch variantTypeString(variant) {
        case "b": self = .bool(g_variant_get_boolean(variant) != 0)
        case "d": self = .double(g_variant_get_double(variant))
        case "s": self = .string(String(cString: g_variant_get_string(variant, nil)))
        default: return nil
        }
    }
}

/// The type string of a GVariant (`b`, `d`, `as`, …).
public func variantTypeString(_ variant: OpaquePointer) -> String {
    String(cString: g_variant_get_type_string(variant))
}
