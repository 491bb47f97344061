extension StringProtocol {
    /// Without the ASCII whitespace at either end: space, tab, newline,
    /// vertical tab, form feed and carriage return (GLib's g_ascii_isspace,
    /// as dconf's profile and keyfile readers use it).
    public var trimmingASCIIWhitespace: SubSequence {
        let isSpace: (Character) -> Bool = {
            $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\u{0B}" || $0 == "\u{0C}" || $0 == "\r"
        }
        guard let first = firstIndex(where: { !isSpace($0) }), let last = lastIndex(where: { !isSpace($0) }) else {
            return self[endIndex...]
        }
        return self[first...last]
    }
}
