/// A small JSON reader and writer for the journal and the browser layer's
/// DevTools messages (`package`: for the BrowserLayer module).
///
/// Why not Foundation's JSONEncoder: linking FoundationEssentials into the
/// daemon costs about 3.5 MB of resident memory (a static test binary: 5.3 MB
/// without, 8.8 MB with), a third of the idle budget. Numbers keep their
/// text, so a UInt64 deadline or a Double round-trips exactly.
package enum JSON: Equatable, Sendable {
    case null
    case bool(Bool)
    /// The number as written; converted by the reader of the field.
    case number(String)
    case string(String)
    case array([JSON])
    case object([(String, JSON)])

    package static func == (a: JSON, b: JSON) -> Bool {
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

    package struct ParseError: Error, CustomStringConvertible {
        package let offset: Int
        package let reason: String
        package var description: String { "invalid JSON at byte \(offset): \(reason)" }
    }

    // MARK: Writing

    /// Indented, keys in the order given (callers sort them).
    func serialized() -> String {
        String(decoding: serializedBytes(), as: UTF8.self)
    }

    /// `serialized()` in UTF-8, written straight into bytes: the journal is
    /// written on every change, and building it through String appends (one
    /// per character of a string) cost more than the system calls that store
    /// it. `capacity` is reserved up front; the journal passes its block size.
    func serializedBytes(reservingCapacity capacity: Int = 1024) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(capacity)
        write(into: &out, indent: 0)
        out.append(UInt8(ascii: "\n"))
        return out
    }

    /// On one line, no spaces: a DevTools message.
    package func compactBytes() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        write(into: &out, indent: nil)
        return out
    }

    /// `indent` nil: compact.
    private func write(into out: inout [UInt8], indent: Int?) {
        switch self {
        case .null: JSON.append("null", to: &out)
        case .bool(let b): JSON.append(b ? "true" : "false", to: &out)
        case .number(let n): JSON.append(utf8Of: n, to: &out)
        case .string(let s): JSON.quote(s, into: &out)
        case .array(let items):
            guard !items.isEmpty else {
                JSON.append("[]", to: &out)
                return
            }
            guard let indent else {
                out.append(UInt8(ascii: "["))
                for (i, item) in items.enumerated() {
                    if i > 0 { out.append(UInt8(ascii: ",")) }
                    item.write(into: &out, indent: nil)
                }
                out.append(UInt8(ascii: "]"))
                return
            }
            JSON.append("[\n", to: &out)
            for (i, item) in items.enumerated() {
                JSON.pad(indent + 1, into: &out)
                item.write(into: &out, indent: indent + 1)
                JSON.append(i + 1 < items.count ? ",\n" : "\n", to: &out)
            }
            JSON.pad(indent, into: &out)
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            guard !members.isEmpty else {
                JSON.append("{}", to: &out)
                return
            }
            guard let indent else {
                out.append(UInt8(ascii: "{"))
                for (i, (key, value)) in members.enumerated() {
                    if i > 0 { out.append(UInt8(ascii: ",")) }
                    JSON.quote(key, into: &out)
                    out.append(UInt8(ascii: ":"))
                    value.write(into: &out, indent: nil)
                }
                out.append(UInt8(ascii: "}"))
                return
            }
            JSON.append("{\n", to: &out)
            for (i, (key, value)) in members.enumerated() {
                JSON.pad(indent + 1, into: &out)
                JSON.quote(key, into: &out)
                JSON.append(" : ", to: &out)
                value.write(into: &out, indent: indent + 1)
                JSON.append(i + 1 < members.count ? ",\n" : "\n", to: &out)
            }
            JSON.pad(indent, into: &out)
            out.append(UInt8(ascii: "}"))
        }
    }

    /// Byte by byte: the literals are a few bytes long, and a single append
    /// is inlined where `append(contentsOf:)` is a call.
    @inline(__always)
    private static func append(_ literal: StaticString, to out: inout [UInt8]) {
        // withUTF8Buffer, not utf8Start: a one-character literal may be stored as a scalar.
        literal.withUTF8Buffer { for byte in $0 { out.append(byte) } }
    }

    private static func append(utf8Of text: String, to out: inout [UInt8]) {
        if text.utf8.withContiguousStorageIfAvailable({ out.append(contentsOf: $0) }) == nil {
            out.append(contentsOf: text.utf8)
        }
    }

    /// Two spaces per level.
    private static func pad(_ indent: Int, into out: inout [UInt8]) {
        for _ in 0..<indent {
            out.append(UInt8(ascii: " "))
            out.append(UInt8(ascii: " "))
        }
    }

    /// The string in quotes; `"`, `\`, and the control characters below
    /// U+0020 escaped (`\n`, `\r`, `\t`, else `\u00xx` in lower-case hex),
    /// everything else as it is, in UTF-8. Only ASCII bytes are ever escaped,
    /// and every byte of a non-ASCII scalar's UTF-8 is 0x80 or more, so the
    /// scan goes by bytes, and copies the runs between escapes whole.
    private static func quote(_ s: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        if s.utf8.withContiguousStorageIfAvailable({ quote(utf8: $0, into: &out) }) == nil {
            var contiguous = s
            contiguous.makeContiguousUTF8()
            contiguous.utf8.withContiguousStorageIfAvailable { quote(utf8: $0, into: &out) }
        }
        out.append(UInt8(ascii: "\""))
    }

    private static func quote(utf8 bytes: UnsafeBufferPointer<UInt8>, into out: inout [UInt8]) {
        var start = 0
        for i in bytes.indices {
            let byte = bytes[i]
            guard byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") else { continue }
            if start < i { out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<i])) }
            start = i + 1
            switch byte {
            case UInt8(ascii: "\""): append("\\\"", to: &out)
            case UInt8(ascii: "\\"): append("\\\\", to: &out)
            case UInt8(ascii: "\n"): append("\\n", to: &out)
            case UInt8(ascii: "\r"): append("\\r", to: &out)
            case UInt8(ascii: "\t"): append("\\t", to: &out)
            default:
                let hex: StaticString = "0123456789abcdef"
                append("\\u00", to: &out)
                hex.withUTF8Buffer { digits in
                    out.append(digits[Int(byte >> 4)])
                    out.append(digits[Int(byte & 0x0F)])
                }
            }
        }
        if start < bytes.count { out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start...])) }
    }

    // MARK: Reading

    package static func parse(_ bytes: [UInt8]) throws(ParseError) -> JSON {
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

    package subscript(key: String) -> JSON? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0 == key }?.1
    }
}
