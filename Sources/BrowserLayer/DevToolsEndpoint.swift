/// `[Browser] DevToolsEndpoint=`: the kiosk browser's `--remote-debugging-port`,
/// as a loopback `http://` address (spec: "Browser layer").
///
/// Only loopback: whoever listens there is given the power to restyle the
/// kiosk's pages, and the DevTools protocol has no authentication, so the
/// address must not be one another machine can answer on. Only an address
/// literal (or `localhost`, taken as 127.0.0.1): a name that needs a resolver
/// could resolve elsewhere.
public struct DevToolsEndpoint: Hashable, Sendable, CustomStringConvertible {
    /// The IP address literal as it goes into a URL's authority: `127.0.0.1`, `[::1]`.
    public let host: String
    public let port: UInt16
    /// The address family's literal without brackets, for the socket.
    public let address: Address

    public enum Address: Hashable, Sendable {
        /// In network byte order's numbers, most significant first.
        case ipv4(UInt8, UInt8, UInt8, UInt8)
        case ipv6Loopback
    }

    public var description: String { "http://\(host):\(port)" }
    var isIPv6: Bool { address == .ipv6Loopback }
    /// The `Host` header (and the authority the browser's WebSocket URL must have).
    public var authority: String { "\(host):\(port)" }

    /// Parses `http://HOST:PORT` with an optional trailing `/`; the reason
    /// when it is not one.
    public static func parse(_ text: String) -> Result<DevToolsEndpoint, EndpointError> {
        let scheme = "http://"
        // A URL's scheme is case-insensitive (RFC 3986).
        guard text.prefix(scheme.count).lowercased() == scheme else {
            return .failure(EndpointError("expected a loopback http:// address such as http://127.0.0.1:9222"))
        }
        var rest = Substring(text.dropFirst(scheme.count))
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        if let bad = rest.first(where: { "/?#@ \t".contains($0) }) {
            return .failure(EndpointError("expected only a host and a port after http://, found '\(bad)'"))
        }
        let hostPart: Substring, portPart: Substring
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return .failure(EndpointError("unclosed '[' in the host")) }
            hostPart = rest[...close]
            let after = rest[rest.index(after: close)...]
            guard after.hasPrefix(":") else { return .failure(EndpointError("expected ':PORT' after the host")) }
            portPart = after.dropFirst()
        } else {
            guard let colon = rest.lastIndex(of: ":") else {
                return .failure(EndpointError("expected ':PORT' after the host: the browser's --remote-debugging-port"))
            }
            hostPart = rest[..<colon]
            portPart = rest[rest.index(after: colon)...]
        }
        guard !portPart.isEmpty, portPart.allSatisfy({ $0.isASCII && $0.isNumber }), let port = UInt16(portPart), port > 0
        else {
            return .failure(EndpointError("port '\(portPart)' is not a number from 1 to 65535"))
        }
        switch hostPart.lowercased() {
        case "localhost":
            return .success(DevToolsEndpoint(host: "127.0.0.1", port: port, address: .ipv4(127, 0, 0, 1)))
        case "[::1]", "[0:0:0:0:0:0:0:1]":
            return .success(DevToolsEndpoint(host: "[::1]", port: port, address: .ipv6Loopback))
        default:
            let octets = hostPart.split(separator: ".", omittingEmptySubsequences: false)
            let numbers = octets.compactMap { octet -> UInt8? in
                // No leading zeros: inet_aton would read 010 as octal.
                guard !octet.isEmpty, octet.count <= 3, octet.allSatisfy({ $0.isASCII && $0.isNumber }),
                    octet == "0" || !octet.hasPrefix("0")
                else { return nil }
                return UInt8(octet)
            }
            guard octets.count == 4, numbers.count == 4 else {
                return .failure(
                    EndpointError(
                        "host '\(hostPart)' is not a loopback address: expected 127.x.x.x, [::1] or localhost"))
            }
            guard numbers[0] == 127 else {
                return .failure(
                    EndpointError(
                        "host '\(hostPart)' is not a loopback address: the DevTools protocol has no authentication, so only 127.x.x.x, [::1] or localhost"
                    ))
            }
            let host = numbers.map(String.init).joined(separator: ".")
            return .success(
                DevToolsEndpoint(
                    host: host, port: port, address: .ipv4(numbers[0], numbers[1], numbers[2], numbers[3])))
        }
    }

    public struct EndpointError: Error, Hashable, Sendable, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }
}
