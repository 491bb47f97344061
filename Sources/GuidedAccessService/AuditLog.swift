import Glibc
import GuidedAccessCore
import Logging
import Synchronization

/// What the audit trail records: one structured journald record per event,
/// with a stable MESSAGE_ID per kind so that `journalctl MESSAGE_ID=…` finds
/// them all.
public enum AuditEvent: String, Sendable, CaseIterable {
    case sessionStarted, sessionResumed, sessionEnded, featuresChanged, restrictionChanged, callDenied
    /// A program the service runs for a feature (the screen reader) exited
    /// too often; it stays off.
    case programGaveUp

    public var messageID: String {
        switch self {
        case .sessionStarted: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a51"
        case .sessionResumed: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a52"
        case .sessionEnded: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a53"
        case .featuresChanged: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a54"
        case .restrictionChanged: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a55"
        case .callDenied: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a56"
        case .programGaveUp: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a57"
        }
    }

    /// syslog priority: a refusal is a warning, a program given up on an error.
    var priority: Int {
        switch self {
        case .callDenied: return 4
        case .programGaveUp: return 3
        default: return 5
        }
    }
}

/// Sends audit records to journald over its native protocol (a datagram of
/// `KEY=value` fields to /run/systemd/journal/socket); where journald is
/// absent, the record goes to the log (stderr) instead.
public struct AuditLog: Sendable {
    public let socketPath: String
    let logger: Logger
    private let journal: JournalSocket

    public init(socketPath: String = "/run/systemd/journal/socket", logger: Logger) {
        self.socketPath = socketPath
        self.logger = logger
        journal = JournalSocket(path: socketPath)
    }

    public func record(
        _ event: AuditEvent, caller: CallerIdentity?, _ message: String, fields: [String: String] = [:]
    ) {
        var all: [(String, String)] = [
            ("MESSAGE", message), ("MESSAGE_ID", event.messageID), ("PRIORITY", String(event.priority)),
            ("SYSLOG_IDENTIFIER", "guidedaccessd"), ("GUIDEDACCESS_EVENT", event.rawValue),
        ]
        if let caller {
            all.append(("GUIDEDACCESS_CALLER_UID", String(caller.uid)))
            all.append(("GUIDEDACCESS_CALLER_PID", String(caller.pid)))
            all.append(("GUIDEDACCESS_CALLER_EXE", caller.executablePath ?? ""))
            all.append(("GUIDEDACCESS_CALLER_UNIT", caller.systemdUnit ?? ""))
        }
        all += fields.sorted { $0.key < $1.key }.map { ("GUIDEDACCESS_" + $0.key, $0.value) }
        if !journal.send(Self.datagram(all)) {
            // At the record's own priority: a refusal is a warning.
            let text = all.dropFirst().map { "\($0.0)=\($0.1)" }.joined(separator: " ")
            let level: Logger.Level = event.priority <= 3 ? .error : event.priority == 4 ? .warning : .notice
            logger.log(level: level, "audit: \(message) [\(text)]")
        }
    }

    /// One datagram in journald's native format, `NAME=value` lines. Values
    /// are escaped and bounded (`LogText`): a caller's executable path is
    /// the caller's choice, and a record read as text (`journalctl -o
    /// cat`, syslog forwarding) must not show lines the caller wrote.
    static func datagram(_ fields: [(String, String)]) -> [UInt8] {
        var datagram: [UInt8] = []
        datagram.reserveCapacity(512)
        for (name, value) in fields {
            datagram += name.utf8
            datagram.append(UInt8(ascii: "="))
            datagram += LogText.escaped(value).utf8
            datagram.append(UInt8(ascii: "\n"))
        }
        return datagram
    }
}

/// A datagram socket connected to journald's, made on first use and kept;
/// made again once when a send fails (journald restarted).
final class JournalSocket: Sendable {
    let path: String
    private let fd = Mutex<Int32>(-1)

    init(path: String) {
        self.path = path
    }

    deinit {
        fd.withLock { if $0 >= 0 { close($0) } }
    }

    /// Whether journald took the datagram.
    func send(_ datagram: [UInt8]) -> Bool {
        fd.withLock { fd in
            for attempt in 0..<2 {
                if fd < 0 || attempt > 0 {
                    if fd >= 0 { close(fd) }
                    fd = connected()
                    guard fd >= 0 else { return false }
                }
                let sent = datagram.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if sent == datagram.count { return true }
            }
            return false
        }
    }

    private func connected() -> Int32 {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return -1 }
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            for (i, byte) in bytes.enumerated() { buffer[i] = byte }
        }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return -1 }
        let result = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard result == 0 else {
            close(fd)
            return -1
        }
        return fd
    }
}
