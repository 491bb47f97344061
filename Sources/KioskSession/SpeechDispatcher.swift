import Glibc
import Logging

/// speech-dispatcher, spoken to in its own protocol (SSIP) over its socket.
enum SpeechDispatcher {
    /// Cancels every message of every client: what a stopped screen reader
    /// left queued or playing. Fire and forget — a local stream socket
    /// takes these few bytes at once, so the loop never waits; nothing
    /// listening (no speech-dispatcher running) is nothing to cancel.
    static func cancelAll(environment: [String: String], logger: Logger) {
        guard let path = socketPath(environment) else { return }
        guard let fd = UnixSocket.connect(path) else { return }
        defer { close(fd) }
        let commands = Array("SET self CLIENT_NAME guidedaccess:guidedaccessd:cancel\r\nCANCEL all\r\nQUIT\r\n".utf8)
        let written = commands.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if written == commands.count {
            logger.info("screen-reader: speech still queued in speech-dispatcher cancelled")
        } else {
            logger.warning("screen-reader: cannot cancel queued speech at \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// `SPEECHD_ADDRESS` (`unix_socket:PATH`), else speech-dispatcher's default
    /// `$XDG_RUNTIME_DIR/speech-dispatcher/speechd.sock`.
    static func socketPath(_ environment: [String: String]) -> String? {
        if let address = environment["SPEECHD_ADDRESS"] {
            let parts = address.split(separator: ":", maxSplits: 1).map(String.init)
            guard parts.first == "unix_socket" else { return nil }
            if parts.count == 2, !parts[1].isEmpty { return parts[1] }
        }
        return environment["XDG_RUNTIME_DIR"].map { $0 + "/speech-dispatcher/speechd.sock" }
    }
}
