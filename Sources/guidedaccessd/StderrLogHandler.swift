import Glibc
import Logging

/// Log lines for journald, when stderr is its stream: systemd then sets
/// `JOURNAL_STREAM` to stderr's `DEVICE:INODE` (systemd.exec(5)). Each line
/// starts with its syslog priority in angle brackets (sd-daemon(3)'s
/// `SD_ERR`…), which journald takes as the entry's PRIORITY, so
/// `journalctl -p warning` finds the service's warnings; there is no
/// timestamp of our own, the journal has one. Elsewhere (a terminal, a file,
/// a test) swift-log's `StreamLogHandler` lines are used. Either way events
/// come escaped (`EscapingLogHandler`): a line break in a message would
/// start an entry with a priority of its own.
struct JournalStreamLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    init(label: String) {
        self.label = label
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        // As StreamLogHandler's lines, without the timestamp and the level.
        var text = "<\(Self.priority(of: event.level))>\(label): [\(event.source)] \(event.message)"
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        if !all.isEmpty {
            text += " " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        }
        text += "\n"
        // One write per line: lines of several threads never interleave.
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeMutableBytes { write(2, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 {
                if errno == EINTR { continue }
                return
            }
            offset += n
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
