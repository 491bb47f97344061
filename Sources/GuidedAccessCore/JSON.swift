/// A small JSON reader and writer for the journal.
///
/// Why not Foundation's JSONEncoder: linking FoundationEssentials into the
/// daemon costs about 3.5 MB of resident memory (a static test binary: 5.3 MB
/// without, 8.8 MB with), a third of the idle budget. Numbers keep their
/// text, so a UInt64 deadline or a Double round-trips exactly.
enum JSON: Equatable {
    case null
    case bool(Bool)
    /// The number as written; converted by the reader of the field.
    case number(String)
    case string(String)
    case array([JSON])
    case object([(String, JSON)])

    static func == (a: JSON, b: JSON) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case (.bool(let x), .bool(let y)): return x == y
        case (.number(let x), .number(let y)): return x == y
        case (.string(let x), .string(let y)): return x == y
        case (.array(let x), .array(let y)): return x == y
        case (.object(let x), .object(let y)):
            return x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: return false
        }
    }

    struct ParseError: Error, CustomStringConvertible {
        let offset: Int
        let reason: String
        var description: String { "invalid JSON at byte \(offset): \(reason)" }
    }

    // MARK: Writing

    /// Indented, keys in the order given (callers sort them).
    func serialized() -> String {
        var out = ""
        write(into: &out, indent: 0)
        return out + "\n"
    }

    private func write(into out: inout String, indent: Int) {
        let pad = String(repeating: "  ", count: indent + 1)
        let closePad = String(repeating: "  ", count: indent)
        switch self {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .number(let n): out += n
        case .string(let s): JSON.quote(s, into: &out)
        case .array(let items):
            guard !items.isEmpty else {
                out += "[]"
                return
            }
            out += "[\n"
            for (i, item) in items.enumerated() {
                out += pad
                item.write(into: &out, indent: indent + 1)
                out += i + 1 < items.count ? ",\n" : "\n"
            }
            out += closePad + "]"
        case .object(let members):
            guard !members.isEmpty else {
                out += "{}"
                return
            }
            out += "{\n"
            for (i, (key, value)) in members.enumerated() {
                out += pad
                JSON.quote(key, into: &out)
                out += " : "
                value.write(into: &out, indent: indent + 1)
                out += i + 1 < members.count ? ",\n" : "\n"
            }
            out += closePad + "}"
        }
    }

    private static func quote(_ s: String, into out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }

    // MARK: Reading

    static func parse(_ bytes: [UInt8]) throws(ParseError) -> JSON {
        var parser = Parser(bytes: bytes)
        parser.skipSpace()
        let value = try parser.value(depth: 0)
        parser.skipSpace()
        guard parser.index == bytes.count else { throw parser.fail("trailing characters") }
        return value
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0

        func fail(_ reason: String) -> ParseError { ParseError(offset: index, reason: reason) }

        mutating func skipSpace() {
            while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
        }

        mutating func expect(_ literal: String) throws(ParseError) {
            for byte in literal.utf8 {
                guard index < bytes.count, bytes[index] == byte else { throw fail("expected '\(literal)'") }
                index += 1
            }
        }

        mutating func value(depth: Int) throws(ParseError) -> JSON {
            guard depth < 64 else { throw fail("nested too deeply") }
            guard index < bytes.count else { throw fail("unexpected end") }
            switch bytes[index] {
            case UInt8(ascii: "n"):
                try expect("null")
                return .null
            case UInt8(ascii: "t"):
                try expect("true")
                return .bool(true)
            case UInt8(ascii: "f"):
                try expect("false")
                return .bool(false)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "["):
                index += 1
                var items: [JSON] = []
                skipSpace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                    index += 1
                    return .array(items)
                }
                while true {
                    skipSpace()
                    items.append(try value(depth: depth + 1))
                    skipSpace()
                    guard index < bytes.count else { throw fail("unclosed array") }
                    if bytes[index] == UInt8(ascii: "]") {
                        index += 1
                        return .array(items)
                    }
                    try expect(",")
                }
            case UInt8(ascii: "{"):
                index += 1
                var members: [(String, JSON)] = []
                skipSpace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                    index += 1
                    return .object(members)
                }
                while true {
                    skipSpace()
                    guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a key") }
                    let key = try string()
                    skipSpace()
                    try expect(":")
                    skipSpace()
                    members.append((key, try value(depth: depth + 1)))
                    skipSpace()
                    guard index < bytes.count else { throw fail("unclosed object") }
                    if bytes[index] == UInt8(ascii: "}") {
                        index += 1
                        return .object(members)
                    }
                    try expect(",")
                }
            default:
                return .number(try number())
            }
        }

        mutating func number() throws(ParseError) -> String {
            let start = index
            while index < bytes.count,
                (bytes[index] >= UInt8(ascii: "0") && bytes[index] <= UInt8(ascii: "9"))
                    || [UInt8(ascii: "-"), UInt8(ascii: "+"), UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E")]
                    .contains(bytes[index])
            {
                index += 1
            }
            guard index > start else { throw fail("unexpected character") }
            return String(decoding: bytes[start..<index], as: UTF8.self)
        }

        mutating func string() throws(ParseError) -> String {
            index += 1  // the opening quote
            var scalars = String.UnicodeScalarView()
            var raw: [UInt8] = []
            func flush() throws(ParseError) {
                guard !raw.isEmpty else { return }
                guard let text = String(validating: raw, as: UTF8.self) else { throw fail("invalid UTF-8") }
                scalars.append(contentsOf: text.unicodeScalars)
                raw.removeAll()
            }
            while true {
                guard index < bytes.count else { throw fail("unclosed string") }
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    try flush()
                    return String(scalars)
                case UInt8(ascii: "\\"):
                    try flush()
                    guard index < bytes.count else { throw fail("unclosed string") }
                    let escape = bytes[index]
                    index += 1
                    switch escape {
                    case UInt8(ascii: "\""): scalars.append("\"")
                    case UInt8(ascii: "\\"): scalars.append("\\")
                    case UInt8(ascii: "/"): scalars.append("/")
                    case UInt8(ascii: "b"): scalars.append("\u{08}")
                    case UInt8(ascii: "f"): scalars.append("\u{0C}")
                    case UInt8(ascii: "n"): scalars.append("\n")
                    case UInt8(ascii: "r"): scalars.append("\r")
                    case UInt8(ascii: "t"): scalars.append("\t")
                    case UInt8(ascii: "u"):
                        var code = try hex4()
                        if (0xD800..<0xDC00).contains(code) {
                            try expect("\\u")
                            let low = try hex4()
                            guard (0xDC00..<0xE000).contains(low) else { throw fail("unpaired surrogate") }
                            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let scalar = Unicode.Scalar(code) else { throw fail("invalid \\u escape") }
                        scalars.append(scalar)
                    default: throw fail("invalid escape")
                    }
                case 0..<0x20:
                    throw fail("control character in a string")
                default:
                    raw.append(byte)
                }
            }
        }

        mutating func hex4() throws(ParseError) -> UInt32 {
            guard index + 4 <= bytes.count,
                let value = UInt32(String(decoding: bytes[index..<index + 4], as: UTF8.self), radix: 16)
            else { throw fail("invalid \\u escape") }
            index += 4
            return value
        }
    }

    // MARK: Access

    subscript(key: String) -> JSON? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0 == key }?.1
    }
}
