import DBus
import Glibc
import GuidedAccessCore
import Logging

/// A program the service runs in the kiosk's session for a feature where
/// nothing in the session delivers it from the key (`ProgramKind`):
/// the screen reader Orca, an on-screen keyboard. It runs as a transient
/// unit of the user's systemd manager where the session bus has one
/// (logged, in the user's cgroup), else as a child process watched through
/// its pidfd. It is started again with back-off when it exits during the
/// session, given up on after too many exits (`RestartPolicy`), and stopped
/// — SIGTERM, then SIGKILL after a grace period — when the feature goes off
/// or the session ends. Once a screen reader is gone, whatever it left
/// queued in speech-dispatcher is cancelled: the next customer must not
/// hear the last one's session.
///
/// Owned by the service and used only on the event loop's thread (the
/// service's executor), as are its own timers and exit events: its state
/// needs no lock.
public final class SessionProgram: @unchecked Sendable {
    public enum Event: Sendable {
        /// Started again after an exit: the journal must name the new run.
        case restarted(ProgramRecord)
        /// Too many exits: it stays off until the feature is turned on again.
        case gaveUp(exits: Int, lastExit: String)
    }

    /// One run of the screen reader.
    private enum Run {
        case process(WatchedProcess)
        case unit(TransientUnit)

        var record: ProgramRecord {
            switch self {
            case .process(let process): return process.record
            case .unit(let unit): return .unit(unit.name)
            }
        }
    }

    public let kind: ProgramKind
    /// Whose units it runs: their names say so.
    private let owner: ProgramOwner
    private let loop: EventLoop
    /// The session bus, where a systemd user manager may run units.
    private let bus: Connection?
    private let logger: Logger
    private let gracePeriod: Duration
    private var events: (@Sendable (Event) -> Void)?
    /// How it is started (the program and its arguments), and the session's
    /// environment it gets — also where speech-dispatcher is found.
    private var argv: [String]?
    private var environment: [String: String] = [:]
    /// The run that should be going, and a number for the next unit's name.
    private var current: Run?
    private var runs = 0
    /// Stopped runs not gone yet, by record, with their SIGKILL timers.
    private var leaving: [ProgramRecord: Task<Void, Never>?] = [:]
    private var wanted = false
    private var policy = RestartPolicy()
    private var restart: Task<Void, Never>?
    /// Who waits in `gone(within:)`.
    private var goneWaiters: [CheckedContinuation<Void, Never>] = []

    /// `bus`: the session bus, to run the program as a unit of the user's
    /// systemd manager when there is one there; nil: child processes.
    public init(
        _ kind: ProgramKind, owner: ProgramOwner = .service, loop: EventLoop, bus: Connection?, logger: Logger,
        gracePeriod: Duration = .milliseconds(500)
    ) {
        self.kind = kind
        self.owner = owner
        self.loop = loop
        self.bus = bus
        self.logger = logger
        self.gracePeriod = gracePeriod
    }

    public func onEvent(_ handler: @escaping @Sendable (Event) -> Void) {
        events = handler
    }

    /// Starts the program (`executable`: its path), unless it runs already;
    /// returns once it has been started (a screen reader: not once it has spoken).
    /// `arguments`: nil for the kind's own.
    public func start(
        _ executable: String, arguments: [String]? = nil, environment: [String: String]
    ) async throws(ProgramError) -> ProgramRecord {
        restart?.cancel()
        restart = nil
        wanted = true
        argv = [executable] + (arguments ?? kind.arguments)
        self.environment = environment
        if let current { return current.record }
        policy.reset()
        return try await launchRun()
    }

    /// A restarted service's program for a resumed session: the journal's
    /// run if it still goes (it is followed from now on), else a new one.
    /// Returns the record to journal.
    public func resume(
        _ record: ProgramRecord?, _ executable: String, arguments: [String]? = nil, environment: [String: String]
    ) async throws(ProgramError) -> ProgramRecord {
        wanted = true
        if current == nil, let record, let run = await find(record) {
            follow(run)
            // A stop() (the session ended) or start() may have come meanwhile.
            guard wanted, current == nil else {
                terminate(run)
                if let current { return current.record }
                throw ProgramError("\(name) was turned off while the service resumed it")
            }
            logger.notice("\(name): \(record), started before the service restarted, adopted")
            current = run
        }
        return try await start(executable, arguments: arguments, environment: environment)
    }

    /// Stops the program the journal names for a session that is over
    /// (ended while the service was down), if it still goes; `environment`:
    /// the session's, where speech-dispatcher is found to cancel what a
    /// screen reader left queued.
    public func stopLeftOver(_ record: ProgramRecord, environment: [String: String]) async {
        guard let run = await find(record) else { return }
        if argv == nil { self.environment = environment }
        logger.notice("\(name): \(record) outlived its session while the service was down; stopping it")
        follow(run)
        terminate(run)
    }

    /// Stops the units of this program that the journal does not name: a
    /// service killed between starting one and journaling it left them
    /// (`kept`: the one it names, if any).
    public func stopUnknownUnits(keeping kept: ProgramRecord?) async {
        guard let bus else { return }
        for unit in await TransientUnit.running(matching: kind.unitPattern(owner: owner), connection: bus)
        where kind.isUnitName(unit, owner: owner) && kept != .unit(unit) && current?.record != .unit(unit) {
            guard let run = await find(.unit(unit)) else { continue }
            logger.notice("\(name): \(unit), which no journal names, is stopped")
            follow(run)
            terminate(run)
        }
    }

    /// Stops it: the feature went off or the session ended. Returns at once;
    /// the run is gone within the grace period.
    public func stop() {
        wanted = false
        restart?.cancel()
        restart = nil
        guard let run = current else { return }
        current = nil
        terminate(run)
        // What it has queued goes now; what it says while it stops goes when it is gone.
        if kind == .screenReader { SpeechDispatcher.cancelAll(environment: environment, logger: logger) }
    }

    /// Sends `signal` to the run going (a settings manager's SIGHUP: read
    /// the configuration again); false when none goes or it failed.
    public func signal(_ signal: Int32) async -> Bool {
        switch current {
        case .process(let process)?: return process.send(signal)
        case .unit(let unit)?: return await unit.kill(signal)
        case nil: return false
        }
    }

    /// Returns once every run stopped is gone, or after `bound`: a
    /// compositor must have let go of the screen before the next takes it.
    public func gone(within bound: Duration) async {
        guard !leaving.isEmpty else { return }
        let timer = Task(executorPreference: loop) { [self, loop] in
            guard (try? await loop.sleep(for: bound)) != nil else { return }
            wakeGoneWaiters()
        }
        await withCheckedContinuation { goneWaiters.append($0) }
        timer.cancel()
    }

    private func wakeGoneWaiters() {
        let waiters = goneWaiters
        goneWaiters = []
        for waiter in waiters { waiter.resume() }
    }

    // MARK: Runs

    private func launchRun() async throws(ProgramError) -> ProgramRecord {
        guard let argv else { throw ProgramError("no \(name) to start") }
        let run: Run
        if let bus, await TransientUnit.isAvailable(on: bus) {
            runs += 1
            run = .unit(
                try await TransientUnit.start(
                    name: kind.unitName(pid: getpid(), run: runs, owner: owner), argv: argv, environment: environment,
                    grace: gracePeriod, connection: bus, logger: logger))
        } else {
            // Its output is logged under its executable's name (orca[PID]: …).
            let program = argv[0].split(separator: "/").last.map(String.init) ?? kind.executable
            run = .process(try WatchedProcess(spawning: argv, environment: environment, name: program, loop: loop, logger: logger))
        }
        // A stop() or another start() may have come while a unit started.
        if !wanted || current != nil {
            follow(run)
            terminate(run)
            if let current { return current.record }
            throw ProgramError("\(name) was turned off while it started")
        }
        current = run
        follow(run)
        logger.info("\(name): started \(argv.joined(separator: " ")) as \(run.record)")
        return run.record
    }

    private func find(_ record: ProgramRecord) async -> Run? {
        switch record {
        case .process:
            return await WatchedProcess(adopting: record, loop: loop).map(Run.process)
        case .unit(let name):
            guard let bus else { return nil }
            return await TransientUnit.adopt(name: name, connection: bus, logger: logger).map(Run.unit)
        }
    }

    private func follow(_ run: Run) {
        let record = run.record
        let handler: @Sendable (String) -> Void = { [self] how in ended(record, how) }
        switch run {
        case .process(let process): process.watch(handler)
        case .unit(let unit): unit.watch(handler)
        }
    }

    /// SIGTERM now; SIGKILL after the grace period (a unit: systemd's own
    /// timeout, `TimeoutStopUSec`). Orca's SIGTERM handler waits for its
    /// main loop, which on an idle desktop can be seconds or never.
    private func terminate(_ run: Run) {
        switch run {
        case .process(let process):
            process.send(SIGTERM)
            let grace = gracePeriod
            leaving[run.record] = Task(executorPreference: loop) { [loop, logger, name] in
                guard (try? await loop.sleep(for: grace)) != nil else { return }
                logger.info("\(name): pid \(process.pid) did not exit within \(grace) of SIGTERM; killing it")
                process.send(SIGKILL)
            }
        case .unit(let unit):
            unit.stop()
            leaving[run.record] = .some(nil)
        }
    }

    private func ended(_ record: ProgramRecord, _ how: String) {
        if let kill = leaving.removeValue(forKey: record) {
            kill?.cancel()
            logger.info("\(name): \(record) stopped (\(how))")
            // Even when the next session's screen reader has started: better
            // to cut its greeting than let it hear the last session's speech.
            if kind == .screenReader { SpeechDispatcher.cancelAll(environment: environment, logger: logger) }
            if leaving.isEmpty { wakeGoneWaiters() }
            return
        }
        guard current?.record == record else { return }
        current = nil
        if wanted { endedDuringSession("\(record)", how) }
    }

    private func endedDuringSession(_ what: String, _ how: String) {
        switch policy.exited(atMilliseconds: Self.nowMilliseconds()) {
        case .restart(let delay):
            logger.warning("\(name): \(what) exited during the session (\(how)); starting it again in \(delay) ms")
            restart = Task(executorPreference: loop) { [self, loop] in
                guard (try? await loop.sleep(for: .milliseconds(delay))) != nil else { return }
                await restartNow()
            }
        case .giveUp(let exits):
            logger.error(
                "\(name): exited \(exits) times within \(policy.intervalMilliseconds / 1000) s (last: \(what), \(how)); giving up"
            )
            wanted = false
            events?(.gaveUp(exits: exits, lastExit: how))
        }
    }

    private func restartNow() async {
        restart = nil
        guard wanted, current == nil else { return }
        do {
            events?(.restarted(try await launchRun()))
        } catch {
            guard wanted, current == nil else { return }  // stopped meanwhile: no failure
            logger.error("\(name): \(error)")
            endedDuringSession("a new run", "could not be started: \(error)")
        }
    }

    /// The program's name, in logs and unit names.
    private var name: String { kind.name }

    private static func nowMilliseconds() -> Int {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return now.tv_sec * 1000 + now.tv_nsec / 1_000_000
    }
}
