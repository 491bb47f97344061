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
    /// (1.2) A session agent registered; one was refused; the registered
    /// one was lost (it left the bus, or is no longer admitted).
    case agentRegistered, agentRefused, agentLost
    /// Records that journald did not take (it was not reading: stalled,
    /// restarting) were dropped, not waited for; written once it reads again.
    case recordsDropped
    /// (1.2) A launcher attached the kiosk browser (`AttachBrowser`).
    case browserAttached

    public var messageID: String {
        switch self {
        case .sessionStarted: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a51"
        case .sessionResumed: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a52"
        case .sessionEnded: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a53"
        case .featuresChanged: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a54"
        case .restrictionChanged: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a55"
        case .callDenied: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a56"
        case .programGaveUp: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a57"
        case .agentRegistered: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a58"
        case .agentRefused: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a59"
        case .agentLost: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a5a"
        case .recordsDropped: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a5b"
        case .browserAttached: return "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a5c"
        }
    }

    /// syslog priority: a refusal or a lost agent is a warning, a program
    /// given up on an error.
    var priority: Int {
        switch self {
        case .callDenied, .agentRefused, .agentLost, .recordsDropped: return 4
        case .programGaveUp: return 3
        default: return 5
        }
    }
}

/// Sends audit records to journald over its native protocol (a datagram of
/// `KEY=value` fields to /run/systemd/journal/socket); where journald is
/// absent, the record goes to the log (stderr) instead.
///
/// Never waits for journald: a record it does not take at once (its queue
/// is full — journald stalled or restarting, and callers refused faster
/// than it reads) is dropped and counted, and the next record it takes is
/// preceded by a `recordsDropped` record with the count. A service that
/// waited would stop answering every caller.
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
        let datagram = Self.datagram(event, caller: caller, message, fields: fields)
        let dropped = journal.dropped
        if dropped > 0 {
            let note = "\(dropped) audit records were not written: journald was not reading"
            let report = Self.datagram(.recordsDropped, caller: nil, note, fields: ["DROPPED": String(dropped)])
            if journal.send(report.bytes, replacing: dropped) == .sent { logger.warning("audit: \(note)") }
        }
        if journal.send(datagram.bytes) == .unavailable {
            // At the record's own priority: a refusal is a warning. The
            // fields as the datagram has them (escaped), MESSAGE aside.
            let text = datagram.bytes.split(separator: UInt8(ascii: "\n")).dropFirst()
                .map { String(decoding: $0, as: UTF8.self) }.joined(separator: " ")
            let level: Logger.Level = event.priority <= 3 ? .error : event.priority == 4 ? .warning : .notice
            logger.log(level: level, "audit: \(message) [\(text)]")
        }
    }

    /// One datagram in journald's native format, `NAME=value` lines (the
    /// fields in order; `record` builds its own the same way). Values
    /// are escaped and bounded (`LogText`): a caller's executable path is
    /// the caller's choice, and a record read as text (`journalctl -o
    /// cat`, syslog forwarding) must not show lines the caller wrote.
    static func datagram(_ fields: [(String, String)]) -> [UInt8] {
        var datagram = Datagram()
        for (name, value) in fields { datagram.append(name, value) }
        return datagram.bytes
    }

    /// A record's datagram: its message, id, priority and event, the
    /// caller, then `fields` as `GUIDEDACCESS_NAME`, in name order.
    private static func datagram(
        _ event: AuditEvent, caller: CallerIdentity?, _ message: String, fields: [String: String]
    ) -> Datagram {
        var datagram = Datagram()
        func append(_ name: String, _ value: String) { datagram.append(name, value) }
        append("MESSAGE", message)
        append("MESSAGE_ID", event.messageID)
        append("PRIORITY", String(event.priority))
        append("SYSLOG_IDENTIFIER", "guidedaccessd")
        append("GUIDEDACCESS_EVENT", event.rawValue)
        if let caller {
            append("GUIDEDACCESS_CALLER_UID", String(caller.uid))
            append("GUIDEDACCESS_CALLER_PID", String(caller.pid))
            append("GUIDEDACCESS_CALLER_EXE", caller.executablePath ?? "")
            append("GUIDEDACCESS_CALLER_UNIT", caller.systemdUnit ?? "")
            // (1.2) A page of the kiosk browser; the caller is then its launcher.
            if let origin = caller.origin { append("GUIDEDACCESS_ORIGIN", origin) }
        }
        for (name, value) in fields.sorted(by: { $0.key < $1.key }) { append("GUIDEDACCESS_" + name, value) }
        return datagram
    }

    struct Datagram {
        private(set) var bytes: [UInt8] = []

        init() { bytes.reserveCapacity(512) }

        mutating func append(_ name: String, _ value: String) {
            bytes += name.utf8
            bytes.append(UInt8(ascii: "="))
            bytes += LogText.escaped(value).utf8
            bytes.append(UInt8(ascii: "\n"))
        }
    }
}

/// A datagram socket connected to journald's, made on first use and kept;
/// made again once when a send fails (journald restarted). Non-blocking: a
/// datagram journald has no room for is dropped and counted.
final class JournalSocket: Sendable {
    let path: String
    private let fd = Mutex<Int32>(-1)
    private let droppedCount = Mutex(0)

    enum Outcome: Equatable {
        case sent
        /// journald is there but did not take it now (counted in `dropped`).
        case dropped
        /// No journald to send to.
        case unavailable
    }

    /// Datagrams dropped since the last `send(_:replacing:)` that went out.
    var dropped: Int { droppedCount.withLock { $0 } }
    /// When connecting last failed (CLOCK_MONOTONIC, seconds): no journald.
    /// Tried again a second later, not for every record.
    private let failedAt = Mutex<Int?>(nil)

    init(path: String) {
        self.path = path
    }

    deinit {
        fd.withLock { if $0 >= 0 { close($0) } }
    }

    /// Sends without waiting. `replacing`: the datagram reports that many
    /// dropped ones, and the count goes down by that much once it is sent.
    func send(_ datagram: [UInt8], replacing reported: Int = 0) -> Outcome {
        let outcome = fd.withLock { fd -> Outcome in
            for attempt in 0..<2 {
                if fd < 0 || attempt > 0 {
                    if fd >= 0 { close(fd) }
                    var now = timespec()
                    clock_gettime(CLOCK_MONOTONIC, &now)
                    if fd < 0, let failed = failedAt.withLock({ $0 }), now.tv_sec - failed < 1 { return .unavailable }
                    fd = connected()
                    guard fd >= 0 else {
                        failedAt.withLock { $0 = now.tv_sec }
                        return .unavailable
                    }
                    failedAt.withLock { $0 = nil }
                }
                let sent = datagram.withUnsafeBytes {
                    Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                }
                if sent == datagram.count { return .sent }
                // journald's queue is full: it is there, only not reading.
                if sent < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return .dropped }
            }
            return .unavailable
        }
        droppedCount.withLock { count in
            switch outcome {
            case .sent: count -= reported
            case .dropped: count += reported > 0 ? 0 : 1
            case .unavailable: break
            }
        }
        return outcome
    }

    private func connected() -> Int32 {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return -1 }
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            for (i, byte) in bytes.enumerated() { buffer[i] = byte }
        }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
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
