/// Text as it may go into a log line or an audit record, whoever wrote it.
///
/// Log lines quote what callers chose: the path of their executable, names
/// they sent. A journald stream starts a new entry at a line break, C0 or
/// Unicode, and reads a priority at its start (`<2>`), so a caller's text
/// could forge entries; megabytes of it would flood the log. Escaped, every
/// control character shows as what it is — C0 (`\n`, `\r`, `\t`, `\x1b`),
/// DEL (`\x7f`), C1 (`\u0085`) and the line and paragraph separators
/// (`\u2028`, `\u2029`) — with a backslash doubled so the escapes read back
/// unambiguously, and the text is cut at a bound, saying how much was cut.
public enum LogText {
    /// Bytes of escaped text one message or field carries at most.
    public static let limit = 4096

    public static func escaped(_ text: String, limit: Int = LogText.limit) -> String {
        var contiguous = text
        if contiguous.withUTF8({ $0.count <= limit && $0.allSatisfy(isPlain) }) { return text }
        var out = ""
        var written = 0
        var read = 0
        for scalar in text.unicodeScalars {
            let piece = escaped(scalar)
            guard written + piece.utf8.count <= limit else {
                return out + "… [\(text.utf8.count - read) bytes cut]"
            }
            out += piece
            written += piece.utf8.count
            read += UTF8.width(scalar)
        }
        return out
    }

    /// Printable ASCII other than the backslash: what needs no escape.
    private static func isPlain(_ byte: UInt8) -> Bool {
        byte >= 0x20 && byte < 0x7F && byte != UInt8(ascii: "\\")
    }

    private static func escaped(_ scalar: Unicode.Scalar) -> String {
        switch scalar.value {
        case 0x5C: return "\\\\"
        case 0x0A: return "\\n"
        case 0x0D: return "\\r"
        case 0x09: return "\\t"
        case 0x00..<0x20, 0x7F: return "\\x" + hex(scalar.value, digits: 2)
        case 0x80...0x9F, 0x2028, 0x2029: return "\\u" + hex(scalar.value, digits: 4)
        default: return String(scalar)
        }
    }

    private static func hex(_ value: UInt32, digits: Int) -> String {
        let text = String(value, radix: 16)
        return String(repeating: "0", count: max(0, digits - text.count)) + text
    }
}
