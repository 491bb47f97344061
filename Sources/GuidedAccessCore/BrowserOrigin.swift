/// (1.2) A web origin as `[Browser] AllowOrigins=` lists it and Chromium
/// reports a document's: `scheme://host[:port]`, http or https, the host
/// in lower case, the port only when not the scheme's default, nothing
/// after it. Opaque origins (`file://`, `data:`, sandboxed frames, which
/// Chromium reports as `null` or `file://`) are never one.
public enum BrowserOrigin {
    /// Whether `text` is an origin in that exact form.
    public static func isValid(_ text: String) -> Bool { problem(text) == nil }

    /// Why `text` is not an origin in that form; nil when it is.
    public static func problem(_ text: String) -> String? {
        let scheme: String, rest: Substring
        if text.hasPrefix("https://") {
            (scheme, rest) = ("https", text.dropFirst(8))
        } else if text.hasPrefix("http://") {
            (scheme, rest) = ("http", text.dropFirst(7))
        } else {
            return "not http:// or https:// (file://, data: and other opaque origins are never allowed)"
        }
        guard !rest.isEmpty else { return "no host" }
        guard !rest.contains("/") else { return "an origin has no path, not even a trailing '/'" }
        var host = rest, port: Substring?
        if let bracket = rest.lastIndex(of: "]") {
            // [IPv6]
            guard rest.first == "[" else { return "a malformed host" }
            host = rest[...bracket]
            let after = rest[rest.index(after: bracket)...]
            if !after.isEmpty {
                guard after.first == ":" else { return "a malformed host" }
                port = after.dropFirst()
            }
        } else if let colon = rest.lastIndex(of: ":") {
            host = rest[..<colon]
            port = rest[rest.index(after: colon)...]
        }
        guard !host.isEmpty, host.utf8.count <= 253 else { return "no host" }
        let allowed = host.first == "["
            ? host.allSatisfy { $0.isHexDigit && !$0.isUppercase || $0 == ":" || $0 == "." || $0 == "[" || $0 == "]" }
            : host.allSatisfy { ($0.isASCII && ($0.isLowercase || $0.isNumber)) || $0 == "-" || $0 == "." }
        guard allowed else { return "the host must be in lower case, letters, digits, '-' and '.' (as the browser reports it)" }
        if let port {
            guard let number = UInt16(port), number > 0, String(number) == port else { return "port '\(port)' is not 1…65535" }
            if (scheme == "http" && number == 80) || (scheme == "https" && number == 443) {
                return "the browser reports the default port \(number) of \(scheme) without it: leave it out"
            }
        }
        return nil
    }
}
