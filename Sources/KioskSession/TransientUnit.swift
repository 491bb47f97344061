import DBus
import GuidedAccessCore
import Logging

/// A program run as a transient service unit of the user's systemd manager
/// (`StartTransientUnit`, as `systemd-run --user` does): logged in the
/// user's journal, in the user's cgroup (app.slice), stopped by systemd with
/// its own timeout. Its end arrives as the manager's `UnitRemoved` — the
/// unit is collected as soon as it is inactive or failed
/// (`CollectMode=inactive-or-failed`) — an event, not polling.
///
/// Used only on the event loop's thread, like `SessionProgram`, which owns it.
final class TransientUnit: @unchecked Sendable {
    static let manager = "org.freedesktop.systemd1"
    static let managerPath: ObjectPath = "/org/freedesktop/systemd1"
    static let managerInterface = "org.freedesktop.systemd1.Manager"
    /// What the manager sets for each unit's processes itself; Environment=
    /// would override it with the service's own values.
    static let setByTheManager: Set<String> = ["JOURNAL_STREAM", "SYSTEMD_EXEC_PID", "MANAGERPID", "INVOCATION_ID"]

    let name: String
    private let connection: Connection
    private let logger: Logger
    private var removal: SubscriptionToken?
    private var onEnd: (@Sendable (String) -> Void)?
    private var ended = false

    private init(name: String, connection: Connection, logger: Logger) {
        self.name = name
        self.connection = connection
        self.logger = logger
    }

    /// Whether the bus has a systemd user manager to ask.
    static func isAvailable(on connection: Connection) async -> Bool {
        (try? await connection.nameOwner(manager)) != nil
    }

    /// Starts `argv` as unit `name` and returns once systemd has run it
    /// (`Type=exec`: the start job fails if the program cannot be executed).
    /// `grace`: SIGTERM, then SIGKILL of the main process after this long
    /// (`KillMode=mixed`; Orca's SIGTERM handler can wait seconds for its
    /// main loop, and speech-dispatcher in the same cgroup must not be
    /// killed under it first).
    static func start(
        name: String, argv: [String], environment: [String: String], grace: Duration, connection: Connection,
        logger: Logger
    ) async throws(ProgramError) -> TransientUnit {
        let unit = TransientUnit(name: name, connection: connection, logger: logger)
        // Signals first, so that neither the job's end nor the unit's can be missed.
        let jobWatch: SubscriptionToken
        do {
            try await subscribe(connection)
            jobWatch = try await connection.subscribe(
                MatchRule(sender: manager, path: managerPath, interface: managerInterface, member: "JobRemoved")
            ) { [unit] message in
                guard let arguments = try? message.arguments(), arguments.count == 4,
                    case .objectPath(let job) = arguments[1], case .string(let outcome) = arguments[3]
                else { return }
                unit.jobEnded(job.rawValue, outcome)
            }
        } catch {
            throw ProgramError("cannot follow systemd's jobs: \(error)")
        }
        defer { Task(executorPreference: connection.loop) { await connection.unsubscribe(jobWatch) } }
        do {
            try await unit.watchRemoval()
        } catch {
            throw ProgramError("cannot follow systemd's units: \(error)")
        }
        let graceUsec = UInt64(grace.components.seconds) * 1_000_000 + UInt64(grace.components.attoseconds / 1_000_000_000_000)
        let properties: [DBusValue] = [
            .structure([.string("Description"), .variant(.string("\(argv[0]) for a guided access session"))]),
            .structure([.string("Type"), .variant(.string("exec"))]),
            .structure([.string("KillMode"), .variant(.string("mixed"))]),
            .structure([.string("TimeoutStopUSec"), .variant(.uint64(graceUsec))]),
            .structure([.string("CollectMode"), .variant(.string("inactive-or-failed"))]),
            .structure([
                .string("Environment"),
                .variant(
                    .array(
                        .string,
                        environment.filter { !Self.setByTheManager.contains($0.key) }.sorted { $0.key < $1.key }
                            .map { .string("\($0.key)=\($0.value)") })),
            ]),
            .structure([
                .string("ExecStart"),
                .variant(
                    .array(
                        .structure([.string, .array(.string), .bool]),
                        [.structure([.string(argv[0]), .array(.string, argv.map(DBusValue.string)), .bool(false)])])),
            ]),
        ]
        let job: String
        do {
            let reply = try await connection.call(
                destination: manager, path: managerPath, interface: managerInterface, member: "StartTransientUnit",
                [
                    .string(name), .string("fail"), .array(.structure([.string, .variant]), properties),
                    .array(.structure([.string, .array(.structure([.string, .variant]))]), []),
                ], timeout: .seconds(5))
            guard case .objectPath(let path)? = reply.first else { throw DBusError.failed("no job in the reply") }
            job = path.rawValue
        } catch {
            // A call that timed out may still be carried out: the unit must not start unwatched.
            unit.stop()
            await unit.forget()
            throw ProgramError("cannot start \(argv[0]) as \(name): \(error)")
        }
        let result = await unit.result(of: job, within: .seconds(5))
        guard result == "done" else {
            unit.stop()
            await unit.forget()
            throw ProgramError("\(argv[0]) did not start as \(name) (its start job: \(result))")
        }
        return unit
    }

    /// The manager sends unit and job signals only to subscribed clients;
    /// a second Subscribe of the same connection is an error that changes nothing.
    private static func subscribe(_ connection: Connection) async throws(DBusError) {
        do {
            _ = try await connection.call(
                destination: manager, path: managerPath, interface: managerInterface, member: "Subscribe",
                timeout: .seconds(5))
        } catch where error.name == "org.freedesktop.systemd1.AlreadySubscribed" {
        }
    }

    // MARK: The start job

    private var jobResults: [String: String] = [:]
    private var waiting: (job: String, continuation: CheckedContinuation<String, Never>)?

    private func jobEnded(_ job: String, _ outcome: String) {
        if let waiting, waiting.job == job {
            self.waiting = nil
            waiting.continuation.resume(returning: outcome)
        } else {
            jobResults[job] = outcome
        }
    }

    /// How job `job` ended (`done`, `failed`, …), or "no end within …".
    private func result(of job: String, within limit: Duration) async -> String {
        if let outcome = jobResults.removeValue(forKey: job) { return outcome }
        let timer = Task(executorPreference: connection.loop) { [self, loop = connection.loop] in
            guard (try? await loop.sleep(for: limit)) != nil else { return }
            jobEnded(job, "no end within \(limit)")
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { waiting = (job, $0) }
    }

    /// The names of the manager's loaded units that match `pattern` (a glob)
    /// and are not inactive; none where there is no manager.
    static func running(matching pattern: String, connection: Connection) async -> [String] {
        guard await isAvailable(on: connection),
            let reply = try? await connection.call(
                destination: manager, path: managerPath, interface: managerInterface, member: "ListUnitsByPatterns",
                [
                    .array(.string, ["active", "activating", "deactivating", "reloading"].map(DBusValue.string)),
                    .array(.string, [.string(pattern)]),
                ], timeout: .seconds(5)),
            case .array(_, let units)? = reply.first
        else { return [] }
        return units.compactMap { unit in
            guard case .structure(let fields) = unit, case .string(let name)? = fields.first else { return nil }
            return name
        }
    }

    /// The unit `name`, if it is still running: a restarted service's
    /// screen reader. nil when it is gone.
    static func adopt(name: String, connection: Connection, logger: Logger) async -> TransientUnit? {
        let unit = TransientUnit(name: name, connection: connection, logger: logger)
        do {
            try await subscribe(connection)
            try await unit.watchRemoval()
            let reply = try await connection.call(
                destination: manager, path: managerPath, interface: managerInterface, member: "GetUnit",
                [.string(name)], timeout: .seconds(5))
            guard case .objectPath(let path)? = reply.first else { throw ProgramError("GetUnit: no path") }
            let state = try await connection.call(
                destination: manager, path: path, interface: "org.freedesktop.DBus.Properties", member: "Get",
                [.string("org.freedesktop.systemd1.Unit"), .string("ActiveState")], timeout: .seconds(5))
            guard case .variant(.string(let active))? = state.first, ["active", "activating", "reloading"].contains(active),
                !unit.ended
            else { throw ProgramError("not running") }
            return unit
        } catch {
            await unit.forget()
            return nil
        }
    }

    private func watchRemoval() async throws(DBusError) {
        removal = try await connection.subscribe(
            MatchRule(sender: Self.manager, path: Self.managerPath, interface: Self.managerInterface,
                      member: "UnitRemoved", arg0: name)
        ) { [self] _ in
            // A daemon-reload unloads every unit and loads it again: UnitRemoved,
            // then UnitNew, for a unit that goes on running. Only a unit the
            // manager no longer has running has ended (it answers after the reload).
            Task(executorPreference: connection.loop) { [self] in
                guard !ended, await !isLoadedAndRunning() else { return }
                ended = true
                let handler = onEnd
                await forget()
                handler?("unit \(name) ended")
            }
        }
    }

    /// Whether the manager has the unit and it is not inactive or failed.
    private func isLoadedAndRunning() async -> Bool {
        guard
            let reply = try? await connection.call(
                destination: Self.manager, path: Self.managerPath, interface: Self.managerInterface, member: "GetUnit",
                [.string(name)], timeout: .seconds(5)),
            case .objectPath(let path)? = reply.first,
            let state = try? await connection.call(
                destination: Self.manager, path: path, interface: "org.freedesktop.DBus.Properties", member: "Get",
                [.string("org.freedesktop.systemd1.Unit"), .string("ActiveState")], timeout: .seconds(5)),
            case .variant(.string(let active))? = state.first
        else { return false }
        return !["inactive", "failed"].contains(active)
    }

    /// Calls `handler` once, on the loop, when the unit is gone.
    func watch(_ handler: @escaping @Sendable (String) -> Void) {
        if ended {
            handler("unit \(name) ended")
        } else {
            onEnd = handler
        }
    }

    /// Asks systemd to stop it (SIGTERM, SIGKILL after the grace period);
    /// the end arrives through `watch`.
    func stop() {
        let (connection, name, logger) = (connection, name, logger)
        Task(executorPreference: connection.loop) {
            do throws(DBusError) {
                _ = try await connection.call(
                    destination: Self.manager, path: Self.managerPath, interface: Self.managerInterface,
                    member: "StopUnit", [.string(name), .string("replace")], timeout: .seconds(5))
            } catch where error.name != "org.freedesktop.systemd1.NoSuchUnit" {
                logger.error("cannot stop \(name): \(error)")
            } catch {
                // Gone already.
            }
        }
    }

    /// Sends `signal` to its main process (systemd's `KillUnit`); returns
    /// whether systemd took it.
    func kill(_ signal: Int32) async -> Bool {
        do throws(DBusError) {
            _ = try await connection.call(
                destination: Self.manager, path: Self.managerPath, interface: Self.managerInterface,
                member: "KillUnit", [.string(name), .string("main"), .int32(signal)], timeout: .seconds(5))
            return true
        } catch {
            logger.error("cannot signal \(name): \(error)")
            return false
        }
    }

    /// Stops following it.
    func forget() async {
        onEnd = nil
        jobResults = [:]
        if let removal {
            self.removal = nil
            await connection.unsubscribe(removal)
        }
    }
}
