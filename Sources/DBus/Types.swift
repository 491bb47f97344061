/// A complete D-Bus type, as one signature element describes it.
public indirect enum DBusType: Hashable, Sendable, CustomStringConvertible {
    case byte, bool, int16, uint16, int32, uint32, int64, uint64, double
    case string, objectPath, signature, unixFD
    case variant
    case array(DBusType)
    case dictionary(key: DBusType, value: DBusType)
    case structure([DBusType])

    /// The type's signature text (`a{sv}`, `(sss)`, …).
    public var signature: String {
        switch self {
        case .byte: return "y"
        case .bool: return "b"
        case .int16: return "n"
        case .uint16: return "q"
        case .int32: return "i"
        case .uint32: return "u"
        case .int64: return "x"
        case .uint64: return "t"
        case .double: return "d"
        case .string: return "s"
        case .objectPath: return "o"
        case .signature: return "g"
        case .unixFD: return "h"
        case .variant: return "v"
        case .array(let element): return "a" + element.signature
        case .dictionary(let key, let value): return "a{" + key.signature + value.signature + "}"
        case .structure(let members): return "(" + members.map { $0.signature }.joined() + ")"
        }
    }

    public var description: String { signature }

    /// Basic types may be dictionary keys.
    public var isBasic: Bool {
        switch self {
        case .variant, .array, .dictionary, .structure: return false
        default: return true
        }
    }

    /// Parses a signature into its sequence of complete types, checking it
    /// the way the D-Bus specification does (length, nesting, dict keys).
    public static func parse(signature text: String) throws(DBusError) -> [DBusType] {
        let bytes = Array(text.utf8)
        guard bytes.count <= 255 else {
            throw .invalidArgs("signature of \(bytes.count) bytes is longer than 255")
        }
        var parser = SignatureParser(bytes: bytes, text: text)
        var types: [DBusType] = []
        while parser.index < bytes.count {
            types.append(try parser.parseOne(arrayRun: 0, structDepth: 0, dictDepth: 0))
        }
        return types
    }

    /// Parses a signature that must hold exactly one complete type.
    public static func parseSingle(_ text: String) throws(DBusError) -> DBusType {
        let types = try parse(signature: text)
        guard types.count == 1 else {
            throw .invalidArgs("signature '\(text)' is not a single complete type")
        }
        return types[0]
    }
}

private struct SignatureParser {
    let bytes: [UInt8]
    let text: String
    var index = 0

    private func fail(_ why: String) -> DBusError {
        .invalidArgs("invalid signature '\(text)': \(why)")
    }

    /// The limits are libdbus's, which validates every message we receive
    /// before we read it: at most 32 array codes in a row (any other code
    /// starts the count again), and 32 structs and 32 dict entries, each
    /// counted apart. A signature it accepts must parse.
    mutating func parseOne(arrayRun: Int, structDepth: Int, dictDepth: Int) throws(DBusError) -> DBusType {
        guard index < bytes.count else { throw fail("ends inside a container") }
        let c = bytes[index]
        index += 1
        switch c {
        case UInt8(ascii: "y"): return .byte
        case UInt8(ascii: "b"): return .bool
        case UInt8(ascii: "n"): return .int16
        case UInt8(ascii: "q"): return .uint16
        case UInt8(ascii: "i"): return .int32
        case UInt8(ascii: "u"): return .uint32
        case UInt8(ascii: "x"): return .int64
        case UInt8(ascii: "t"): return .uint64
        case UInt8(ascii: "d"): return .double
        case UInt8(ascii: "s"): return .string
        case UInt8(ascii: "o"): return .objectPath
        case UInt8(ascii: "g"): return .signature
        case UInt8(ascii: "h"): return .unixFD
        case UInt8(ascii: "v"): return .variant
        case UInt8(ascii: "a"):
            guard arrayRun < 32 else { throw fail("arrays nested deeper than 32") }
            if index < bytes.count, bytes[index] == UInt8(ascii: "{") {
                index += 1
                guard dictDepth < 32 else { throw fail("dictionary entries nested deeper than 32") }
                let key = try parseOne(arrayRun: 0, structDepth: structDepth, dictDepth: dictDepth + 1)
                guard key.isBasic else { throw fail("dictionary key '\(key.signature)' is not a basic type") }
                let value = try parseOne(arrayRun: 0, structDepth: structDepth, dictDepth: dictDepth + 1)
                guard index < bytes.count, bytes[index] == UInt8(ascii: "}") else {
                    throw fail("dictionary entry must hold exactly two types")
                }
                index += 1
                return .dictionary(key: key, value: value)
            }
            return .array(try parseOne(arrayRun: arrayRun + 1, structDepth: structDepth, dictDepth: dictDepth))
        case UInt8(ascii: "("):
            guard structDepth < 32 else { throw fail("structs nested deeper than 32") }
            var members: [DBusType] = []
            while true {
                guard index < bytes.count else { throw fail("unclosed struct") }
                if bytes[index] == UInt8(ascii: ")") {
                    index += 1
                    break
                }
                members.append(try parseOne(arrayRun: 0, structDepth: structDepth + 1, dictDepth: dictDepth))
            }
            guard !members.isEmpty else { throw fail("empty struct") }
            return .structure(members)
        case UInt8(ascii: "{"):
            throw fail("dictionary entry outside an array")
        default:
            throw fail("unknown type code '\(Character(Unicode.Scalar(c)))'")
        }
    }
}

/// A D-Bus object path, checked on construction.
public struct ObjectPath: Hashable, Sendable, Comparable, CustomStringConvertible,
    ExpressibleByStringLiteral
{
    public let rawValue: String

    public init(validating text: String) throws(DBusError) {
        guard ObjectPath.isValid(text) else {
            throw .invalidArgs("'\(text)' is not a valid object path")
        }
        rawValue = text
    }

    /// For literals in source: an invalid literal is a programming error.
    public init(stringLiteral value: String) {
        precondition(ObjectPath.isValid(value), "'\(value)' is not a valid object path")
        rawValue = value
    }

    public static func isValid(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard bytes.first == UInt8(ascii: "/") else { return false }
        if bytes.count == 1 { return true }
        guard bytes.last != UInt8(ascii: "/") else { return false }
        var previousWasSlash = true
        for c in bytes.dropFirst() {
            if c == UInt8(ascii: "/") {
                if previousWasSlash { return false }
                previousWasSlash = true
            } else {
                guard isNameByte(c) else { return false }
                previousWasSlash = false
            }
        }
        return true
    }

    /// The path's elements: "/a/b" → ["a", "b"]; "/" → [].
    public var elements: [Substring] {
        rawValue.split(separator: "/")
    }

    public var description: String { rawValue }

    public static func < (a: ObjectPath, b: ObjectPath) -> Bool { a.rawValue < b.rawValue }
}

/// A D-Bus signature value, checked on construction.
public struct Signature: Hashable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral {
    public let rawValue: String

    public init(validating text: String) throws(DBusError) {
        _ = try DBusType.parse(signature: text)
        rawValue = text
    }

    public init(_ types: [DBusType]) {
        rawValue = types.map { $0.signature }.joined()
    }

    public init(stringLiteral value: String) {
        do {
            try self.init(validating: value)
        } catch {
            preconditionFailure(error.message)
        }
    }

    public var types: [DBusType] {
        // Checked on construction, so parsing cannot fail here.
        (try? DBusType.parse(signature: rawValue)) ?? []
    }

    public var description: String { rawValue }
}

func isNameByte(_ c: UInt8) -> Bool {
    (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "z")) || (c >= UInt8(ascii: "A") && c <= UInt8(ascii: "Z"))
        || (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9")) || c == UInt8(ascii: "_")
}

/// Checks of the names the D-Bus specification defines.
public enum DBusNames {
    /// Interface and error names: two or more dot-separated elements of
    /// [A-Za-z0-9_], none starting with a digit, at most 255 bytes.
    public static func isValidInterface(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            guard bytes.count <= 255 else { return false }
            var elements = 0
            var elementStart = true
            for byte in bytes {
                if byte == UInt8(ascii: ".") {
                    guard !elementStart else { return false }
                    elementStart = true
                    continue
                }
                // No element starts with a digit.
                if elementStart, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") { return false }
                guard isNameByte(byte) else { return false }
                if elementStart { elements += 1 }
                elementStart = false
            }
            return !elementStart && elements >= 2
        }
    }

    /// Member names: one element of [A-Za-z0-9_], not starting with a digit.
    public static func isValidMember(_ text: String) -> Bool {
        text.utf8.count <= 255 && isValidElement(Substring(text))
    }

    /// Bus names, unique (":1.42") or well-known ("org.example.Name").
    public static func isValidBusName(_ text: String) -> Bool {
        guard text.utf8.count <= 255, !text.isEmpty else { return false }
        let unique = text.hasPrefix(":")
        let body = unique ? text.dropFirst() : Substring(text)
        let elements = body.split(separator: ".", omittingEmptySubsequences: false)
        guard elements.count >= 2 else { return false }
        return elements.allSatisfy { element in
            guard !element.isEmpty else { return false }
            if !unique, let first = element.utf8.first, first >= UInt8(ascii: "0"), first <= UInt8(ascii: "9") {
                return false
            }
            return element.utf8.allSatisfy { isNameByte($0) || $0 == UInt8(ascii: "-") }
        }
    }

    private static func isValidElement(_ element: Substring) -> Bool {
        guard let first = element.utf8.first else { return false }
        guard !(first >= UInt8(ascii: "0") && first <= UInt8(ascii: "9")) else { return false }
        return element.utf8.allSatisfy(isNameByte)
    }
}
