import DBus
import Glibc
import GuidedAccessCore
import GuidedAccessWire
import Logging

/// The session agent (`guidedaccessd --agent`, spec 1.2 section 1): runs
/// as the kiosk user in its graphical session and does there, for the
/// system service, what only the session can — its drivers (the desktop
/// found in the session, the programs run there, the kiosk browser's
/// pages), built by `guidedaccessd` as user mode builds them.
///
/// On its system-bus connection it exports `org.guidedaccess.Agent1` and
/// registers with the system service (`RegisterAgent`, which D-Bus
/// activates the service); with no service on the bus it waits for one
/// (`NameOwnerChanged`), without waking up. Refused, or released, it
/// registers again when seat0's session or the service changes.
///
/// `Apply` makes exactly the features it is sent real, through the same
/// session transaction as the service's (`SessionStore`), whose journal —
/// in the agent's own state directory — keeps only what the drivers run.
/// That journal is taken up at the first `Apply`, with what the service
/// wants then: a program still running from before (a killed agent's
/// Orca) is adopted, not started again, and one no longer wanted stops.
/// Only the service's connection may call it.
public actor AgentService {
    /// The system bus.
    let connection: Connection
    let store: SessionStore
    let logger: Logger
    /// The journal as it was at start, taken up at the first `Apply`.
    private var found: JournalState?
    private var recovered = false
    /// The system service's unique name, once known.
    private var service: String?
    /// Registered with `service` (and not released since).
    private var registered = false
    private let registration = Turns()
    private var exported = false
    private var watches: [SubscriptionToken] = []

    public nonisolated var unownedExecutor: UnownedSerialExecutor { connection.unownedExecutor }

    static let login1 = "org.freedesktop.login1"

    /// `connection`: the system bus; `drivers`: the session's, in order.
    package init(connection: Connection, drivers: sending [any FeatureDriver], journal: SessionJournal, logger: Logger) {
        self.connection = connection
        self.logger = logger
        store = SessionStore(journal: journal, drivers: drivers, journalsSessions: false)
    }

    /// Starts the drivers, reads the journal, exports the object, and
    /// registers (activating the service).
    public func start() async throws {
        let loop = connection.loop
        await store.startDrivers { [self] name, event in
            Task(executorPreference: loop) { await self.driverEvent(name, event) }
        }
        logSupport()
        do {
            found = try store.journal.load { name, record throws(DriverRecordError) in
                try store.drivers.first { $0.name == name }?.validate(record)
            }
        } catch {
            // A corrupt journal is kept aside; nothing of it is adopted.
            logger.error("\(error)")
        }
        try await connection.export([interface()], at: AgentBus.objectPath)
        exported = true
        let rules = [
            MatchRule.nameOwnerChanged(for: GuidedAccessBus.name),
            // seat0's and its sessions' (a session's Type and Active may be
            // announced after it became seat0's): an agent not registered
            // tries again; a registered one ignores them.
            MatchRule(sender: Self.login1, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged"),
        ]
        for rule in rules {
            watches.append(
                try await connection.subscribe(rule) { [self] message in
                    var newOwner: String??
                    if let arguments = try? message.arguments(), arguments.count == 3, case .string(let owner) = arguments[2] {
                        newOwner = .some(owner.isEmpty ? nil : owner)
                    }
                    Task(executorPreference: loop) { await self.somethingChanged(serviceOwner: newOwner) }
                })
        }
        await servePages()
        await register()
    }

    // MARK: The page API (1.2)

    /// Where the session's browser driver serves `window.guidedAccess`
    /// (`[Browser] AllowOrigins=`): its pages' calls are handed on to the
    /// service (`PageCall`), which decides who calls and answers; what the
    /// service announces is told to the pages.
    private func servePages() async {
        guard let pages = store.drivers.lazy.compactMap({ $0 as? any PageServing }).first, pages.servesPages else { return }
        let loop = connection.loop
        pages.servePages(
            endpointCaller: BusCaller(uniqueName: connection.uniqueName, identity: CallerIdentity(uid: getuid())),
            PageHandlers(
                call: { [self] call in await handOn(call) },
                left: { [self] launcher, tab, origin in
                    Task(executorPreference: loop) { await self.handOnLeft(launcher, tab, origin) }
                }))
        let interface = GuidedAccessBus.interface, path = GuidedAccessBus.objectPath
        let rules = [
            MatchRule(sender: GuidedAccessBus.name, path: path, interface: interface, member: GuidedAccessSignal.sessionChanged.rawValue),
            MatchRule(sender: GuidedAccessBus.name, path: path, interface: interface, member: GuidedAccessSignal.restrictionChanged.rawValue),
            MatchRule(sender: GuidedAccessBus.name, path: path, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged"),
        ]
        for rule in rules {
            do {
                watches.append(
                    try await connection.subscribe(rule) { [self] message in
                        guard let event = Self.pageEvent(message) else { return }
                        Task(executorPreference: loop) { await self.tellPages(event) }
                    })
            } catch {
                logger.error("cannot follow the service's signals for the pages: \(error)")
            }
        }
    }

    private func tellPages(_ event: PageEvent) {
        store.drivers.lazy.compactMap({ $0 as? any PageServing }).first?.tellPages(event)
    }

    /// What pages hear of a signal of the service.
    private static func pageEvent(_ message: Message) -> PageEvent? {
        guard let arguments = try? message.arguments() else { return nil }
        switch message.member {
        case GuidedAccessSignal.sessionChanged.rawValue:
            guard arguments.count == 2, case .bool(let active) = arguments[0], case .string(let reason) = arguments[1] else { return nil }
            return .sessionChanged(active: active, reason: reason)
        case GuidedAccessSignal.restrictionChanged.rawValue:
            guard arguments.count == 2, case .string(let id) = arguments[0], case .string(let state) = arguments[1] else { return nil }
            return .restrictionChanged(id: id, state: state)
        case "PropertiesChanged":
            guard arguments.count == 3, case .dictionary(_, _, let changed) = arguments[1] else { return nil }
            for entry in changed {
                guard case .string(GuidedAccessProperty.enabledFeatures.rawValue) = entry.key, case .variant(let inner) = entry.value,
                    case .array(_, let items) = inner
                else { continue }
                return .featuresChanged(items.compactMap { if case .string(let s) = $0 { s } else { nil } })
            }
            return nil
        default:
            return nil
        }
    }

    private func handOn(_ call: PageCall) async -> Result<JSON, GuidedAccessError> {
        let text = JSON.object([
            ("launcher", .string(call.caller.uniqueName)), ("tab", .string(call.caller.tab ?? "")),
            ("origin", .string(call.caller.identity.origin ?? "")), ("method", .string(call.method)),
            ("args", .array(call.arguments)),
        ]).compactBytes()
        do {
            let reply = try await connection.call(
                destination: GuidedAccessBus.name, path: GuidedAccessBus.objectPath, interface: GuidedAccessBus.interface,
                member: GuidedAccessMethod.pageCall.rawValue, [.string(String(decoding: text, as: UTF8.self))])
            guard case .string(let answer)? = reply.first, let value = try? JSON.parse(Array(answer.utf8)) else {
                return .failure(.backendFailed("the service's answer is not JSON"))
            }
            return .success(value)
        } catch {
            return .failure(GuidedAccessError(dbusErrorName: error.name, message: error.message))
        }
    }

    private func handOnLeft(_ launcher: String, _ tab: String?, _ origin: String?) async {
        do {
            _ = try await connection.call(
                destination: GuidedAccessBus.name, path: GuidedAccessBus.objectPath, interface: GuidedAccessBus.interface,
                member: GuidedAccessMethod.pageLeft.rawValue, [.string(launcher), .string(tab ?? ""), .string(origin ?? "")])
        } catch {
            logger.info("cannot tell the service that a page is gone: \(error)")
        }
    }

    // MARK: Registration

    /// The service came or went (`serviceOwner`: its new unique name, or
    /// nil when it left), or seat0's session changed (`serviceOwner` nil).
    private func somethingChanged(serviceOwner: String??) async {
        switch serviceOwner {
        case .some(.some(let owner)):
            logger.info("the GuidedAccess service is on the system bus (\(owner)): registering")
            registered = false
            await register()
        case .some(.none):
            // What runs goes on; the service sends the state again when it is back.
            logger.notice("the GuidedAccess service left the system bus; waiting for it")
            service = nil
            registered = false
        case .none:
            // logind: only when seat0's active session is this user's. An
            // agent of a user not admitted (an administrator's login, with
            // the unit enabled for everyone) would otherwise ask again, and
            // be refused and audited, at every change of any session.
            guard !registered, await seatIsOurs() else { return }
            await register()
        }
    }

    /// Whether logind's active session on seat0 is this process's user's.
    private func seatIsOurs() async -> Bool {
        func property(_ path: ObjectPath, _ interface: String, _ name: String) async -> DBusValue? {
            await connection.property(name, of: interface, at: path, on: Self.login1, timeout: .seconds(2))
        }
        guard
            case .structure(let active)? = await property(
                "/org/freedesktop/login1/seat/seat0", "org.freedesktop.login1.Seat", "ActiveSession"),
            active.count == 2, case .objectPath(let path) = active[1], path.rawValue != "/",
            case .structure(let user)? = await property(path, "org.freedesktop.login1.Session", "User"),
            case .uint32(let uid)? = user.first
        else { return false }
        return uid == getuid()
    }

    /// `RegisterAgent`, which also starts the service (D-Bus activation).
    private func register() async {
        await registration.take()
        defer { registration.give() }
        guard !registered else { return }
        do {
            let message = try Message.methodCall(
                destination: GuidedAccessBus.name, path: GuidedAccessBus.objectPath, interface: GuidedAccessBus.interface,
                member: GuidedAccessMethod.registerAgent.rawValue)
            // Long enough for the service to be activated and take up its journal.
            let reply = try await connection.call(message, timeout: .seconds(25))
            service = reply.sender
            registered = true
            logger.notice("registered as the session agent with the GuidedAccess service \(reply.sender ?? "?")")
        } catch {
            switch error.name {
            case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
                logger.info("no GuidedAccess system service on the system bus; registering when one appears")
            case GuidedAccessError.notAuthorized("").dbusErrorName, "org.freedesktop.DBus.Error.AccessDenied":
                logger.warning(
                    "the GuidedAccess service does not admit this agent: \(error.message); registering again when seat0's session or the service changes"
                )
            default:
                logger.error("cannot register with the GuidedAccess service: \(error); registering when it is back")
            }
        }
    }

    /// Only the system service may call the agent.
    private func checkCaller(_ call: MethodCall) async throws(DBusError) {
        if call.sender == service { return }
        // Its name may have moved on before the agent heard.
        let owner = try? await connection.nameOwner(GuidedAccessBus.name)
        guard let owner, owner == call.sender else {
            throw .accessDenied(
                "only the GuidedAccess service (\(GuidedAccessBus.name)) may call the session agent; \(call.sender) is not it")
        }
        service = owner
    }

    // MARK: Apply and Release

    private func apply(_ call: MethodCall, _ names: [String], _ parameters: [String: Variant]) async throws {
        try await checkCaller(call)
        let features: Set<Feature>
        do {
            features = try Feature.parse(names)
        } catch {
            throw DBusError.invalidArgs(error.message)
        }
        let defaults = SessionDefaults()
        let zoomFactor = try Self.parameter(parameters, AgentBus.zoomFactorParameter, in: SessionLimits.zoomFactor) ?? defaults.zoomFactor
        let textScale = try Self.parameter(parameters, AgentBus.textScaleParameter, in: SessionLimits.textScale) ?? defaults.textScale
        do {
            try await store.exclusively { try await make(features, zoomFactor: zoomFactor, textScale: textScale) }
        } catch let error as GuidedAccessError {
            logger.error("Apply([\(features.sortedWireNames.joined(separator: ", "))]): \(error.message)")
            throw DBusError(name: AgentBus.failedError, message: error.message)
        }
        logger.info("applied: [\(features.sortedWireNames.joined(separator: ", "))]")
        await announce()
    }

    /// A launcher's browser, passed on by the service: the agent's browser
    /// driver takes it, as the user-mode service's does.
    private func attachBrowser(_ call: MethodCall, _ browser: UnixFD, launcher: String, uid: UInt32) async throws -> String {
        try await checkCaller(call)
        guard let browsers = store.drivers.lazy.compactMap({ $0 as? any BrowserAttaching }).first else {
            throw DBusError(name: "org.freedesktop.DBus.Error.NotSupported", message: "the session agent drives no browser")
        }
        guard let descriptor = browser.duplicate() else {
            throw DBusError.failed("cannot take the browser's socket: the agent has no file descriptor left")
        }
        do {
            return try await browsers.attach(BusCaller(uniqueName: launcher, identity: CallerIdentity(uid: uid)), descriptor: descriptor)
        } catch {
            throw DBusError(name: error.dbusErrorName, message: error.message)
        }
    }

    private func release(_ call: MethodCall) async throws {
        try await checkCaller(call)
        do {
            try await store.exclusively { try await make([], zoomFactor: 1, textScale: 1) }
        } catch let error as GuidedAccessError {
            throw DBusError(name: AgentBus.failedError, message: error.message)
        }
        registered = false
        logger.notice("released by the GuidedAccess service; registering again when seat0's session or the service changes")
        await announce()
    }

    /// Makes exactly `features` real, in a turn.
    private func make(_ features: Set<Feature>, zoomFactor: Double, textScale: Double) async throws(GuidedAccessError) {
        let wanted =
            features.isEmpty
            ? nil
            : Session(
                owner: nil, ownerIdentity: OwnerIdentity(uid: getuid(), executablePath: nil), features: features,
                zoomFactor: zoomFactor, textScale: textScale, inhibitSleep: false, deadlineUsec: 0)
        if !recovered {
            // The first call: what the journal names is adopted for what is
            // wanted now, the rest stops.
            recovered = true
            let state = JournalState(session: wanted, restrictions: [], drivers: found?.drivers ?? [:])
            found = nil
            let recovery = await store.recover(state, ownerConnected: { _ in false }, nowUsec: 0)
            log(recovery.notes)
            if let problem = recovery.journalProblem { logger.error("\(problem)") }
            // What could not be adopted or started is tried once more, and fails the call.
            if wanted != nil {
                let problems = await store.reapply()
                guard problems.isEmpty else { throw .backendFailed(problems.joined(separator: "; ")) }
            }
            return
        }
        guard let wanted else {
            if store.session != nil {
                let ending = try await store.end()
                for problem in ending.problems { logger.error("stopping what the session ran: \(problem)") }
                if let problem = ending.journalProblem { logger.error("\(problem)") }
            } else {
                _ = await store.settle()
            }
            return
        }
        guard let current = store.session else { return try await store.begin(wanted) }
        if current.zoomFactor != zoomFactor || current.textScale != textScale {
            _ = try await store.end()
            try await store.begin(wanted)
        } else if current.features != features {
            try await store.setFeatures(features)
        } else {
            // The same again: what is missing (a program given up on) starts.
            let problems = await store.reapply()
            guard problems.isEmpty else { throw .backendFailed(problems.joined(separator: "; ")) }
        }
    }

    private static func parameter(
        _ parameters: [String: Variant], _ name: String, in range: ClosedRange<Double>
    ) throws(DBusError) -> Double? {
        guard let value = parameters[name] else { return nil }
        guard case .double(let number) = value.value, range.contains(number) else {
            throw .invalidArgs("parameter '\(name)' must be a double in \(range.lowerBound)…\(range.upperBound), got \(value.value)")
        }
        return number
    }

    // MARK: The drivers

    private func driverEvent(_ driver: String, _ event: DriverEvent) async {
        switch event {
        case .changed:
            let (changed, problems) = await store.driversChanged()
            for problem in problems { logger.error("after \(driver) changed, applying the session again: \(problem)") }
            if changed {
                logSupport()
                await announce()
            }
        case .recordChanged:
            if let problem = store.noteRecords() { logger.error("\(driver): \(problem)") }
        case .featureLost(let feature, let message, let fields):
            logger.error("\(message)")
            // The service audits it, as it audits its own programs giving up.
            guard registered, let service else { return }
            do {
                try await connection.emit(
                    AgentSignal.featureLost.rawValue, interface: AgentBus.interface, path: AgentBus.objectPath,
                    [
                        .string(feature.wireName), .string(message),
                        .dictionary(
                            key: .string, value: .string,
                            fields.sorted { $0.key < $1.key }.map { .init(.string($0.key), .string($0.value)) }),
                    ], destination: service)
            } catch {
                logger.error("telling the service that \(feature) was lost: \(error)")
            }
        }
    }

    private func logSupport() {
        let support = store.support
        let missing = Feature.allCases.compactMap { support.reasons[$0] }
        logger.info(
            "session agent: desktop \(support.desktop), delivers \(support.supported.sortedWireNames.joined(separator: ", "))\(missing.isEmpty ? "" : "; not: " + missing.joined(separator: "; "))"
        )
    }

    private func log(_ notes: [DriverNote]) {
        for note in notes {
            switch note.level {
            case .info: logger.info("\(note.text)")
            case .notice: logger.notice("\(note.text)")
            case .error: logger.error("\(note.text)")
            }
        }
    }

    // MARK: The interface

    private func announce() async {
        guard exported else { return }
        await connection.propertiesChanged(path: AgentBus.objectPath, interface: AgentBus.interface)
    }

    private var supportedFeatures: [String] { store.support.supported.sortedWireNames }
    private var desktop: String { store.support.desktop }

    /// For each feature it cannot deliver, why (without the feature's name).
    private var unsupportedReasons: [String: String] {
        var reasons: [String: String] = [:]
        for (feature, reason) in store.support.reasons {
            let prefix = "\(feature.wireName): "
            reasons[feature.wireName] = reason.hasPrefix(prefix) ? String(reason.dropFirst(prefix.count)) : reason
        }
        return reasons
    }

    func interface() -> Interface { Self.interface(handledBy: self) }

    /// `org.guidedaccess.Agent1` as declared (its XML in the docs).
    public static var declaration: Interface { interface(handledBy: nil) }

    private static func on(_ agent: AgentService?) throws -> AgentService {
        guard let agent else { throw DBusError.failed("the interface is not served") }
        return agent
    }

    private static func interface(handledBy agent: AgentService?) -> Interface {
        Interface(
            AgentBus.interface,
            documentation: [
                "": """
                    The GuidedAccess session agent (1.2): run as the kiosk user in its graphical session \
                    (guidedaccessd --agent), it makes real there what the system service sends it. Only the \
                    service's connection may call it.
                    """,
                AgentMethod.apply.rawValue: """
                    Make exactly these features real in the session now: start what is missing, stop what is \
                    no longer wanted. parameters: zoom-factor (d), text-scale (d). Returns once started; fails \
                    with org.guidedaccess.Agent1.Error.Failed naming the feature and why.
                    """,
                AgentMethod.release.rawValue: "Stop everything this agent started; it is no longer the agent.",
                AgentMethod.attachBrowser.rawValue: """
                    A kiosk browser's DevTools socket, which its launcher (guidedaccessctl browser, connection \
                    launcher, user uid) attached to the system service: the agent drives its pages. Returns the \
                    browser's product once it answered; errors as the service's AttachBrowser.
                    """,
                AgentProperty.supportedFeatures.rawValue: "What the agent can deliver in its session now.",
                AgentProperty.desktop.rawValue: "The desktop the agent detected in its session.",
                AgentSignal.featureLost.rawValue: """
                    A feature of the session the agent no longer delivers (its program gave up restarting), \
                    sent to the service only, which audits it (an addition beyond API 1.2).
                    """,
                AgentProperty.unsupportedReasons.rawValue: """
                    For each feature it cannot deliver, why (an addition beyond API 1.2: the service puts it \
                    in its UnsupportedFeature messages).
                    """,
            ],
            methods: [
                Method(
                    AgentMethod.apply.rawValue,
                    Argument("features", [String].self, bounds: ArgumentBounds(elements: Feature.allCases.count)),
                    Argument("parameters", [String: Variant].self, bounds: ArgumentBounds(elements: 2, values: 8))
                ) { call, features, parameters in
                    try await on(agent).apply(call, features, parameters)
                },
                Method(AgentMethod.release.rawValue) { call in
                    try await on(agent).release(call)
                },
                Method(
                    AgentMethod.attachBrowser.rawValue, Argument("browser", UnixFD.self), Argument("launcher", String.self),
                    Argument("uid", UInt32.self), returns: Argument("product", String.self)
                ) { call, browser, launcher, uid in
                    try await on(agent).attachBrowser(call, browser, launcher: launcher, uid: uid)
                },
            ],
            properties: [
                Property(AgentProperty.supportedFeatures.rawValue, [String].self) {
                    await agent?.supportedFeatures ?? []
                },
                Property(AgentProperty.desktop.rawValue, String.self) {
                    await agent?.desktop ?? ""
                },
                Property(AgentProperty.unsupportedReasons.rawValue, [String: String].self) {
                    await agent?.unsupportedReasons ?? [:]
                },
            ],
            signals: [
                Signal(
                    AgentSignal.featureLost.rawValue, Argument("feature", String.self),
                    Argument("message", String.self), Argument("fields", [String: String].self))
            ])
    }
}
