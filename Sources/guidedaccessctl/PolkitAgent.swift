import CProcess
import DBus
import Dispatch

#if canImport(Glibc)
    import Glibc
#endif

/// polkit's text authentication agent, `pkttyagent`, as a child of
/// guidedaccessctl for the length of a call that may need authorization, as
/// systemd's tools do (`polkit_agent_open`/`polkit_agent_close`): it is
/// started with `--notify-fd 3 --fallback`, registers with polkit for its
/// parent (us), closes descriptor 3 once registered, and asks for the password
/// on the terminal if polkit wants one. `close()` ends it afterwards.
///
/// The child must not inherit our signal mask: Swift's async code runs on
/// libdispatch's pool threads, which block SIGTERM, SIGINT, SIGHUP and most
/// other signals, and a mask survives exec — an agent spawned plainly from
/// here never sees the SIGTERM that should end it, and waiting for it hangs.
/// `ga_fork_agent` resets the mask and every disposition in the child. The
/// child is forked on a thread of its own that then waits for it to exit, as
/// PR_SET_PDEATHSIG fires when the forking *thread* ends and the pool's
/// threads come and go.
final class PolkitAgent {
    static let path = "/usr/bin/pkttyagent"
    /// How long to wait for the agent to register before making the call anyway.
    static let registrationTimeout: Duration = .seconds(10)
    /// How long the agent has to exit after SIGTERM, and then after SIGKILL.
    static let terminationTimeout: DispatchTimeInterval = .seconds(2)

    /// Whether to start an agent for a call on `bus`: polkit only vouches
    /// for the system bus; root needs no authorization (systemd's tools skip
    /// root too); stdin is the terminal the password would be typed on
    /// (stdin, not stdout, as systemd checks: this is about input).
    static func isUseful(for bus: Bus) -> Bool {
        guard case .system = bus else { return false }
        return geteuid() != 0 && isatty(STDIN_FILENO) != 0 && access(path, X_OK) == 0
    }

    let pid: pid_t
    private let exited: DispatchSemaphore
    private let terminal: SavedTerminal?
    private var closed = false

    private init(pid: pid_t, exited: DispatchSemaphore, terminal: SavedTerminal?) {
        self.pid = pid
        self.exited = exited
        self.terminal = terminal
    }

    /// Starts the agent and waits until it has registered (or exited, or
    /// `registrationTimeout` passed). Nil when it could not be started (said
    /// on stderr); the call then goes ahead without one.
    static func open() -> PolkitAgent? {
        // Inherited as ignored, SIGCHLD would have the kernel reap the agent
        // at once, and waitid would see no child to wait for.
        signal(SIGCHLD, SIG_DFL)
        let terminal = SavedTerminal()
        let started = DispatchSemaphore(value: 0)
        let exited = DispatchSemaphore(value: 0)
        let outcome = Outcome()
        // A thread of its own: it blocks in waitid(2) until the agent exits.
        DispatchQueue(label: "polkit-agent").async {
            // Prepared before the fork: the child only execs.
            let arguments: [String] = [path, "--notify-fd", "3", "--fallback"]
            let argv = arguments.map { strdup($0) } + [nil]
            defer { for arg in argv { free(arg) } }
            var fds: [Int32] = [-1, -1]
            guard pipe(&fds) == 0 else {
                outcome.error = errno
                started.signal()
                return
            }
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
            let pid = argv.withUnsafeBufferPointer { ga_fork_agent(path, $0.baseAddress, environ, fds[1]) }
            Glibc.close(fds[1])  // the agent's end
            guard pid > 0 else {
                Glibc.close(fds[0])
                outcome.error = -pid
                started.signal()
                return
            }
            outcome.pid = pid
            waitForHangUp(fds[0], timeout: registrationTimeout)
            Glibc.close(fds[0])
            started.signal()
            // Waits for the exit but leaves the zombie: its pid cannot be
            // reused while `close()` may still signal it; `close()` reaps it.
            var info = siginfo_t()
            while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR {}
            exited.signal()
        }
        started.wait()
        guard outcome.pid > 0 else {
            printToStderr("guidedaccessctl: cannot start \(path): \(String(cString: strerror(outcome.error)))")
            return nil
        }
        return PolkitAgent(pid: outcome.pid, exited: exited, terminal: terminal)
    }

    /// Ends the agent: SIGTERM (and SIGCONT, should it be stopped), at most
    /// `terminationTimeout` for it to exit, then SIGKILL and as long again.
    /// pkttyagent restores the terminal on SIGTERM; after SIGKILL, or if it
    /// died otherwise, the terminal is put back as it was before it started.
    func close() {
        guard !closed else { return }
        closed = true
        if exited.wait(timeout: .now()) == .timedOut {
            kill(pid, SIGTERM)
            kill(pid, SIGCONT)
            if exited.wait(timeout: .now() + Self.terminationTimeout) == .timedOut {
                kill(pid, SIGKILL)
                if exited.wait(timeout: .now() + Self.terminationTimeout) == .timedOut {
                    printToStderr("guidedaccessctl: \(Self.path) (pid \(pid)) does not exit")
                    terminal?.restoreIfChanged()
                    return
                }
            }
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        terminal?.restoreIfChanged()
    }

    /// Polls until the other end of the pipe is closed (POLLHUP, or EOF), or
    /// the timeout passes.
    private static func waitForHangUp(_ fd: Int32, timeout: Duration) {
        let deadline = ContinuousClock.now + timeout
        while true {
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { return }
            let (seconds, attoseconds) = left.components
            let ms = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let n = poll(&pfd, 1, ms)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return }  // timeout or error
            if pfd.revents & Int16(POLLHUP | POLLERR | POLLNVAL) != 0 { return }
            var byte: UInt8 = 0
            if read(fd, &byte, 1) <= 0 { return }  // EOF; a byte written would be odd but harmless
        }
    }

    /// Written by the forking thread before it signals `started`.
    private final class Outcome: @unchecked Sendable {
        var pid: pid_t = 0
        var error: Int32 = 0
    }
}

/// The terminal's attributes on stdin before the agent started, put back if
/// they changed (an agent killed while it asked for a password leaves echo off).
struct SavedTerminal {
    private let attributes: termios

    init?() {
        var attributes = termios()
        guard tcgetattr(STDIN_FILENO, &attributes) == 0 else { return nil }
        self.attributes = attributes
    }

    func restoreIfChanged() {
        var now = termios()
        // Only the foreground process group may set them (else SIGTTOU).
        guard tcgetattr(STDIN_FILENO, &now) == 0, tcgetpgrp(STDIN_FILENO) == getpgrp() else { return }
        let same =
            now.c_iflag == attributes.c_iflag && now.c_oflag == attributes.c_oflag
            && now.c_cflag == attributes.c_cflag && now.c_lflag == attributes.c_lflag
            && withUnsafeBytes(of: now.c_cc) { a in withUnsafeBytes(of: attributes.c_cc) { b in a.elementsEqual(b) } }
        if !same {
            var attributes = attributes
            tcsetattr(STDIN_FILENO, TCSANOW, &attributes)
        }
    }
}
