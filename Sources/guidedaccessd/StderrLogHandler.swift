import CLinux
import DBus
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
        StderrSink.shared.write(text)
    }

    /// The line that says `dropped` lines were not written.
    static func droppedLine(_ dropped: Int, journal: Bool) -> String {
        let message = "\(dropped) log lines were not written: stderr was not being read"
        return journal
            ? "<4>guidedaccessd: [guidedaccessd] \(message)\n"
            : "\(timestamp()) warning guidedaccessd: [guidedaccessd] \(message)\n"
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
/// `limit` bytes, written before the next line and whenever the reader
/// makes room (epoll, once `attach(to:)` has given it the loop: a quiet
/// service too writes what waits); lines that do not fit are dropped and
/// counted, and once the buffer has drained a line says how many. Lines
/// from several threads never interleave.
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
        var report: @Sendable (Int) -> String = { "\($0) log lines were not written\n" }
        var loop: EventLoop?
        /// Watching for room while something waits.
        var watch: EventLoop.SourceToken?
        /// The reader is gone (hang-up, error): never watched again.
        var gone = false
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

    /// `report(n)`: the line that says `n` lines were dropped.
    func configure(report: @escaping @Sendable (Int) -> String) {
        state.withLock { $0.report = report }
    }

    /// From now on what waits is written as soon as the reader makes room.
    func attach(to loop: EventLoop) {
        state.withLock { $0.loop = loop }
    }

    /// Writes `line` (one whole line).
    func write(_ line: String) {
        state.withLock { state in
            flush(&state)
            let bytes = Array(line.utf8)
            if state.pending.isEmpty {
                state.pending = Array(bytes[put(bytes)...])
            } else if state.pending.count + bytes.count <= Self.limit {
                state.pending += bytes
            } else {
                state.dropped += 1
            }
            watchForRoom(&state)
        }
    }

    /// Writes what waits, then (all of it written) the count of the lines
    /// dropped.
    private func flush(_ state: inout State) {
        if !state.pending.isEmpty {
            let n = put(state.pending)
            state.pending.removeFirst(n)
        }
        if state.pending.isEmpty, state.dropped > 0 {
            let text = Array(state.report(state.dropped).utf8)
            state.dropped = 0
            state.pending = Array(text[put(text)...])
        }
    }

    /// Watches the descriptor for room while something waits; not otherwise
    /// (a writable descriptor would wake the loop at every turn).
    private func watchForRoom(_ state: inout State) {
        let fd: Int32
        switch kind {
        case .socket: fd = 2
        case .pipe(let own): fd = own
        case .blocking: return
        }
        guard let loop = state.loop else { return }
        let waiting = (!state.pending.isEmpty || state.dropped > 0) && !state.gone
        if waiting, state.watch == nil {
            state.watch = loop.addSource(fd: fd, events: UInt32(EPOLLOUT.rawValue)) { [self] events in
                self.state.withLock { state in
                    if events & (EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0 {
                        // No reader will come back: reported as often as epoll asks, it would spin.
                        state.gone = true
                        state.pending = []
                    } else {
                        flush(&state)
                    }
                    watchForRoom(&state)
                }
            }
        } else if !waiting, let watch = state.watch {
            loop.removeSource(watch, fd: fd)
            state.watch = nil
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
