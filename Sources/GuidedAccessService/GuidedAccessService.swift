import DBus
import Glibc
import GuidedAccessCore
import GuidedAccessWire
import Logging

/// The `org.guidedaccess.GuidedAccess1` service: sessions, features and
/// restrictions over the drivers that make features real, crash-safe
/// through the journal.
///
/// It runs on the connection's executor (one serial executor for the bus and
/// all service state). Every handler has one shape: validate the arguments →
/// one block of waits that identifies and admits the caller → one check that
/// the session is the one it was admitted for → the change, through the
/// `SessionStore` (journal first, then the drivers in order) →
/// announcements → reply. It knows no driver by name: `guidedaccessd`
/// builds the list.
///
/// The service's parts, by file: this one (state, start-up, the interface
/// table, announcements), Sessions, Restrictions, Callers, Drivers.
public actor GuidedAccessService {
    public static let version = "0.1.0"

    public struct Settings: Sendable {
        public var mode: ServiceMode
        public var policy: AccessPolicy
        public var defaults: SessionDefaults
        public var authority: any Authority
        /// The system bus, for logind's sleep inhibitor; nil when there is none.
        public var systemBus: @Sendable () async -> Connection?
        public var audit: AuditLog
        /// The settings backend's name, for the `Backend` property.
        public var backendName: String
        /// (1.2) `[Browser] AllowOrigins=`: what the session agent may hand
        /// on page calls of (system mode).
        public var allowedOrigins: Set<String> = []

        public init(
            mode: ServiceMode, policy: AccessPolicy, defaults: SessionDefaults, authority: any Authority,
            audit: AuditLog, backendName: String, systemBus: @escaping @Sendable () async -> Connection? = { nil },
            allowedOrigins: Set<String> = []
        ) {
            self.allowedOrigins = allowedOrigins
            self.audit = audit
            self.mode = mode
            self.policy = policy
            self.defaults = defaults
            self.authority = authority
            self.backendName = backendName
            self.systemBus = systemBus
        }
    }

    let connection: Connection
    let settings: Settings
    /// The session, the restrictions, the journal and the drivers.
    let store: SessionStore
    var session: Session? { store.session }
    let logger: Logger

    var deadlineTask: Task<Void, Never>?
    var ownerWatch: SubscriptionToken?
    /// The bus's credentials of callers by unique name, which the bus never
    /// gives to another connection: asked once per connection, not per call.
    var credentialCache = CredentialCache(capacity: 64)
    /// When connections appeared on the bus, where that is needed to tell
    /// a caller's process from a later one with its pid (`followConnectionAges`).
    var connectionAges: ConnectionAges?
    /// A pending journal write after a driver gave something back
    /// (`journalSoonIfBehind`), and when it is due.
    var journalRefresh: Task<Void, Never>?
    var journalRefreshDue: ContinuousClock.Instant?
    /// Retries putting back what a session that did not start left (`settleSoon`).
    var settleTask: Task<Void, Never>?
    let inhibitor: SleepInhibitor
    /// Whether the object is on the bus: before, signals have no one to go to
    /// (the name is not ours yet) and the bus layer refuses them.
    var exported = false
    /// Whether a driver wants to hear of reads of `SupportedFeatures` and `Desktop`.
    let driversFollowReads: Bool
    /// (1.2) Who may be the session agent and which one is (system mode);
    /// nil in user mode, where the service is its own agent.
    let agents: (any AgentRegistry)?
    /// (1.2) The driver a launcher's browser is attached to (`AttachBrowser`);
    /// nil where none drives the browser's pages in the service itself.
    let browsers: (any BrowserAttaching)?
    /// (1.2) The driver that serves the page API (`PageCalls`), if any.
    let pages: (any PageServing)?
    /// The features pages were last told of (`featureschange`).
    var featuresToldPages: [String] = []
    /// (1.2, system mode) The launchers that attached a browser, whose
    /// pages' calls the agent hands on naming them.
    var launchers = Launchers()

    public nonisolated var unownedExecutor: UnownedSerialExecutor { connection.unownedExecutor }

    /// `drivers`: how features reach the person at the kiosk, in the order
    /// the session transaction runs them (the settings keys first).
    /// `agents`: in system mode, the registry of session agents (one of the
    /// drivers).
    package init(
        connection: Connection, drivers: sending [any FeatureDriver], agents: (any AgentRegistry)? = nil,
        journal: SessionJournal, settings: Settings, logger: Logger
    ) {
        self.agents = agents
        self.connection = connection
        self.settings = settings
        self.logger = logger
        inhibitor = SleepInhibitor(systemBus: settings.systemBus, logger: logger)
        driversFollowReads = drivers.contains { $0.followsReads }
        browsers = drivers.lazy.compactMap { $0 as? any BrowserAttaching }.first
        pages = drivers.lazy.compactMap { $0 as? any PageServing }.first
        store = SessionStore(journal: journal, drivers: drivers)
    }

    // MARK: Start-up

    /// Starts the drivers, recovers the journal, then exports the object.
    /// The caller requests the bus name afterwards, so no call reaches a
    /// half-built service.
    public func start() async throws {
        await followConnectionAges()
        followAgents()
        servePages()
        await startDrivers()
        try await recoverJournal()
        try await connection.export([interface()], at: GuidedAccessBus.objectPath)
        exported = true
    }

    private func recoverJournal() async throws {
        let state: JournalState?
        do {
            state = try store.journal.load { name, record throws(DriverRecordError) in
                try store.drivers.first { $0.name == name }?.validate(record)
            }
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
        // In a turn: a driver's event meanwhile (a desktop coming up) waits
        // until the session is taken up.
        let recovery = try await store.exclusively {
            await store.recover(state, ownerConnected: connected.contains, nowUsec: Self.nowUsec())
        }
        log(recovery.notes)
        if let problem = recovery.journalProblem { logger.error("\(problem)") }
        if store.hasLeftovers { settleSoon() }
        guard let recovered = recovery.session else { return }
        logger.notice(
            "resumed the session of \(recovered.ownerIdentity) from the journal: features \(recovered.features.sortedWireNames)"
        )
        if recovery.endsNow {
            let reason: SessionChangeReason = recovery.unfinishedEnd ? .ended : .timeLimit
            logger.notice(
                recovery.unfinishedEnd
                    ? "its end was under way when the service stopped; finishing it"
                    : "its time limit passed while the service was down; ending it")
            do {
                try await endSession(reason: reason)
            } catch {
                logger.error("cannot end the session yet: \(error); retrying")
                scheduleEnd(of: store.generation, reason: reason)
            }
            return
        }
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
                    try await service.audited(call) { try await service.startSession(.bus(call), options) }
                },
                Method(GuidedAccessMethod.endSession.rawValue) { call in
                    let service = try on(service)
                    try await service.audited(call) { try await service.endSessionCall(.bus(call)) }
                },
                Method(
                    GuidedAccessMethod.configureForSession.rawValue,
                    MethodArguments.features, MethodArguments.enabled
                ) { call, features, enabled in
                    let service = try on(service)
                    try await service.audited(call) { try await service.configureForSession(.bus(call), features, enabled) }
                },
                Method(
                    GuidedAccessMethod.registerRestrictions.rawValue,
                    MethodArguments.restrictions
                ) { call, batch in
                    let service = try on(service)
                    try await service.audited(call) { try await service.registerRestrictions(.bus(call), batch) }
                },
                Method(
                    GuidedAccessMethod.unregisterRestrictions.rawValue,
                    MethodArguments.identifiers
                ) { call, identifiers in
                    let service = try on(service)
                    try await service.audited(call) { try await service.unregisterRestrictions(.bus(call), identifiers) }
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
                Method(GuidedAccessMethod.registerAgent.rawValue) { call in
                    try await on(service).registerAgent(call)
                },
                Method(GuidedAccessMethod.attachBrowser.rawValue, Argument("browser", UnixFD.self)) { call, browser in
                    let service = try on(service)
                    try await service.audited(call) { try await service.attachBrowser(call, browser) }
                },
                Method(
                    GuidedAccessMethod.pageCall.rawValue, Argument("call", String.self), returns: Argument("answer", String.self)
                ) { call, text in
                    try await on(service).agentPageCall(call, text)
                },
                Method(
                    GuidedAccessMethod.pageLeft.rawValue, Argument("launcher", String.self), Argument("tab", String.self),
                    Argument("origin", String.self)
                ) { call, launcher, tab, origin in
                    try await on(service).agentPageLeft(call, launcher, tab, origin)
                },
            ],
            properties: [
                Property(GuidedAccessProperty.sessionActive.rawValue, Bool.self) {
                    await service?.session != nil
                },
                Property(GuidedAccessProperty.sessionOwner.rawValue, String.self) {
                    await service?.session?.ownerProperty ?? ""
                },
                Property(GuidedAccessProperty.sessionOwnerOrigin.rawValue, String.self) {
                    await service?.session?.ownerOriginProperty ?? ""
                },
                Property(GuidedAccessProperty.sessionDeadline.rawValue, UInt64.self) {
                    await service?.session?.deadlineUsec ?? 0
                },
                Property(GuidedAccessProperty.enabledFeatures.rawValue, [String].self) {
                    (await service?.session?.features ?? []).sortedWireNames
                },
                Property(
                    GuidedAccessProperty.supportedFeatures.rawValue, [String].self,
                    get: { await service?.supportedFeatures ?? [] }, onRead: service?.readLookout),
                Property(
                    GuidedAccessProperty.unsupportedReasons.rawValue, [String: String].self,
                    get: { await service?.unsupportedReasons ?? [:] }, onRead: service?.readLookout),
                Property(
                    GuidedAccessProperty.desktop.rawValue, String.self,
                    get: { await service?.desktop ?? "" }, onRead: service?.readLookout),
                Property(GuidedAccessProperty.agent.rawValue, String.self) {
                    await service?.agentUser ?? ""
                },
                Property(GuidedAccessProperty.backend.rawValue, String.self, changes: .constant) {
                    service?.settings.backendName ?? ""
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

    /// `SupportedFeatures`, `UnsupportedReasons` and `Desktop`: what the drivers deliver now.
    var supportedFeatures: [String] { store.support.supported.sortedWireNames }
    var desktop: String { store.support.desktop }
    /// `UnsupportedReasons`: for each feature not supported, the message of
    /// the `UnsupportedFeature` error a call asking for it gets.
    var unsupportedReasons: [String: String] {
        Dictionary(uniqueKeysWithValues: store.support.reasons.map { ($0.key.wireName, $0.value) })
    }

    /// What the session now is reaches the bus (`PropertiesChanged` of
    /// what changed). Every change of the session comes through here.
    func announce() async {
        guard exported else { return }
        tellPagesOfFeatures()
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
        tellPages(.sessionChanged(active: active, reason: reason.rawValue))
        await emit(.sessionChanged, [.bool(active), .string(reason.rawValue)])
    }

    func emitRestrictionChanged(_ identifier: String, _ state: RestrictionState) async {
        tellPages(.restrictionChanged(id: identifier, state: state.rawValue))
        await emit(.restrictionChanged, [.string(identifier), .string(state.rawValue)])
    }

    static func nowUsec() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return UInt64(ts.tv_sec) * 1_000_000 + UInt64(ts.tv_nsec) / 1000
    }
}
