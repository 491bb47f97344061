import Glibc
import Logging
import Synchronization

/// The daemon's log lines on stderr, one write per line, never waiting.
///
/// Under systemd stderr is journald's stream: systemd then sets
/// `JOURNAL_STREAM` to stderr's `DEVICE:INODE` (systemd.exec(5)), and each
/// line starts with its syslog priority in angle brackets (sd-daemon(3)'s
/// `SD_ERR`…), which journald takes as the entry's PRIORITY, so
/// `journalctl -p warning` finds the service's warnings; there is no
/// timestamp of our own, the journal has one. Elsewhere (a terminal, a
/// file, a test) the lines are swift-log's `StreamLogHandler` lines.
/// Either way events come escaped (`EscapingLogHandler`): a line break in a
/// message would start an entry with a priority of its own.
struct StderrLogHandler: LogHandler {
    let label: String
    /// `<PRIORITY>` lines for journald's stream, or timestamped ones.
    let journal: Bool
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    init(label: String, journal: Bool) {
        self.label = label
        self.journal = journal
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        let pretty = all.isEmpty ? "" : " " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        let text =
            journal
            ? "<\(Self.priority(of: event.level))>\(label): [\(event.source)] \(event.message)\(pretty)\n"
            : "\(Self.timestamp()) \(event.level) \(label):\(pretty) [\(event.source)] \(event.message)\n"
        StderrSink.shared.write(text) { dropped in
            let message = "\(dropped) log lines were not written: stderr was not being read"
            return journal
                ? "<4>\(label): [\(event.source)] \(message)\n"
                : "\(Self.timestamp()) warning \(label): [\(event.source)] \(message)\n"
        }
    }

    /// syslog(3)'s priorities, as sd-daemon(3) prefixes them.
    static func priority(of level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }

    /// As `StreamLogHandler`'s: local time, to the second.
    static func timestamp() -> String {
        var buffer = [CChar](repeating: 0, count: 64)
        var now = time(nil)
        var local = tm()
        guard localtime_r(&now, &local) != nil else { return "<unknown>" }
        strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &local)
        return String(cString: buffer)
    }

    /// Whether file descriptor 2 is the stream `JOURNAL_STREAM` names.
    static var stderrIsTheJournal: Bool {
        guard let value = getenv("JOURNAL_STREAM").map({ String(cString: $0) }) else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var status = stat()
        guard fstat(2, &status) == 0 else { return false }
        return UInt64(status.st_dev) == device && UInt64(status.st_ino) == inode
    }
}

/// Writes to stderr without ever waiting for its reader. A socket (journald's
/// stream) is written with `MSG_DONTWAIT`; a pipe through a descriptor of its
/// own opened non-blocking (the flag on stderr's own would also make the
/// programs the service starts, which share it, meet EAGAIN); a file or a
/// terminal as it is. What the reader has no room for waits in a buffer of
/// `limit` bytes, written before the next line; lines that do not fit are
/// dropped and counted, and once the buffer has drained a line says how
/// many. Lines from several threads never interleave.
final class StderrSink: Sendable {
    static let shared = StderrSink()
    static let limit = 64 << 10

    private enum Kind {
        case socket
        case pipe(Int32)
        case blocking
    }

    private struct State {
        var pending: [UInt8] = []
        var dropped = 0
    }

    private let kind: Kind
    private let state = Mutex(State())

    private init() {
        var status = stat()
        guard fstat(2, &status) == 0 else {
            kind = .blocking
            return
        }
        switch status.st_mode & S_IFMT {
        case S_IFSOCK:
            kind = .socket
        case S_IFIFO:
            // A new open file description of the same pipe.
            let fd = open("/proc/self/fd/2", O_WRONLY | O_NONBLOCK | O_CLOEXEC)
            kind = fd >= 0 ? .pipe(fd) : .blocking
        default:
            kind = .blocking
        }
    }

    /// Writes `line` (one whole line); `report(n)`: the line that says `n`
    /// lines were dropped.
    func write(_ line: String, report: (Int) -> String) {
        state.withLock { state in
            if !state.pending.isEmpty {
                let n = put(state.pending)
                state.pending.removeFirst(n)
            }
            if state.pending.isEmpty, state.dropped > 0 {
                let text = Array(report(state.dropped).utf8)
                state.dropped = 0
                state.pending = Array(text[put(text)...])
            }
            let bytes = Array(line.utf8)
            if state.pending.isEmpty {
                state.pending = Array(bytes[put(bytes)...])
            } else if state.pending.count + bytes.count <= Self.limit {
                state.pending += bytes
            } else {
                state.dropped += 1
            }
        }
    }

    /// Writes what the reader takes now; how much.
    private func put(_ bytes: [UInt8]) -> Int {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw -> Int in
                let start = raw.baseAddress! + offset, count = raw.count - offset
                switch kind {
                case .socket: return send(2, start, count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
                case .pipe(let fd): return Glibc.write(fd, start, count)
                case .blocking: return Glibc.write(2, start, count)
                }
            }
            if n > 0 {
                offset += n
            } else if n < 0, errno == EINTR {
                continue
            } else {
                break  // EAGAIN: kept for later; another error: nothing more will go
            }
        }
        return offset
    }
}
