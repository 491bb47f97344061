import BrowserLayer
import DBus
import Glibc
import GuidedAccessCore
import GuidedAccessWire
import KioskSession
import Logging

/// The `org.guidedaccess.GuidedAccess1` service: sessions, features and
/// restrictions over a settings backend, crash-safe through the journal.
///
/// It runs on the connection's executor (one serial executor for the bus and
/// all service state). Every handler has one shape: validate the arguments →
/// one block of waits that identifies and admits the caller → one check that
/// the session is the one it was admitted for → the change, through the
/// `SessionStore` (journal first, then settings) → announcements and the
/// programs the change needs → reply.
///
/// The service's parts, by file: this one (state, start-up, the interface
/// table, announcements), Sessions, Restrictions, Callers, DesktopFeatures.
public actor GuidedAccessService {
    public static let version = "0.1.0"

    public struct Settings: Sendable {
        public var mode: ServiceMode
        public var policy: AccessPolicy
        public var defaults: SessionDefaults
        public var journal: SessionJournal
        public var authority: any Authority
        /// The system bus, for logind's sleep inhibitor; nil when there is none.
        public var systemBus: @Sendable () async -> Connection?
        public var audit: AuditLog
        /// `[Service] Desktop=`; nil detects it.
        public var desktop: Desktop?
        /// User mode: the service's own environment, which is its session's
        /// (displays, XDG_RUNTIME_DIR, the session bus); what the screen reader gets.
        public var sessionEnvironment: [String: String]
        /// `[Browser] DevToolsEndpoint=`: the kiosk browser; nil: no browser layer.
        public var devToolsEndpoint: DevToolsEndpoint?

        public init(
            mode: ServiceMode, policy: AccessPolicy, defaults: SessionDefaults, journal: SessionJournal,
            authority: any Authority, audit: AuditLog, desktop: Desktop? = nil,
            sessionEnvironment: [String: String] = [:], devToolsEndpoint: DevToolsEndpoint? = nil,
            systemBus: @escaping @Sendable () async -> Connection? = { nil }
        ) {
            self.devToolsEndpoint = devToolsEndpoint
            self.audit = audit
            self.desktop = desktop
            self.sessionEnvironment = sessionEnvironment
            self.mode = mode
            self.policy = policy
            self.defaults = defaults
            self.journal = journal
            self.authority = authority
            self.systemBus = systemBus
        }
    }

    let connection: Connection
    let settings: Settings
    /// The session, the restrictions, the journal and the settings backend.
    let store: SessionStore
    var backend: any SettingsBackend { store.backend }
    var session: Session? { store.session }
    /// Features whose keys this system's backend has.
    let backendSupported: Set<Feature>
    /// `SupportedFeatures`: what the person at the kiosk would get now
    /// (`updateSupport`), and why each other feature is not offered.
    var supported: Set<Feature> = []
    var unsupportedReasons: [Feature: String] = [:]
    /// The desktop the features act on (`Desktop`), and what decided it.
    var desktop: Desktop = .none
    var display = SessionDisplay()
    var sessionStartsScreenReader = false
    var desktopWatch: [SubscriptionToken] = []
    var socketWatch: DisplaySocketWatch?
    /// The programs the service runs for features where nothing in the
    /// session delivers them from the key (user mode, a backend that writes
    /// real settings): the screen reader, an on-screen keyboard.
    let programs: [Feature: SessionProgram]
    /// The features inside the kiosk browser's pages, when configured.
    let browser: BrowserLayer?
    /// Whether `browser` is connected, as `SupportedFeatures` and `Desktop` last said.
    var browserConnected = false
    let backendName: String
    let logger: Logger

    var deadlineTask: Task<Void, Never>?
    var ownerWatch: SubscriptionToken?
    /// The bus's credentials of callers by unique name, which the bus never
    /// gives to another connection: asked once per connection, not per call.
    var credentialCache = CredentialCache(capacity: 64)
    /// When connections appeared on the bus, where that is needed to tell
    /// a caller's process from a later one with its pid (`followConnectionAges`).
    var connectionAges: ConnectionAges?
    /// A pending journal write after keys were given back (`journalSoon`).
    var journalRefresh: Task<Void, Never>?
    /// Retries putting back owed keys (`settleOwedSoon`).
    var settleTask: Task<Void, Never>?
    let inhibitor: SleepInhibitor
    /// Whether the object is on the bus: before, signals have no one to go to
    /// (the name is not ours yet) and the bus layer refuses them.
    var exported = false

    public nonisolated var unownedExecutor: UnownedSerialExecutor { connection.unownedExecutor }

    public init(connection: Connection, backend: sending any SettingsBackend, settings: Settings, logger: Logger) {
        self.connection = connection
        self.settings = settings
        self.logger = logger
        backendName = backend.name
        inhibitor = SleepInhibitor(systemBus: settings.systemBus, logger: logger)
        let (supported, keyMap) = FeatureKeyMap.probe(backend)
        backendSupported = supported
        var programs: [Feature: SessionProgram] = [:]
        if settings.mode == .user, !backend.realisesEveryFeature {
            for kind in SessionProgramKind.allCases {
                programs[kind.feature] = SessionProgram(kind, loop: connection.loop, bus: connection, logger: logger)
            }
        }
        self.programs = programs
        browser = settings.devToolsEndpoint.map { BrowserLayer(endpoint: $0, loop: connection.loop, logger: logger) }
        store = SessionStore(journal: settings.journal, backend: backend, keyMap: keyMap)
    }

    // MARK: Start-up

    /// Recovers the journal, then exports the object. The caller requests
    /// the bus name afterwards, so no call reaches a half-built service.
    public func start() async throws {
        for (feature, program) in programs {
            program.onEvent { [self] event in
                Task(executorPreference: connection.loop) { await self.programEvent(feature, event) }
            }
        }
        await followConnectionAges()
        await detectDesktop()
        logSupport()
        try await recoverJournal()
        for (feature, program) in programs.sorted(by: { $0.key < $1.key }) {
            await program.stopUnknownUnits(keeping: session?.programs[feature])
        }
        await startBrowserLayer()
        try await connection.export([interface()], at: GuidedAccessBus.objectPath)
        exported = true
    }

    private func recoverJournal() async throws {
        let state: JournalState?
        do {
            state = try store.journal.load()
        } catch {
            guard case .corrupt = error else { throw error }
            // Kept aside by the journal; the service starts without a session.
            logger.error("\(error)")
            state = nil
        }
        var connected: Set<String> = []
        if let owner = state?.session?.owner, (try? await connection.nameOwner(owner)) == owner {
            connected.insert(owner)
        }
        let recovery = await store.recover(state, ownerConnected: connected.contains, nowUsec: Self.nowUsec())
        for (key, problem) in recovery.unreadable {
            logger.error("cannot read \(key) to check it against the journal: \(problem)")
        }
        if recovery.owedProblem {
            logger.error("cannot put back yet the keys a session that did not start may have changed; retrying")
            settleOwedSoon()
        }
        guard let recovered = recovery.plan.session else {
            switch recovery.released {
            case .success(let released) where !released.isEmpty:
                logger.notice("no session in the journal: \(released.map { "\($0)" }.joined(separator: ", ")) no longer imposed")
            case .failure(let error):
                logger.error("no session in the journal, but what the backend still applies stays: \(error.message)")
            default:
                break
            }
            return
        }
        if !recovery.plan.changes.isEmpty {
            let keys = recovery.plan.changes.keys.sorted().map { "\($0)" }.joined(separator: ", ")
            if let problem = recovery.writeProblem {
                logger.error("cannot put \(keys) in line with the journal: \(problem)")
            } else {
                logger.notice("the journal was ahead of the settings (a crash mid-call): \(keys) put in line with it")
            }
        }
        if let problem = recovery.journalProblem { logger.error("\(problem)") }
        logger.notice(
            "resumed the session of \(recovered.ownerIdentity) from the journal: features \(recovered.features.sortedWireNames)"
        )
        if recovery.plan.endsNow {
            let reason: SessionChangeReason = recovery.plan.unfinishedEnd ? .ended : .timeLimit
            logger.notice(
                recovery.plan.unfinishedEnd
                    ? "its end was under way when the service stopped; finishing it"
                    : "its time limit passed while the service was down; ending it")
            for (feature, leftOver) in recovered.programs {
                await programs[feature]?.stopLeftOver(leftOver, environment: programEnvironment)
            }
            do {
                try await endSession(reason: reason)
            } catch {
                logger.error("cannot end the session yet: \(error); retrying")
                scheduleEnd(of: store.generation, reason: reason)
            }
            return
        }
        // Before the deadline is armed: nothing else can end the session
        // while the object is not exported, so the programs resume for it.
        await resumePrograms()
        if let owner = recovered.owner { await watchOwner(owner) }
        scheduleDeadline()
        if recovered.inhibitSleep { await inhibitor.acquire() }
    }

    // MARK: The interface

    /// The interface as the bus serves it, handled by this service.
    func interface() -> Interface { Self.interface(handledBy: self) }

    /// The interface as declared, with its documentation and without a
    /// service behind it: `guidedaccessd --print-introspection` prints its
    /// `introspectionDocument`, the XML installed in
    /// /usr/share/dbus-1/interfaces/.
    public static var declaration: Interface { interface(handledBy: nil) }

    /// The one declaration of `org.guidedaccess.GuidedAccess1`: the bus's
    /// dispatch, its introspection and the installed XML all come from here.
    /// Handlers of a declaration without a service (`handledBy: nil`) are
    /// never called: no connection exports it.
    private static func interface(handledBy service: GuidedAccessService?) -> Interface {
        Interface(
            GuidedAccessBus.interface,
            documentation: InterfaceDocumentation.text,
            methods: [
                Method(
                    GuidedAccessMethod.startSession.rawValue,
                    MethodArguments.options
                ) { call, options in
                    let service = try on(service)
                    try await service.audited(call) { try await service.startSession(call, options) }
                },
                Method(GuidedAccessMethod.endSession.rawValue) { call in
                    let service = try on(service)
                    try await service.audited(call) { try await service.endSessionCall(call) }
                },
                Method(
                    GuidedAccessMethod.configureForSession.rawValue,
                    MethodArguments.features, MethodArguments.enabled
                ) { call, features, enabled in
                    let service = try on(service)
                    try await service.audited(call) { try await service.configureForSession(call, features, enabled) }
                },
                Method(
                    GuidedAccessMethod.registerRestrictions.rawValue,
                    MethodArguments.restrictions
                ) { call, batch in
                    let service = try on(service)
                    try await service.audited(call) { try await service.registerRestrictions(call, batch) }
                },
                Method(
                    GuidedAccessMethod.unregisterRestrictions.rawValue,
                    MethodArguments.identifiers
                ) { call, identifiers in
                    let service = try on(service)
                    try await service.audited(call) { try await service.unregisterRestrictions(call, identifiers) }
                },
                Method(
                    GuidedAccessMethod.setRestrictionState.rawValue, MethodArguments.identifier, MethodArguments.state
                ) { call, identifier, state in
                    let service = try on(service)
                    try await service.audited(call) { try await service.setRestrictionState(call, identifier, state) }
                },
                Method(
                    GuidedAccessMethod.getRestrictionState.rawValue, MethodArguments.identifier,
                    returns: MethodArguments.state
                ) { _, identifier in
                    try await on(service).restrictionState(identifier)
                },
                Method(
                    GuidedAccessMethod.listRestrictions.rawValue,
                    returns: Argument("restrictions", [Restriction].self)
                ) { _ in
                    try await on(service).restrictions
                },
            ],
            properties: [
                Property(GuidedAccessProperty.sessionActive.rawValue, Bool.self) {
                    await service?.session != nil
                },
                Property(GuidedAccessProperty.sessionOwner.rawValue, String.self) {
                    await service?.session?.ownerProperty ?? ""
                },
                Property(GuidedAccessProperty.sessionDeadline.rawValue, UInt64.self) {
                    await service?.session?.deadlineUsec ?? 0
                },
                Property(GuidedAccessProperty.enabledFeatures.rawValue, [String].self) {
                    (await service?.session?.features ?? []).sortedWireNames
                },
                Property(
                    GuidedAccessProperty.supportedFeatures.rawValue, [String].self,
                    get: { await service?.supported.sortedWireNames ?? [] }, onRead: service?.browserLookout),
                Property(
                    GuidedAccessProperty.desktop.rawValue, String.self,
                    get: { await service?.desktopProperty() ?? "" }, onRead: service?.browserLookout),
                Property(GuidedAccessProperty.backend.rawValue, String.self, changes: .constant) {
                    service?.backendName ?? ""
                },
                Property(GuidedAccessProperty.version.rawValue, String.self, changes: .constant) {
                    GuidedAccessService.version
                },
            ],
            signals: [
                Signal(
                    GuidedAccessSignal.sessionChanged.rawValue, Argument("active", Bool.self),
                    Argument("reason", String.self)),
                Signal(
                    GuidedAccessSignal.restrictionChanged.rawValue, Argument("identifier", String.self),
                    Argument("state", String.self)),
            ])
    }

    private static func on(_ service: GuidedAccessService?) throws -> GuidedAccessService {
        guard let service else { throw DBusError.failed("the interface is not served") }
        return service
    }

    // MARK: Announcements

    /// What the session now is reaches the browser's pages, then the bus
    /// (`PropertiesChanged`). Every change of the session comes through here.
    func announce() async {
        await showInBrowser()
        guard exported else { return }
        await connection.propertiesChanged(path: GuidedAccessBus.objectPath, interface: GuidedAccessBus.interface)
    }

    func emit(_ signal: GuidedAccessSignal, _ arguments: [DBusValue]) async {
        guard exported else { return }
        do {
            try await connection.emit(
                signal.rawValue, interface: GuidedAccessBus.interface, path: GuidedAccessBus.objectPath, arguments)
        } catch {
            logger.error("cannot emit \(signal.rawValue): \(error)")
        }
    }

    func emitSessionChanged(active: Bool, _ reason: SessionChangeReason) async {
        await emit(.sessionChanged, [.bool(active), .string(reason.rawValue)])
    }

    func emitRestrictionChanged(_ identifier: String, _ state: RestrictionState) async {
        await emit(.restrictionChanged, [.string(identifier), .string(state.rawValue)])
    }

    static func nowUsec() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return UInt64(ts.tv_sec) * 1_000_000 + UInt64(ts.tv_nsec) / 1000
    }
}
