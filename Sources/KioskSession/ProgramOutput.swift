import CLinux
import DBus
import Glibc
import Logging

/// What a program the service started as its child writes (stdout and
/// stderr, one pipe), logged line by line as that program's — `orca[PID]:
/// …` at info level — never passed through as the service's own lines: a
/// traceback Orca prints while it stops is not a warning of the service.
/// (A program run as a transient unit writes to the journal under its own
/// name already.)
///
/// Bounded: a line is cut at 1,000 bytes, and at most 100 lines are logged
/// per 10 s (then how many were left out); the pipe is always drained, so a
/// chatty program never blocks on it. It reads until every holder of the
/// write end is gone (the program and whatever it started).
///
/// Used only on the loop's thread.
final class ProgramOutput: @unchecked Sendable {
    private let fd: Int32
    private let loop: EventLoop
    private let logger: Logger
    private let label: String
    private var source: EventLoop.SourceToken?
    private var partial: [UInt8] = []
    private var window = (start: 0, lines: 0, dropped: 0)

    static let lineLimit = 1000
    static let linesPerWindow = 100
    static let windowMilliseconds = 10_000

    /// Reads `fd` (a pipe's non-blocking read end, which it owns) on `loop`.
    init(reading fd: Int32, label: String, loop: EventLoop, logger: Logger) {
        self.fd = fd
        self.loop = loop
        self.logger = logger
        self.label = label
        source = loop.addSource(fd: fd, events: UInt32(EPOLLIN.rawValue)) { [self] _ in readable() }
    }

    deinit { finish() }

    private func readable() {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while source != nil {
            let n = read(fd, &buffer, buffer.count)
            if n > 0 {
                take(buffer[0..<n])
            } else if n < 0, errno == EINTR {
                continue
            } else if n < 0, errno == EAGAIN {
                return
            } else {
                // EOF: every writer is gone.
                if !partial.isEmpty { emit(partial) }
                partial = []
                finish()
            }
        }
    }

    private func take(_ bytes: ArraySlice<UInt8>) {
        var rest = bytes[...]
        while let newline = rest.firstIndex(of: UInt8(ascii: "\n")) {
            emit(partial + rest[rest.startIndex..<newline])
            partial = []
            rest = rest[(newline + 1)...]
        }
        partial += rest
        if partial.count >= Self.lineLimit {
            emit(partial)
            partial = []
        }
    }

    private func emit(_ line: [UInt8]) {
        guard !line.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0d }) else { return }
        let now = Self.nowMilliseconds()
        if now - window.start >= Self.windowMilliseconds {
            if window.dropped > 0 {
                logger.info("\(label): \(window.dropped) more lines within \(Self.windowMilliseconds / 1000) s not logged")
            }
            window = (now, 0, 0)
        }
        guard window.lines < Self.linesPerWindow else {
            window.dropped += 1
            return
        }
        window.lines += 1
        var text = String(decoding: line.prefix(Self.lineLimit), as: UTF8.self)
        if line.count > Self.lineLimit { text += "…" }
        logger.info("\(label): \(text)")
    }

    private func finish() {
        guard let source else { return }
        self.source = nil
        loop.removeSource(source, fd: fd)
        close(fd)
    }

    private static func nowMilliseconds() -> Int {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return now.tv_sec * 1000 + now.tv_nsec / 1_000_000
    }
}
