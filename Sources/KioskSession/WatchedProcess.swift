import CLinux
import CProcess
import DBus
import Glibc
import GuidedAccessCore
import Logging

/// Why a program could not be started or found.
public struct ProgramError: Error, Hashable, Sendable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// One process the service started or adopted, watched through a pidfd on
/// the event loop: its exit arrives as an event, never by polling, and a
/// signal sent through the pidfd can never reach a later process that
/// reuses the pid.
///
/// Used only on the loop's thread (by the actor that owns it).
final class WatchedProcess: @unchecked Sendable {
    let record: ProgramRecord
    let pid: Int32
    /// A child is reaped here; an adopted process (after a restart of the
    /// service) is its new parent's to reap.
    let isChild: Bool
    private let loop: EventLoop
    private var fd: Int32
    private var source: EventLoop.SourceToken?
    private var onExit: (@Sendable (String) -> Void)?

    /// In the environment of every program the service starts: a random
    /// token per run, journaled with its pid, that an adopted process must
    /// still have (`init(adopting:)`).
    static let tokenVariable = "GUIDEDACCESS_PROGRAM_TOKEN"

    /// Starts `argv[0]` (an absolute path) with `environment`; what it
    /// writes is logged as `name`'s (`ProgramOutput`).
    init(
        spawning argv: [String], environment: [String: String], name: String, loop: EventLoop, logger: Logger
    ) throws(ProgramError) {
        var generator = SystemRandomNumberGenerator()
        let token = (0..<2).map { _ in String(generator.next() as UInt64, radix: 16) }.joined(separator: "-")
        var environment = environment
        environment[Self.tokenVariable] = token
        var output: [Int32] = [-1, -1]
        if ga_output_pipe(&output) != 0 { output = [-1, -1] }
        let pid = Self.spawn(argv, environment: environment, output: output[1], hold: output[0])
        if output[1] >= 0 { close(output[1]) }
        guard pid > 0 else {
            if output[0] >= 0 { close(output[0]) }
            throw ProgramError("cannot start \(argv[0]): \(String(cString: strerror(-pid)))")
        }
        // It keeps itself until every writer is gone (the loop holds its handler).
        if output[0] >= 0 { _ = ProgramOutput(reading: output[0], label: "\(name)[\(pid)]", loop: loop, logger: logger) }
        let fd = ga_pidfd_open(pid)
        guard fd >= 0, let startTime = ProcessTable.startTime(of: pid) else {
            // Nothing could watch it (no pidfd: Linux < 5.3): it must not run unwatched.
            kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            if fd >= 0 { close(fd) }
            throw ProgramError("cannot watch \(argv[0]) (pidfd_open: \(String(cString: strerror(max(-fd, 0)))))")
        }
        self.record = .process(pid: pid, startTime: startTime, bootID: ProcessTable.bootID, token: token)
        self.pid = pid
        self.isChild = true
        self.loop = loop
        self.fd = fd
    }

    /// The process `record` names, if it is still that process (same start
    /// time on the same boot, and the token the service gave it in its
    /// environment); nil otherwise.
    ///
    /// A process in the middle of an exec (a wrapper script exec'ing its
    /// program) already has its new name but, for a moment, no environment:
    /// the kernel reads `/proc/PID/environ` empty until the new image's stack
    /// is set up. An empty environment (every program the service starts has
    /// at least its token) is read again, for up to half a second, on the
    /// loop's own timer (`EventLoop.sleep`), without blocking it.
    init?(adopting record: ProgramRecord, loop: EventLoop) async {
        guard case .process(let pid, let startTime, let bootID, let token) = record, bootID == ProcessTable.bootID,
            !token.isEmpty
        else { return nil }
        let fd = ga_pidfd_open(pid)
        guard fd >= 0 else { return nil }
        var environment = Self.environment(of: pid)
        let deadline = ContinuousClock.now + .milliseconds(500)
        while environment?.isEmpty == true, ContinuousClock.now < deadline {
            try? await loop.sleep(for: .milliseconds(2))
            environment = Self.environment(of: pid)
        }
        // Read after the pidfd is open and the environment: if it names the
        // same start time now, both refer to that process, not to a later one
        // with its pid.
        guard ProcessTable.startTime(of: pid) == startTime,
            environment?.contains(Self.tokenVariable + "=" + token) == true
        else {
            close(fd)
            return nil
        }
        self.record = record
        self.pid = pid
        self.isChild = false
        self.loop = loop
        self.fd = fd
    }

    deinit {
        if let source { loop.removeSource(source, fd: fd) }
        if fd >= 0 { close(fd) }
    }

    /// Calls `handler` once, on the loop, when the process has exited, with
    /// how it ended ("exit status 1", "killed by signal 9").
    func watch(_ handler: @escaping @Sendable (String) -> Void) {
        onExit = handler
        source = loop.addSource(fd: fd, events: UInt32(EPOLLIN.rawValue)) { [self] _ in exited() }
    }

    private func exited() {
        guard let handler = onExit else { return }
        onExit = nil
        var how = "exited"
        if isChild {
            let status = ga_pidfd_reap(fd)
            if status >= 0 { how = Self.describe(status: status) }
        }
        if let source { loop.removeSource(source, fd: fd) }
        source = nil
        close(fd)
        fd = -1
        handler(how)
    }

    /// Sends `signal`; false once the process is gone.
    @discardableResult
    func send(_ signal: Int32) -> Bool {
        fd >= 0 && ga_pidfd_send_signal(fd, signal) == 0
    }

    private static func spawn(_ argv: [String], environment: [String: String], output: Int32, hold: Int32) -> Int32 {
        let env = environment.map { "\($0.key)=\($0.value)" }.sorted()
        return withCStrings(argv) { cArgv in
            withCStrings(env) { cEnv in ga_spawn_program(argv[0], cArgv, cEnv, output, hold) }
        }
    }

    /// The `NAME=value` entries of a process's environment as it was
    /// started (`/proc/PID/environ`, readable for a process of the same
    /// user); nil when it cannot be read, none in the middle of an exec.
    static func environment(of pid: Int32) -> Set<String>? {
        guard let bytes = (try? FileContents.read("/proc/\(pid)/environ")) ?? nil else { return nil }
        return Set(bytes.split(separator: 0).map { String(decoding: $0, as: UTF8.self) })
    }

    static func describe(status: Int32) -> String {
        let signal = status & 0x7f
        return signal == 0 ? "exit status \((status >> 8) & 0xff)" : "killed by signal \(signal)"
    }
}

/// NULL-terminated C string arrays for exec.
private func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for p in pointers { free(p) } }
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}

/// What `/proc` says of processes; only ever checked against something
/// stronger (a pidfd opened first, the bus's or the socket's credentials).
enum ProcessTable {
    /// This boot's id: a start time is meaningful only on the boot it was read on.
    static let bootID: String = {
        (try? FileContents.read("/proc/sys/kernel/random/boot_id")).map {
            String(String(decoding: $0, as: UTF8.self).trimmingASCIIWhitespace)
        } ?? ""
    }()

    /// Field 22 of `/proc/PID/stat`: clock ticks after boot.
    static func startTime(of pid: Int32) -> UInt64? {
        guard let stat = statFields(of: pid), stat.count > 19 else { return nil }
        return UInt64(stat[19])
    }

    /// The parent's pid (field 4).
    static func parent(of pid: Int32) -> Int32? {
        guard let stat = statFields(of: pid), stat.count > 1 else { return nil }
        return Int32(stat[1])
    }

    /// The pids whose parent is `pid`.
    static func children(of pid: Int32) -> [Int32] {
        SessionProbe.entries(of: "/proc").compactMap { Int32($0) }.filter { parent(of: $0) == pid }.sorted()
    }

    /// `/proc/PID/comm`, the process's name.
    static func name(of pid: Int32) -> String? {
        guard let bytes = try? FileContents.read("/proc/\(pid)/comm") else { return nil }
        return String(String(decoding: bytes, as: UTF8.self).trimmingASCIIWhitespace)
    }

    /// `/proc/PID/cmdline`, split at its NULs.
    static func arguments(of pid: Int32) -> [String] {
        guard let bytes = try? FileContents.read("/proc/\(pid)/cmdline") else { return [] }
        var parts = bytes.split(separator: 0, omittingEmptySubsequences: false)
        if bytes.last == 0 { parts.removeLast() }
        return parts.map { String(decoding: $0, as: UTF8.self) }
    }

    /// The fields after the command name (which may hold spaces and parentheses).
    private static func statFields(of pid: Int32) -> [Substring]? {
        guard let bytes = try? FileContents.read("/proc/\(pid)/stat") else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        guard let close = text.lastIndex(of: ")") else { return nil }
        return text[text.index(after: close)...].split(separator: " ")
    }
}
