// guidedaccessd [--user | --system] [--address ADDR] [--config FILE] [--state-dir DIR]
// guidedaccessd --agent [--address ADDR] [--config FILE] [--state-dir DIR]
// guidedaccessd [--user | --system | --agent] [--config FILE] --check-configuration
// guidedaccessd --print-introspection | --print-agent-introspection | --print-configuration-keys
//
// The GuidedAccess service: org.guidedaccess.GuidedAccess1 on the session
// bus (user mode) or the system bus (system mode). With --agent, the
// session agent (1.2): run as the kiosk user in its graphical session, it
// does there what the system service cannot, for it.

import CLinux
import DBus
import Glibc
import GuidedAccessCore
import BrowserLayer
import GuidedAccessService
import KeyFile
import KioskSession
import Logging
import SessionAgent

// What a large call took goes back to the system once it is answered, as
// with any other call. glibc raises its mmap and trim thresholds each time a
// large block is freed (to 32 MiB at most), after which a message of a few
// megabytes is held in the heap and stays there; pinned at their defaults,
// blocks of 128 KiB and more are mapped and unmapped, and a free heap top
// longer than that is given back.
mallopt(M_MMAP_THRESHOLD, 128 * 1024)
mallopt(M_TRIM_THRESHOLD, 128 * 1024)

// Under systemd, stderr is journald's stream: lines carry their priority.
// Either way, each event is one escaped line of bounded length.
// Neither ever waits for the reader (`StderrSink`).
let logToJournal = StderrLogHandler.stderrIsTheJournal
StderrSink.shared.configure { StderrLogHandler.droppedLine($0, journal: logToJournal) }
LoggingSystem.bootstrap { label in
    var handler = EscapingLogHandler(StderrLogHandler(label: label, journal: logToJournal))
    handler.logLevel = getenv("GUIDEDACCESS_DEBUG") != nil ? .debug : .info
    return handler
}
let logger = Logger(label: "guidedaccessd")

func fail(_ message: String, code: Int32 = 1) -> Never {
    logger.critical("\(message)")
    exit(code)
}

let usage =
    "usage: guidedaccessd [--user | --system | --agent] [--address ADDR] [--config FILE] [--state-dir DIR] [--check-configuration]"
    + " | --print-introspection | --print-agent-introspection | --print-configuration-keys | --version | --help"

// MARK: Command line

var mode = ServiceMode.user
/// `--agent`: the session agent, which reads the system service's configuration.
var agent = false
var address: String?
var configPath: String?
var stateDirectory: String?
var checkOnly = false
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    func value() -> String {
        guard let v = arguments.next(), !v.hasPrefix("--") else { fail("\(argument) needs a value; \(usage)", code: 2) }
        return v
    }
    switch argument {
    case "--user": (mode, agent) = (.user, false)
    case "--system": (mode, agent) = (.system, false)
    case "--agent": (mode, agent) = (.system, true)
    case "--address": address = value()
    case "--config": configPath = value()
    case "--state-dir": stateDirectory = value()
    case "--check-configuration": checkOnly = true
    case "--help", "-h":
        print(usage)
        exit(0)
    case "--version":
        print("guidedaccessd \(GuidedAccessService.version)")
        exit(0)
    case "--print-introspection":
        // The interface's XML as served, for /usr/share/dbus-1/interfaces/.
        print(GuidedAccessService.declaration.introspectionDocument, terminator: "")
        exit(0)
    case "--print-agent-introspection":
        // The session agent's interface, org.guidedaccess.Agent1.
        print(AgentService.declaration.introspectionDocument, terminator: "")
        exit(0)
    case "--print-configuration-keys":
        // Every [Group] Key= the configuration knows, the drivers' included.
        for (group, key) in ServiceConfiguration(defaultsFor: .user, driverKeys: Drivers.configurationKeys).allKeys {
            print("[\(group)] \(key)")
        }
        exit(0)
    default: fail("unknown argument '\(argument)'; \(usage)", code: 2)
    }
}

func environment(_ name: String) -> String? {
    getenv(name).map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 }
}

func homeDirectory() -> String {
    environment("HOME") ?? getpwuid(getuid()).flatMap { $0.pointee.pw_dir.map { String(cString: $0) } } ?? "/"
}

// MARK: Configuration

let defaultConfig =
    mode == .system
    ? "/etc/guidedaccess/guidedaccess.conf"
    : (environment("XDG_CONFIG_HOME") ?? homeDirectory() + "/.config") + "/guidedaccess/guidedaccess.conf"
let configFile = configPath ?? defaultConfig
var configuration = ServiceConfiguration(defaultsFor: mode, driverKeys: Drivers.configurationKeys)
do {
    // A missing default file is no error; a named one that is missing is.
    for file in try KeyFile.loadLayeredFiles(mainFile: configFile, optional: configPath == nil) {
        // Groups first: an unknown group is an error even with no keys.
        for group in file.groups { try configuration.applyGroup(group, file: file.path) }
        for entry in file.entries {
            try configuration.apply(group: entry.group, key: entry.key, value: entry.rawValue, file: entry.file)
        }
    }
} catch let error as KeyFileError {
    fail("configuration: \(error)")
} catch {
    fail("configuration: \(error)")
}

// Who may call the service; nil for the agent, which reads the system
// service's configuration ([Service] Desktop=, [Browser] DevToolsEndpoint=)
// as the kiosk user: the users and groups of the lists are the service's to
// resolve.
let policy: AccessPolicy?
do {
    policy =
        agent
        ? nil
        : try AccessPolicy(
            configuration: configuration, mode: mode, serviceUID: getuid(), file: configFile,
            userID: { name in getpwnam(name).map { $0.pointee.pw_uid } },
            groupID: { name in getgrnam(name).map { $0.pointee.gr_gid } })
} catch {
    fail("configuration: \(error)")
}

if checkOnly {
    // What start-up checks of the configuration, and nothing more: no bus,
    // no state directory.
    print("configuration: \(configFile) and its drop-ins: valid for \(agent ? "the session agent" : "\(mode.rawValue) mode")")
    exit(0)
}

// MARK: State directory

let stateDir =
    stateDirectory ?? environment("STATE_DIRECTORY")?.split(separator: ":").first.map(String.init)
    ?? (mode == .system && !agent
        ? "/var/lib/guidedaccess"
        : (environment("XDG_STATE_HOME") ?? homeDirectory() + "/.local/state") + "/guidedaccess")

func makeDirectories(_ path: String) {
    var partial = ""
    for component in path.split(separator: "/") {
        partial += "/" + component
        if mkdir(partial, 0o700) != 0 && errno != EEXIST {
            fail("cannot create the state directory \(path): \(String(cString: strerror(errno)))")
        }
    }
}
makeDirectories(stateDir)

// MARK: Run

/// Everything after start-up runs on the loop (executor preference): the
/// service never wakes the global executor's thread pool or its timer, so
/// an idle service sleeps in epoll_wait and nowhere else.
func serve(
    configuration: ServiceConfiguration, mode: ServiceMode, policy: AccessPolicy, stateDir: String, bus: Bus,
    loop: EventLoop
) async -> Int32 {
    let backend: any SettingsBackend
    do {
        backend = try Drivers.settingsBackend(configuration, loop: loop)
    } catch {
        logger.critical("\(error)")
        return 1
    }
    do {
        let connection = try await Connection.connect(to: bus, loop: loop, logger: logger)
        // System mode: polkit and logind are on the service's own bus. User
        // mode: polkit cannot vouch for session-bus names, so the lists
        // decide alone; logind is reached on the system bus, if there is one.
        let authority: any Authority =
            mode == .system
            ? PolkitAuthority(connection: connection)
            : ListsOnlyAuthority(reason: "not admitted by the configuration (user mode consults no polkit)")
        // User mode acts in its session: never beside a session agent.
        if mode == .user, let refusal = await claimSession(connection, as: "the user-mode service") {
            logger.critical("\(refusal)")
            return AgentBus.refusedExitStatus
        }
        let systemBus = SystemBusLink(mode == .system ? connection : nil, loop: loop)
        let backendName = backend.name
        let (drivers, agents) = Drivers.list(
            mode: mode, configuration: configuration, policy: policy, backend: backend, connection: connection,
            environment: SessionProbe.processEnvironment())
        let service = GuidedAccessService(
            connection: connection, drivers: drivers, agents: agents, journal: SessionJournal(directory: stateDir),
            settings: .init(
                mode: mode, policy: policy, defaults: configuration.session, authority: authority,
                audit: AuditLog(
                    socketPath: environment("GUIDEDACCESS_JOURNAL_SOCKET") ?? "/run/systemd/journal/socket",
                    logger: logger),
                backendName: backendName, systemBus: { await systemBus.connection() },
                allowedOrigins: Set(BrowserPagesDriver.origins(configuration.driverValue(group: "Browser", key: "AllowOrigins")))),
            logger: logger)
        try await service.start()
        let reply = try await connection.requestName(GuidedAccessBus.name)
        guard reply == .primaryOwner else {
            logger.critical(
                "cannot own \(GuidedAccessBus.name) on the \(bus): \(reply) (is another guidedaccessd running?)")
            return 1
        }
        logger.info("ready: \(GuidedAccessBus.name) on the \(bus), \(mode.rawValue) mode, state in \(stateDir)")
        await connection.waitUntilDisconnected()
        logger.notice("the bus connection is gone; exiting with the session kept in the journal")
        return 0
    } catch {
        logger.critical("\(error)")
        return 1
    }
}

/// The session agent (`--agent`): the session bus for its drivers, the
/// system bus for the service it works for.
func serveAgent(configuration: ServiceConfiguration, stateDir: String, sessionBus: Bus, loop: EventLoop) async -> Int32 {
    do {
        let session = try await Connection.connect(to: sessionBus, loop: loop, logger: logger)
        if let refusal = await claimSession(session, as: "the session agent") {
            logger.critical("\(refusal)")
            return AgentBus.refusedExitStatus
        }
        let system = try await Connection.connect(to: .system, loop: loop, logger: logger)
        let agent = AgentService(
            connection: system,
            drivers: Drivers.session(configuration, owner: .agent, connection: session, environment: SessionProbe.processEnvironment()),
            journal: SessionJournal(directory: stateDir, fileName: "agent.json"), logger: logger)
        try await agent.start()
        logger.info("ready: the session agent of uid \(getuid()), state in \(stateDir)")
        Task(executorPreference: loop) {
            await session.waitUntilDisconnected()
            // The session is over (a logout): its manager stops what the agent ran.
            logger.notice("the session bus connection is gone; exiting")
            exit(0)
        }
        await system.waitUntilDisconnected()
        logger.error("the system bus connection is gone; exiting, with what runs recorded for the next start")
        return 1
    } catch {
        logger.critical("\(error)")
        return 1
    }
}

/// Owns `AgentBus.sessionName` on the session bus for `role`; nil when it
/// does, else why it must not start: the user-mode service and the agent
/// never both act for one session (spec 1.2, section 1).
func claimSession(_ session: Connection, as role: String) async -> String? {
    let reply: RequestNameReply
    do {
        reply = try await session.requestName(AgentBus.sessionName)
    } catch {
        return "\(role) cannot own \(AgentBus.sessionName) on the session bus: \(error)"
    }
    guard reply != .primaryOwner, reply != .alreadyOwner else { return nil }
    var other = "another process"
    if let credentials = try? await session.credentials(of: AgentBus.sessionName), let pid = credentials.processID {
        if let fd = credentials.processFD { close(fd) }
        let arguments = ProcessInfo.readSmallFile("/proc/\(pid)/cmdline")?.split(separator: "\0") ?? []
        let unit = ProcessInfo.systemdUnit(of: pid).map { ", unit \($0)" } ?? ""
        other = arguments.contains("--agent")
            ? "the session agent (pid \(pid)\(unit))" : "the user-mode service (pid \(pid)\(unit))"
    }
    return "\(role) does not start: \(other) acts in this session already, and the two never both act for one session;"
        + " enable one of guidedaccessd-user.service and guidedaccess-agent.service for the kiosk user (systemctl --global enable …)"
}

/// The system bus, connected once when first needed (user mode: for logind).
actor SystemBusLink {
    private var link: Connection?
    private var tried = false
    private let loop: EventLoop
    /// On the loop, like everything else: the global pool stays unused.
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    init(_ connection: Connection?, loop: EventLoop) {
        link = connection
        tried = connection != nil
        self.loop = loop
    }

    func connection() async -> Connection? {
        if !tried {
            tried = true
            link = try? await Connection.connect(to: .system, loop: loop, logger: logger)
        }
        return link
    }
}

let loop = EventLoop()
StderrSink.shared.attach(to: loop)
loop.handleSignals([SIGTERM, SIGINT]) { signal in
    // Handlers run between jobs on the loop: no write is half done, and the
    // journal already holds the session for the next start.
    logger.notice("received signal \(signal); exiting with the session kept in the journal")
    exit(0)
}

// The loop runs on the main thread, and this top-level code never awaits.
// With an async main, the main thread would end in dispatch_main(), which
// calls pthread_exit(): a forced unwind of the main thread that maps the
// unwinder and the binary's .eh_frame (about 0.45 MiB more VmRSS). A loop
// thread of its own would have its own malloc arena and stack (about 40 KiB
// more Private_Dirty).
let bus: Bus = address.map { .address($0) } ?? (mode == .system ? .system : .session)
// Everything the task needs is captured: a global of this file read inside
// it would wait for the main actor, whose queue never runs here.
Task(executorPreference: loop) { [configuration, mode, policy, stateDir, bus, address] in
    let status =
        if let policy {
            await serve(
                configuration: configuration, mode: mode, policy: policy, stateDir: stateDir, bus: bus, loop: loop)
        } else {
            await serveAgent(
                configuration: configuration, stateDir: stateDir, sessionBus: address.map { .address($0) } ?? .session,
                loop: loop)
        }
    exit(status)
}
loop.run()
exit(0)
