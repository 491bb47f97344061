import DBus
import Glibc
import GuidedAccessCore
import Logging

/// The screen reader the service runs in the kiosk's session where nothing
/// in the session starts one: Orca as a child process, watched through its
/// pidfd, started again with back-off when it exits during the session,
/// given up on after too many exits (`RestartPolicy`), and stopped — SIGTERM,
/// then SIGKILL after a grace period — when the feature goes off or the
/// session ends. Once it is gone, whatever it left queued in
/// speech-dispatcher is cancelled: the next customer must not hear the last
/// one's session.
///
/// Owned by the service and used only on the event loop's thread (the
/// service's executor), as are its own timers and exit events: its state
/// needs no lock, and the service can start or stop it without a suspension
/// point in the middle of a transaction.
public final class ScreenReader: @unchecked Sendable {
    public enum Event: Sendable {
        /// Started again after an exit: the journal must name the new process.
        case restarted(ProgramRecord)
        /// Too many exits: it stays off until the feature is turned on again.
        case gaveUp(exits: Int, lastExit: String)
    }

    private let loop: EventLoop
    private let logger: Logger
    private let gracePeriod: Duration
    private var events: (@Sendable (Event) -> Void)?
    /// How it is started: `orca --replace` (so it replaces any other Orca of
    /// the user: exactly one speaks) and the session's environment.
    private var launch: (argv: [String], environment: [String: String])?
    /// The one that should be running.
    private var current: WatchedProcess?
    /// Stopped ones not gone yet, by pid, with their SIGKILL timers.
    private var leaving: [Int32: (process: WatchedProcess, kill: Task<Void, Never>)] = [:]
    private var wanted = false
    private var policy = RestartPolicy()
    private var restart: Task<Void, Never>?

    public init(loop: EventLoop, logger: Logger, gracePeriod: Duration = .milliseconds(500)) {
        self.loop = loop
        self.logger = logger
        self.gracePeriod = gracePeriod
    }

    public func onEvent(_ handler: @escaping @Sendable (Event) -> Void) {
        events = handler
    }

    /// The process the journal should name; nil while none runs.
    public var record: ProgramRecord? { current?.record }

    /// Starts the screen reader, unless it runs already; returns once it has
    /// been started (not once it has spoken).
    public func start(orca: String, environment: [String: String]) throws(ProgramError) -> ProgramRecord {
        restart?.cancel()
        restart = nil
        wanted = true
        launch = ([orca, "--replace"], environment)
        if let current { return current.record }
        policy.reset()
        return try spawn()
    }

    /// A restarted service's screen reader for a resumed session: the
    /// journal's process if it still runs (it is watched from now on),
    /// else a new one. Returns the record to journal.
    public func resume(
        _ record: ProgramRecord?, orca: String, environment: [String: String]
    ) throws(ProgramError) -> ProgramRecord {
        if current == nil, let record, let process = WatchedProcess(adopting: record, loop: loop) {
            logger.notice("screen reader: pid \(record.pid), started before the service restarted, adopted")
            current = process
            watch(process)
        }
        return try start(orca: orca, environment: environment)
    }

    /// Stops the screen reader the journal names for a session that is over
    /// (ended while the service was down): if it is still that process.
    public func stopLeftOver(_ record: ProgramRecord) {
        guard let process = WatchedProcess(adopting: record, loop: loop) else { return }
        logger.notice("screen reader: pid \(record.pid) outlived its session while the service was down; stopping it")
        watch(process)
        terminate(process)
    }

    /// Stops it: the feature went off or the session ended. Returns at once;
    /// the process is gone within the grace period.
    public func stop() {
        wanted = false
        restart?.cancel()
        restart = nil
        guard let process = current else { return }
        current = nil
        terminate(process)
    }

    // MARK: Processes

    private func spawn() throws(ProgramError) -> ProgramRecord {
        guard let launch else { throw ProgramError("no screen reader to start") }
        let process = try WatchedProcess(spawning: launch.argv, environment: launch.environment, loop: loop)
        current = process
        watch(process)
        logger.info("screen reader: started \(launch.argv.joined(separator: " ")), pid \(process.pid)")
        return process.record
    }

    private func watch(_ process: WatchedProcess) {
        let pid = process.pid
        process.watch { [self] how in
            self.exited(pid, how)
        }
    }

    private func terminate(_ process: WatchedProcess) {
        process.send(SIGTERM)
        let grace = gracePeriod
        let kill = Task(executorPreference: loop) { [loop, logger] in
            guard (try? await loop.sleep(for: grace)) != nil else { return }
            logger.warning("screen reader: pid \(process.pid) did not exit within \(grace) of SIGTERM; killing it")
            process.send(SIGKILL)
        }
        leaving[process.pid] = (process, kill)
    }

    private func exited(_ pid: Int32, _ how: String) {
        if let left = leaving.removeValue(forKey: pid) {
            left.kill.cancel()
            logger.info("screen reader: pid \(pid) stopped (\(how))")
            if current == nil { SpeechDispatcher.cancelAll(environment: launch?.environment ?? [:], logger: logger) }
            return
        }
        guard current?.pid == pid else { return }
        current = nil
        if wanted { exitedDuringSession(pid, how) }
    }

    private func exitedDuringSession(_ pid: Int32, _ how: String) {
        switch policy.exited(atMilliseconds: Self.nowMilliseconds()) {
        case .restart(let delay):
            logger.warning("screen reader: pid \(pid) exited during the session (\(how)); starting it again in \(delay) ms")
            restart = Task(executorPreference: loop) { [self, loop] in
                guard (try? await loop.sleep(for: .milliseconds(delay))) != nil else { return }
                self.restartNow()
            }
        case .giveUp(let exits):
            logger.error(
                "screen reader: exited \(exits) times within \(policy.intervalMilliseconds / 1000) s (last: pid \(pid), \(how)); giving up"
            )
            wanted = false
            events?(.gaveUp(exits: exits, lastExit: how))
        }
    }

    private func restartNow() {
        restart = nil
        guard wanted, current == nil else { return }
        do {
            let record = try spawn()
            events?(.restarted(record))
        } catch {
            logger.error("screen reader: \(error)")
            exitedDuringSession(0, "could not be started again")
        }
    }

    private static func nowMilliseconds() -> Int {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return now.tv_sec * 1000 + now.tv_nsec / 1_000_000
    }
}
