import DBus
import Glibc
import GuidedAccessCore
import KioskSession
import Logging

/// The `org.guidedaccess.GuidedAccess1` service: sessions, features and
/// restrictions over a settings backend, crash-safe through the journal.
///
/// It runs on the connection's executor (one serial executor for the bus and
/// all service state). Every handler has one shape: read arguments → validate
/// → authorize → change state (journal first, then settings) → announce
/// property changes and signals → reply.
public actor GuidedAccessService {
    public static let busName = "org.guidedaccess.GuidedAccess1"
    public static let path: ObjectPath = "/org/guidedaccess/GuidedAccess1"
    public static let interfaceName = "org.guidedaccess.GuidedAccess1"
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

        public init(
            mode: ServiceMode, policy: AccessPolicy, defaults: SessionDefaults, journal: SessionJournal,
            authority: any Authority, audit: AuditLog, desktop: Desktop? = nil,
            sessionEnvironment: [String: String] = [:],
            systemBus: @escaping @Sendable () async -> Connection? = { nil }
        ) {
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
    let backend: any SettingsBackend
    let settings: Settings
    let keyMap: FeatureKeyMap
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
    let backendName: String
    let logger: Logger

    var session: Session?
    /// One more for every session begun or resumed from the journal: which
    /// session a call was admitted for (`requireSameSession`).
    var sessionGeneration: UInt64 = 0
    var registry = RestrictionRegistry()
    var deadlineTask: Task<Void, Never>?
    var ownerWatch: SubscriptionToken?
    /// The bus's credentials of callers by unique name, which the bus never
    /// gives to another connection: asked once per connection, not per call.
    var credentialCache = CredentialCache(capacity: 64)
    /// A pending journal write after keys were given back (`journalSoon`).
    var journalRefresh: Task<Void, Never>?
    let inhibitor: SleepInhibitor
    /// Whether the object is on the bus: before, signals have no one to go to
    /// (the name is not ours yet) and the bus layer refuses them.
    var exported = false

    public nonisolated var unownedExecutor: UnownedSerialExecutor { connection.unownedExecutor }

    public init(connection: Connection, backend: sending any SettingsBackend, settings: Settings, logger: Logger) {
        self.connection = connection
        self.backend = backend
        self.settings = settings
        self.logger = logger
        backendName = backend.name
        inhibitor = SleepInhibitor(systemBus: settings.systemBus, logger: logger)
        (backendSupported, keyMap) = FeatureKeyMap.probe {
            backend.availability(of: $0.key, for: $0.exampleValue) == .available
        }
        var programs: [Feature: SessionProgram] = [:]
        if settings.mode == .user, !backend.realisesEveryFeature {
            for kind in SessionProgramKind.allCases {
                programs[kind.feature] = SessionProgram(kind, loop: connection.loop, bus: connection, logger: logger)
            }
        }
        self.programs = programs
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
        await detectDesktop()
        logSupport()
        try await recoverJournal()
        for (feature, program) in programs.sorted(by: { $0.key < $1.key }) {
            await program.stopUnknownUnits(keeping: session?.programs[feature])
        }
        try await connection.export([interface()], at: Self.path)
        exported = true
    }

    private func recoverJournal() async throws {
        let state: JournalState?
        do {
            state = try settings.journal.load()
        } catch {
            guard case .corrupt = error else { throw error }
            // Kept aside by the journal; the service starts without a session.
            logger.error("\(error)")
            state = nil
        }
        registry = RestrictionRegistry(restrictions: state?.restrictions ?? [])
        guard var recovered = state?.session else {
            do {
                let released = try backend.startedWithoutSession()
                if !released.isEmpty {
                    logger.notice(
                        "no session in the journal: \(released.map { "\($0)" }.joined(separator: ", ")) no longer imposed")
                }
            } catch {
                logger.error("no session in the journal, but what the backend still applies stays: \(error.message)")
            }
            return
        }
        if let owner = recovered.owner, (try? await connection.nameOwner(owner)) != owner {
            recovered.owner = nil
        }
        if reconcileSettings(with: &recovered, expired: recovered.isExpired(nowUsec: Self.nowUsec())) {
            do {
                try record(recovered)
            } catch {
                logger.error("\(error)")
            }
        }
        session = recovered
        sessionGeneration &+= 1
        logger.notice(
            "resumed the session of \(recovered.ownerIdentity) from the journal: features \(recovered.features.sortedWireNames)"
        )
        if recovered.isExpired(nowUsec: Self.nowUsec()) {
            logger.notice("its time limit passed while the service was down; ending it")
            for (feature, leftOver) in recovered.programs {
                await programs[feature]?.stopLeftOver(leftOver, environment: programEnvironment)
            }
            do {
                try await endSession(reason: "time-limit")
            } catch {
                logger.error("cannot end the expired session yet: \(error); retrying")
                scheduleDeadline()
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

    /// The journal is written before the settings, and keys a call gives
    /// back (a feature turned off) leave its snapshot only at a later write
    /// (`journalSoon`). So a resumed session may be one call ahead of the
    /// keys, or still list keys it gave back. This puts the keys in line
    /// with it:
    /// - a key its features require gets their value;
    /// - a listed key they do not require is put back to its snapshot value
    ///   only while it still has a value the session would have written
    ///   (the restore never happened); otherwise it was given back already —
    ///   perhaps changed by the user since — and is left alone. Either way it
    ///   leaves the snapshot, so the session's end does not touch it; only a
    ///   key whose restore fails here stays, for the end to restore.
    /// A session past its time limit (`expired`) is about to end: nothing is
    /// written, the end restores what the snapshot keeps.
    /// Then EnabledFeatures is the truth, and turning a recorded feature on
    /// again (which changes nothing) leaves no key behind. Returns whether
    /// the session changed (the caller journals it).
    private func reconcileSettings(with recovered: inout Session, expired: Bool) -> Bool {
        let wanted = keyMap.keyValues(for: recovered.features, options: recovered.keyMapOptions)
        var changes: [SettingKey: SettingValue?] = [:]
        var givenBack: [SettingKey] = []
        for (key, stored) in recovered.snapshot.sorted(by: { $0.key < $1.key }) {
            let current: SettingValue?
            do {
                current = try backend.userValue(of: key)
            } catch {
                logger.error("cannot read \(key) to check it against the journal: \(error.message)")
                continue
            }
            if let value = wanted[key] {
                if !expired && current != value { changes[key] = .some(value) }
                continue
            }
            let sessionValues = Feature.allCases.filter { !recovered.features.contains($0) }.compactMap {
                keyMap.keyValues(for: recovered.features.union([$0]), options: recovered.keyMapOptions)[key]
            }
            if let current, sessionValues.contains(current), current != stored.settingValue {
                // The restore never happened.
                guard !expired else { continue }
                changes[key] = .some(stored.settingValue)
            }
            givenBack.append(key)
        }
        if !changes.isEmpty {
            let keys = changes.keys.sorted().map { "\($0)" }.joined(separator: ", ")
            do {
                try backend.apply(changes)
                logger.notice("the journal was ahead of the settings (a crash mid-call): \(keys) put in line with it")
            } catch {
                logger.error("cannot put \(keys) in line with the journal: \(error.message)")
                // Those still to be restored stay in the snapshot: the session's end restores them.
                givenBack.removeAll { changes[$0] != nil }
            }
        }
        recovered.forgetSnapshot(of: givenBack)
        return !givenBack.isEmpty
    }

    // MARK: The interface

    func interface() -> Interface {
        Interface(
            Self.interfaceName,
            methods: [
                Method("StartSession", inputs: [Argument("options", "a{sv}")]) { [self] call in
                    try await audited(call) { try await self.startSession(call) }
                    return []
                },
                Method("EndSession") { [self] call in
                    try await audited(call) { try await self.endSessionCall(call) }
                    return []
                },
                Method("ConfigureForSession", inputs: [Argument("features", "as"), Argument("enabled", "b")]) {
                    [self] call in
                    try await audited(call) { try await self.configureForSession(call) }
                    return []
                },
                Method("RegisterRestrictions", inputs: [Argument("restrictions", "a(sss)")]) { [self] call in
                    try await audited(call) { try await self.registerRestrictions(call) }
                    return []
                },
                Method("UnregisterRestrictions", inputs: [Argument("identifiers", "as")]) { [self] call in
                    try await audited(call) { try await self.unregisterRestrictions(call) }
                    return []
                },
                Method("SetRestrictionState", inputs: [Argument("identifier", "s"), Argument("state", "s")]) {
                    [self] call in
                    try await audited(call) { try await self.setRestrictionState(call) }
                    return []
                },
                Method(
                    "GetRestrictionState", inputs: [Argument("identifier", "s")], outputs: [Argument("state", "s")]
                ) { [self] call in
                    [.string(try await restrictionState(try call.argument(0)))]
                },
                Method("ListRestrictions", outputs: [Argument("restrictions", "a(ssss)")]) { [self] _ in
                    [await restrictionList()]
                },
            ],
            properties: [
                Property("SessionActive", "b") { [self] in .bool(await session != nil) },
                Property("SessionOwner", "s") { [self] in .string(await session?.ownerProperty ?? "") },
                Property("SessionDeadline", "t") { [self] in .uint64(await session?.deadlineUsec ?? 0) },
                Property("EnabledFeatures", "as") { [self] in
                    (await session?.features ?? []).sortedWireNames.dbusValue
                },
                Property("SupportedFeatures", "as") { [self] in await supported.sortedWireNames.dbusValue },
                Property("Desktop", "s") { [self] in .string(await desktop.rawValue) },
                Property("Backend", "s", changes: .constant) { [self] in .string(backendName) },
                Property("Version", "s", changes: .constant) { .string(GuidedAccessService.version) },
            ],
            signals: [
                Signal("SessionChanged", [Argument("active", "b"), Argument("reason", "s")]),
                Signal("RestrictionChanged", [Argument("identifier", "s"), Argument("state", "s")]),
            ])
    }

    // MARK: Sessions

    func startSession(_ call: MethodCall) async throws {
        let raw: [String: Variant] = try call.argument(0)
        let options = try SessionOptions(parsing: raw.mapValues(Self.optionValue), defaults: settings.defaults)
        try requireSupported(options.features)

        let caller = try await identify(call)
        let method = SessionMethod.startSession(hasOptions: !raw.isEmpty)
        try await admit(settings.policy.admission(for: method, session: session, caller: caller), call)

        switch try Session.decide(method, session: session, caller: caller) {
        case .takeOver:
            let generation = sessionGeneration
            try await takeOver(by: caller)
            guard isCurrent(generation) else { return }  // ended meanwhile: its end was announced
            await emit("SessionChanged", [.bool(true), .string("resumed")])
        case .start:
            var new = Session(owner: caller, options: options, nowUsec: Self.nowUsec())
            let change = keyMap.change(from: [], to: new.features, options: new.keyMapOptions)
            try write(change, into: &new)
            session = new
            sessionGeneration &+= 1
            let generation = sessionGeneration
            let started = programsTurnedOn(from: [], to: new.features)
            if !started.isEmpty {
                do {
                    try await startPrograms(started, for: generation)
                } catch {
                    abandon(generation)
                    throw error
                }
                guard isCurrent(generation) else { return }
            }
            logger.notice(
                "session started by \(caller.uniqueName) (\(caller.identity.ownerIdentity)), features \(new.features.sortedWireNames)")
            settings.audit.record(
                .sessionStarted, caller: caller.identity, "guided access session started by \(caller.identity.ownerIdentity)",
                fields: [
                    "OWNER": caller.uniqueName, "FEATURES": new.features.sortedWireNames.joined(separator: " "),
                    "DEADLINE_USEC": String(new.deadlineUsec),
                ])
            scheduleDeadline()
            // Announced before the first wait for the bus; after each wait,
            // nothing more if the session ended meanwhile (an EndSession
            // queued behind this one): no "started" after "ended", no sleep
            // inhibitor for a session that is gone.
            await announce()
            await emit("SessionChanged", [.bool(true), .string("started")])
            await watchOwner(caller.uniqueName)
            guard isCurrent(generation) else { return }
            if new.inhibitSleep { await inhibitor.acquire() }
        case .asOwner, .needsOperator:
            throw GuidedAccessError.sessionBusy("a session is active")
        }
    }

    func configureForSession(_ call: MethodCall) async throws {
        let names: [String] = try call.argument(0)
        let enabled: Bool = try call.argument(1)
        guard !names.isEmpty else { throw GuidedAccessError.invalidArgs("the list of features is empty") }
        let requested = try Feature.parse(names)
        if enabled { try requireSupported(requested) }

        let caller = try await identify(call)
        let generation = sessionGeneration
        try await admit(settings.policy.admission(for: .configureForSession, session: session, caller: caller), call)
        try requireSameSession(generation, orNone: true)
        let decision = try Session.decide(.configureForSession, session: session, caller: caller)
        if decision == .takeOver { try await takeOver(by: caller) }
        try requireSameSession(generation)
        guard var new = session else { throw GuidedAccessError.notInSession("no session is active") }

        let features = enabled ? new.features.union(requested) : new.features.subtracting(requested)
        guard features != new.features else {
            // On already — but its program may have been given up on: turning
            // it on again starts it again.
            let given = programFeatures.intersection(requested).filter { new.programs[$0] == nil }
            if enabled, !given.isEmpty { try await startPrograms(given, for: sessionGeneration) }
            return
        }
        let change = keyMap.change(from: new.features, to: features, options: new.keyMapOptions)
        let before = new.features
        new.features = features
        try write(change, into: &new)
        stopProgramsTurnedOff(from: before, in: &new)
        session = new
        let started = programsTurnedOn(from: before, to: features)
        if !started.isEmpty {
            do {
                try await startPrograms(started, for: sessionGeneration)
            } catch {
                do {
                    try turnOff(features.subtracting(before))
                } catch {
                    logger.error("cannot turn off what a call whose program failed turned on: \(error)")
                }
                await announce()
                throw error
            }
        }
        logger.info("features \(enabled ? "on" : "off"): \(requested.sortedWireNames); now \(features.sortedWireNames)")
        settings.audit.record(
            .featuresChanged, caller: caller.identity,
            "features \(requested.sortedWireNames.joined(separator: ", ")) turned \(enabled ? "on" : "off")",
            fields: [
                "CHANGED": requested.sortedWireNames.joined(separator: " "), "ENABLED": enabled ? "true" : "false",
                "FEATURES": features.sortedWireNames.joined(separator: " "),
            ])
        await announce()
    }

    func endSessionCall(_ call: MethodCall) async throws {
        let caller = try await identify(call)
        let generation = sessionGeneration
        let admission = settings.policy.admission(for: .endSession, session: session, caller: caller)
        try await admit(admission, call)
        var reason = "ended"
        try requireSameSession(generation, orNone: true)
        let decision = try Session.decide(.endSession, session: session, caller: caller)
        switch decision {
        case .needsOperator:
            // Polkit already granted end-session if admission asked it.
            if admission == .admitted, !settings.policy.isOperator(caller.identity) {
                try await settings.authority.authorize(
                    action: PolkitAction.endSession.id, busName: caller.uniqueName,
                    interactive: call.allowInteractiveAuthorization)
            }
            reason = "ended-by-operator"
        case .takeOver:
            try await takeOver(by: caller)
        case .asOwner, .start:
            break
        }
        try requireSameSession(generation)
        try await endSession(reason: reason, by: caller)
    }

    /// A call is admitted for the session there is once its caller is known,
    /// then may wait (polkit, a take-over's bus calls) while other calls run:
    /// that session may have ended meanwhile, and another — perhaps of
    /// another owner — begun. It must not act on that one.
    ///
    /// `orNone`: also passes when there is no session at all (the call's own
    /// checks then report NotInSession as the spec orders the errors).
    private func requireSameSession(_ generation: UInt64, orNone: Bool = false) throws {
        if orNone, session == nil { return }
        guard isCurrent(generation) else {
            throw GuidedAccessError.notInSession("the session ended while this call waited")
        }
    }

    func isCurrent(_ generation: UInt64) -> Bool {
        session != nil && sessionGeneration == generation
    }

    /// Puts every written key back, resets the restrictions, forgets the
    /// session. On a backend failure the session stays, nothing is lost.
    func endSession(reason: String, by endedBy: BusCaller? = nil) async throws {
        guard let ending = session else { throw GuidedAccessError.notInSession("no session is active") }
        do {
            try backend.apply(ending.restoringChanges)
        } catch {
            throw GuidedAccessError.backendFailed("\(backend.name) backend: cannot restore the settings: \(error.message)")
        }
        let reset = registry.resetAll()
        session = nil
        stopPrograms()
        deadlineTask?.cancel()
        deadlineTask = nil
        let watch = ownerWatch
        ownerWatch = nil
        inhibitor.release()
        // Journaled before the first await: a call that runs meanwhile (a
        // new session's start) journals after this, never before it.
        do {
            try settings.journal.record(JournalState(session: nil, restrictions: registry.restrictions))
            journalWritten()
        } catch {
            // The settings are back, but a journal that still holds the
            // session would bring it back at the next start. Remove it (the
            // registered restrictions go with it: better than a session).
            logger.error("cannot record the end of the session: \(error); removing the journal")
            do {
                try settings.journal.discard()
                journalWritten()
            } catch {
                logger.critical("cannot remove the journal either: \(error); the next start resumes the ended session")
            }
        }
        logger.notice("session ended (\(reason)); \(ending.snapshot.count) keys restored")
        settings.audit.record(
            .sessionEnded, caller: endedBy?.identity, "guided access session ended (\(reason))",
            fields: ["REASON": reason, "RESTORED_KEYS": String(ending.snapshot.count)])
        // The signals go out before the one wait for the bus below, so none
        // can follow what calls queued behind this one announce.
        for identifier in reset { await emit("RestrictionChanged", [.string(identifier), .string("allow")]) }
        await announce()
        await emit("SessionChanged", [.bool(false), .string(reason)])
        if let watch { await connection.unsubscribe(watch) }
    }

    /// Records the snapshot of the keys `change` writes, journals, then
    /// writes — all or nothing.
    func write(_ change: KeyMapChange, into new: inout Session) throws {
        guard !change.isEmpty else {
            try record(new)
            return
        }
        for (key, value) in change.write {
            do {
                try backend.validate(value, for: key)
            } catch {
                throw GuidedAccessError.unsupportedFeature(error.message)
            }
        }
        do {
            try new.recordSnapshot(of: change.write.keys) { key throws(SettingsBackendError) in
                try backend.userValue(of: key)
            }
        } catch {
            throw GuidedAccessError.backendFailed("\(backend.name) backend: \(error.message)")
        }
        let changes = new.settingChanges(for: change)
        let previous = JournalState(session: session, restrictions: registry.restrictions)
        try settings.journal.applyJournaled(
            changes, to: backend, state: JournalState(session: new, restrictions: registry.restrictions),
            previous: previous)
        journalWritten()
        if !change.restore.isEmpty {
            new.forgetSnapshot(of: change.restore)
            journalSoon()
        }
    }

    /// Keys given back leave the snapshot only after their restore was
    /// written, so the journal written before it still lists them; a restart
    /// would then have to guess whether they are still owed
    /// (`reconcileSettings`). The journal is written again once calls have
    /// paused for `journalRefreshDelay` — off every call's path, and once for
    /// a burst of calls. Any journal write in between makes it unnecessary.
    private func journalSoon() {
        journalRefresh?.cancel()
        let loop = connection.loop
        journalRefresh = Task(executorPreference: loop) { [self] in
            do {
                try await loop.sleep(for: Self.journalRefreshDelay)
            } catch {
                return  // cancelled: a later write or a later turn-off takes over
            }
            await refreshJournal()
        }
    }

    static let journalRefreshDelay: Duration = .milliseconds(250)

    /// Every journal write holds the session as it is in memory, without
    /// keys given back by earlier calls: a pending refresh is then moot.
    private func journalWritten() {
        journalRefresh?.cancel()
        journalRefresh = nil
    }

    private func refreshJournal() {
        journalRefresh = nil
        guard let session else { return }
        do {
            try record(session)
        } catch {
            logger.error("cannot bring the journal up to date after a feature was turned off: \(error)")
        }
    }

    func record(_ new: Session?) throws {
        do {
            try settings.journal.record(JournalState(session: new, restrictions: registry.restrictions))
            journalWritten()
        } catch {
            throw GuidedAccessError.backendFailed("cannot record the session: \(error)")
        }
    }

    private func takeOver(by caller: BusCaller) async throws {
        guard var taken = session else { return }
        taken.takeOver(by: caller)
        try record(taken)
        session = taken
        logger.notice("session taken over by \(caller.uniqueName) (\(caller.identity.ownerIdentity))")
        settings.audit.record(
            .sessionResumed, caller: caller.identity, "guided access session resumed by \(caller.identity.ownerIdentity)",
            fields: ["OWNER": caller.uniqueName])
        await watchOwner(caller.uniqueName)
        await announce()
    }

    // MARK: Owner tracking

    /// Follows the owner's connection through NameOwnerChanged; a signal,
    /// not polling.
    private func watchOwner(_ owner: String) async {
        if let old = ownerWatch {
            ownerWatch = nil
            await connection.unsubscribe(old)
        }
        do {
            let watch = try await connection.subscribe(.nameOwnerChanged(for: owner)) { [self] message in
                guard case .string(let newOwner)? = try? message.arguments().last, newOwner.isEmpty else { return }
                Task(executorPreference: connection.loop) { await self.ownerLeft(owner) }
            }
            // Other calls ran while this waited: the session may have ended,
            // changed hands, or had its owner watched by a later call.
            guard session?.owner == owner, ownerWatch == nil else {
                await connection.unsubscribe(watch)
                return
            }
            ownerWatch = watch
            // It may have left before the match was in place.
            if (try? await connection.nameOwner(owner)) != owner { await ownerLeft(owner) }
        } catch {
            logger.error("cannot watch the session owner \(owner): \(error)")
        }
    }

    private func ownerLeft(_ owner: String) async {
        guard var current = session, current.connectionLeft(owner) else { return }
        session = current
        logger.notice("the session owner \(owner) left the bus; the session stays for its successor")
        try? record(current)
        let watch = ownerWatch
        ownerWatch = nil
        if let watch { await connection.unsubscribe(watch) }
        await announce()
    }

    // MARK: Time limit

    /// One timer for the deadline — nothing wakes the service otherwise.
    private func scheduleDeadline() {
        deadlineTask?.cancel()
        deadlineTask = nil
        guard let deadline = session?.deadlineUsec, deadline != 0 else { return }
        deadlineTask = Task(executorPreference: connection.loop) { [self] in
            var backoff: Duration = .seconds(1)
            let now = Self.nowUsec()
            if deadline > now {
                do {
                    try await connection.loop.sleep(for: .microseconds(deadline - now))
                } catch {
                    return
                }
            }
            while !Task.isCancelled {
                do {
                    try await timeLimitReached(deadline)
                    return
                } catch {
                    logger.error("ending the session at its time limit failed: \(error); retrying in \(backoff)")
                    try? await connection.loop.sleep(for: backoff)
                    backoff = min(backoff * 2, .seconds(60))
                }
            }
        }
    }

    private func timeLimitReached(_ deadline: UInt64) async throws {
        guard let current = session, current.deadlineUsec == deadline else { return }
        try await endSession(reason: "time-limit")
    }

    // MARK: Restrictions

    func registerRestrictions(_ call: MethodCall) async throws {
        guard case .array(_, let items) = call.arguments[0] else { return }
        var batch: [RestrictionRegistration] = []
        for item in items {
            guard case .structure(let fields) = item, fields.count == 3,
                case .string(let identifier) = fields[0], case .string(let text) = fields[1],
                case .string(let detail) = fields[2]
            else { throw GuidedAccessError.invalidArgs("a restriction must be (identifier, text, detail)") }
            batch.append(RestrictionRegistration(identifier: identifier, text: text, detail: detail))
        }
        var scratch = registry
        try scratch.register(batch)  // the whole batch is checked before anything else
        try await admitClient(call)
        var current = registry  // as it is after the await
        try current.register(batch)
        try commit(current)
        logger.info("registered restrictions \(batch.map { $0.identifier })")
    }

    func unregisterRestrictions(_ call: MethodCall) async throws {
        let identifiers: [String] = try call.argument(0)
        guard !identifiers.isEmpty else { throw GuidedAccessError.invalidArgs("the list of identifiers is empty") }
        var scratch = registry
        try scratch.unregister(identifiers)
        try await admitClient(call)
        var current = registry
        try current.unregister(identifiers)
        try commit(current)
        logger.info("unregistered restrictions \(identifiers)")
    }

    func setRestrictionState(_ call: MethodCall) async throws {
        let identifier: String = try call.argument(0)
        let state = try RestrictionState(wireName: try call.argument(1))
        _ = try registry.state(of: identifier)
        let caller = try await identify(call)
        let generation = sessionGeneration
        try await admit(settings.policy.verdict(for: caller.identity, action: .manageRestrictions), call)
        guard session != nil else {
            throw GuidedAccessError.notInSession("restriction states can change only inside a session")
        }
        // Asked for the session there was when the call came (an operator's
        // answer to polkit may take long), not one begun since.
        try requireSameSession(generation)
        var updated = registry
        guard try updated.setState(state, of: identifier) else { return }
        try commit(updated)
        logger.info("restriction \(identifier) is now \(state) (by \(caller.uniqueName))")
        settings.audit.record(
            .restrictionChanged, caller: caller.identity, "restriction \(identifier) set to \(state)",
            fields: ["RESTRICTION": identifier, "STATE": state.rawValue])
        await emit("RestrictionChanged", [.string(identifier), .string(state.rawValue)])
    }

    func restrictionState(_ identifier: String) throws -> String {
        guard session != nil else {
            _ = try registry.state(of: identifier)
            return RestrictionState.allow.rawValue
        }
        return try registry.state(of: identifier).rawValue
    }

    func restrictionList() -> DBusValue {
        .array(
            .structure([.string, .string, .string, .string]),
            registry.restrictions.map {
                .structure([.string($0.identifier), .string($0.text), .string($0.detail), .string($0.state.rawValue)])
            })
    }

    private func commit(_ updated: RestrictionRegistry) throws {
        do {
            try settings.journal.record(JournalState(session: session, restrictions: updated.restrictions))
            journalWritten()
        } catch {
            throw GuidedAccessError.backendFailed("cannot record the restrictions: \(error)")
        }
        registry = updated
    }

    // MARK: Callers

    /// Who is calling, from the bus and /proc, never from anything the caller
    /// says: the bus's credentials of the connection (cached per unique
    /// name), and — read anew each call, as a process may exec another
    /// program — its executable and systemd unit.
    private func identify(_ call: MethodCall) async throws -> BusCaller {
        let credentials: Credentials
        if let cached = credentialCache[call.sender] {
            credentials = cached
        } else {
            do {
                credentials = try await connection.credentials(of: call.sender)
            } catch {
                throw GuidedAccessError.notAuthorized("cannot learn who \(call.sender) is: \(error.message)")
            }
            if let fd = credentials.processFD { close(fd) }
            credentialCache[call.sender] = Credentials(
                unixUserID: credentials.unixUserID, unixGroupIDs: credentials.unixGroupIDs,
                processID: credentials.processID)
        }
        guard let uid = credentials.unixUserID else {
            throw GuidedAccessError.notAuthorized("the bus does not know the user of \(call.sender)")
        }
        let pid = credentials.processID ?? 0
        let identity = CallerIdentity(
            uid: uid, gids: credentials.unixGroupIDs ?? [], pid: pid,
            executablePath: pid == 0 ? nil : ProcessInfo.executable(of: pid),
            systemdUnit: pid == 0 ? nil : ProcessInfo.systemdUnit(of: pid))
        return BusCaller(uniqueName: call.sender, identity: identity)
    }

    /// Runs a handler; a refusal (NotAuthorized, interactive authorization
    /// required) leaves an audit record naming the caller.
    private func audited(_ call: MethodCall, _ body: () async throws -> Void) async throws {
        do {
            try await body()
        } catch let error as GuidedAccessError {
            switch error {
            case .notAuthorized, .interactiveAuthorizationRequired:
                let caller = try? await identify(call)
                settings.audit.record(
                    .callDenied, caller: caller?.identity, "\(call.member) by \(call.sender) denied: \(error.message)",
                    fields: ["METHOD": call.member, "ERROR": error.dbusErrorName])
            default:
                break
            }
            throw error
        }
    }

    private func admit(_ verdict: AccessVerdict, _ call: MethodCall) async throws {
        guard case .askPolkit(let action) = verdict else { return }
        try await settings.authority.authorize(
            action: action, busName: call.sender, interactive: call.allowInteractiveAuthorization)
    }

    private func admitClient(_ call: MethodCall) async throws {
        let caller = try await identify(call)
        try await admit(settings.policy.verdict(for: caller.identity, action: .startSession), call)
    }

    // MARK: Announcements

    func announce() async {
        guard exported else { return }
        await connection.propertiesChanged(path: Self.path, interface: Self.interfaceName)
    }

    private func emit(_ signal: String, _ arguments: [DBusValue]) async {
        guard exported else { return }
        do {
            try await connection.emit(signal, interface: Self.interfaceName, path: Self.path, arguments)
        } catch {
            logger.error("cannot emit \(signal): \(error)")
        }
    }

    static func nowUsec() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return UInt64(ts.tv_sec) * 1_000_000 + UInt64(ts.tv_nsec) / 1000
    }

    static func optionValue(_ variant: Variant) -> OptionValue {
        switch variant.value {
        case .uint64(let v): return .uint64(v)
        case .double(let v): return .double(v)
        case .bool(let v): return .bool(v)
        case .array(.string, let items):
            return .stringArray(items.compactMap { if case .string(let s) = $0 { s } else { nil } })
        default: return .other(signature: variant.value.type.signature)
        }
    }
}

extension GuidedAccessError: DBusErrorConvertible {
    /// Thrown from a handler, the error reaches the caller under its D-Bus name.
    public var dbusError: DBusError { DBusError(name: dbusErrorName, message: message) }
}

/// A small map of unique bus names to their credentials. Unique names are
/// never reused on a bus, so an entry cannot go stale in a harmful way; the
/// oldest entries go when it is full, which bounds it however many clients
/// come and go.
struct CredentialCache {
    let capacity: Int
    private var entries: [String: Credentials] = [:]
    private var order: [String] = []

    init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    var count: Int { entries.count }

    subscript(name: String) -> Credentials? {
        get { entries[name] }
        set {
            guard let newValue else {
                if entries.removeValue(forKey: name) != nil { order.removeAll { $0 == name } }
                return
            }
            if entries.updateValue(newValue, forKey: name) == nil {
                order.append(name)
                if order.count > capacity {
                    let evicted = order.count - capacity
                    for old in order.prefix(evicted) { entries[old] = nil }
                    order.removeFirst(evicted)
                }
            }
        }
    }
}
