import DBus
import Glibc
import GuidedAccessCore
import KioskSession

/// Which desktop the features act on, what that makes of `SupportedFeatures`,
/// and the screen reader the service starts where the session does not
/// (spec: "Making features real").
extension GuidedAccessService {
    // MARK: Detection

    /// Detects the desktop at start-up; in user mode it is then followed
    /// (names on the bus, display sockets coming and going).
    func detectDesktop() async {
        if settings.mode == .system {
            let source: String
            if let configured = settings.desktop {
                (desktop, source) = (configured, "[Service] Desktop=")
            } else {
                (desktop, source) = await systemDesktop()
            }
            sessionStartsScreenReader = SessionProbe.desktopStartsScreenReader()
            logger.info(
                "desktop: \(desktop) (\(source)); screen reader \(sessionStartsScreenReader ? "started by the desktop from its key" : "not started by any installed desktop")"
            )
            updateSupport()
            return
        }
        let loop = connection.loop
        for name in Desktop.watchedBusNames {
            do {
                desktopWatch.append(
                    try await connection.subscribe(.nameOwnerChanged(for: name)) { [self] _ in
                        Task(executorPreference: loop) { await self.redetectDesktop() }
                    })
            } catch {
                logger.error("desktop: cannot follow \(name) on the bus: \(error)")
            }
        }
        let probe = SessionProbe(environment: settings.sessionEnvironment)
        socketWatch = DisplaySocketWatch(
            directories: [probe.runtimeDirectory, "/tmp/.X11-unix"].compactMap { $0 }, loop: loop
        ) { [self] in
            Task(executorPreference: loop) { await self.redetectDesktop() }
        }
        await redetectDesktop(initial: true)
    }

    /// User mode: the desktop as the session shows it now. Announces a change.
    func redetectDesktop(initial: Bool = false) async {
        let probe = SessionProbe(environment: settings.sessionEnvironment)
        var names: Set<String> = []
        for name in Desktop.watchedBusNames where (try? await connection.nameOwner(name)) != nil {
            names.insert(name)
        }
        let display = probe.display()
        let detected = settings.desktop ?? Desktop.detect(probe.evidence(busNames: names, display: display))
        let startsScreenReader = names.contains(Desktop.gnomeSessionBusName)
        guard initial || detected != desktop || display != self.display || startsScreenReader != sessionStartsScreenReader
        else { return }
        let source = settings.desktop != nil ? "[Service] Desktop=" : "detected"
        if !initial { logger.notice("desktop: now \(detected) (\(source); \(display))") }
        let moved = display.x11Display != self.display.x11Display || display.waylandDisplay != self.display.waylandDisplay
            || display.compositorPID != self.display.compositorPID
        desktop = detected
        self.display = display
        sessionStartsScreenReader = startsScreenReader
        if initial {
            logger.info(
                "desktop: \(desktop) (\(source); \(display)); screen reader \(startsScreenReader ? "started by gnome-session from its key" : "started by the service")"
            )
            updateSupport()
        } else {
            updateSupport()
            logSupport()
            await reconcilePrograms(displayMoved: moved)
            await announce()
        }
    }

    /// The desktop changed during a session: the programs it now needs for
    /// the session's features start, those it no longer needs stop, and —
    /// the displays moved (a compositor restarted) — running ones start
    /// again in the new ones.
    func reconcilePrograms(displayMoved: Bool) async {
        guard let current = session else { return }
        let generation = store.generation
        var stopping: Set<Feature> = []
        var starting: Set<Feature> = []
        for feature in programs.keys where current.features.contains(feature) {
            let needed = programFeatures.contains(feature)
            let running = current.programs[feature] != nil
            if running, !needed || displayMoved { stopping.insert(feature) }
            if needed, !running || displayMoved { starting.insert(feature) }
        }
        stopPrograms(of: stopping)
        if let problem = store.note({ for feature in stopping { $0.programs[feature] = nil } }) {
            logger.error("\(problem)")
        }
        do {
            try await startPrograms(starting, for: generation)
        } catch {
            logger.error("programs for the changed desktop: \(error)")
        }
    }

    /// System mode (spec): the active graphical session on seat0 from
    /// logind, else the desktop installed.
    private func systemDesktop() async -> (Desktop, String) {
        if let (name, type) = await activeSeatSession(), type == "wayland" || type == "x11" {
            if let named = Desktop.named(sessionDesktop: name) { return (named, "logind: seat0's session, \(name)") }
            if type == "x11" { return (.x11, "logind: seat0's session, X11") }
        }
        if access("/usr/bin/gnome-shell", X_OK) == 0 { return (.gnomeShell, "gnome-shell is installed") }
        return (.none, "no graphical session on seat0, no desktop installed")
    }

    /// seat0's active session's `Desktop` and `Type`, or nil (no logind, no
    /// active session, no answer within 2 s).
    private func activeSeatSession() async -> (String, String)? {
        let login1 = "org.freedesktop.login1"
        func property(_ path: ObjectPath, _ interface: String, _ name: String) async -> DBusValue? {
            let reply = try? await connection.call(
                destination: login1, path: path, interface: "org.freedesktop.DBus.Properties", member: "Get",
                [.string(interface), .string(name)], timeout: .seconds(2))
            guard case .variant(let value)? = reply?.first else { return nil }
            return value
        }
        guard case .structure(let active)? = await property("/org/freedesktop/login1/seat/seat0", "org.freedesktop.login1.Seat", "ActiveSession"),
            active.count == 2, case .objectPath(let path) = active[1], path.description != "/"
        else { return nil }
        guard case .string(let name)? = await property(path, "org.freedesktop.login1.Session", "Desktop"),
            case .string(let type)? = await property(path, "org.freedesktop.login1.Session", "Type")
        else { return nil }
        return (name, type)
    }

    // MARK: What is supported

    /// How the detected desktop realises features now.
    var realisation: FeatureRealisation {
        desktop.realisation(sessionStartsScreenReader: sessionStartsScreenReader)
    }

    /// The features the service itself runs a program for on this desktop.
    var programFeatures: Set<Feature> { realisation.byProgram.filter { programs[$0] != nil } }

    /// `SupportedFeatures` and the reason for each feature left out: the
    /// backend must have the keys; then the desktop must act on them, or
    /// the service must be able to run the program that delivers it.
    func updateSupport() {
        var supported: Set<Feature> = []
        var reasons: [Feature: String] = [:]
        let installation = SessionProbe(environment: settings.sessionEnvironment).installation
        for feature in Feature.allCases {
            if !backendSupported.contains(feature) {
                reasons[feature] = "feature '\(feature)' is not supported by this system's settings backend"
            } else if !backend.realisesEveryFeature, let reason = undelivered(feature, installation) {
                reasons[feature] = reason
            } else {
                supported.insert(feature)
            }
        }
        self.supported = supported
        unsupportedReasons = reasons
    }

    /// Why the person at the kiosk would not get `feature` here, or nil.
    private func undelivered(_ feature: Feature, _ installation: ProgramInstallation) -> String? {
        let realisation = self.realisation
        let byBrowser = browserFeatures.contains(feature)
        if byBrowser, browserConnected { return nil }
        let kind = SessionProgramKind(feature)
        if realisation.byKeys.contains(feature) {
            // The session starts the screen reader; it needs something to speak with all the same.
            guard kind == .screenReader else { return nil }
            return kind?.unavailableReason(installed: installation, x11Display: nil, waylandDisplay: nil, needsDisplay: false)
                .map { "\(feature): \($0)" }
        }
        guard let kind, realisation.byProgram.contains(feature) else {
            guard byBrowser, let browser else { return "\(feature): the desktop '\(desktop)' does not act on it" }
            return "\(feature): the desktop '\(desktop)' does not act on it, and no browser is connected at \(browser.endpoint)"
        }
        if settings.mode == .system {
            // The system service cannot run a program in the user's session.
            guard kind == .screenReader else {
                return "\(feature): in system mode the service cannot run a program in the kiosk user's session"
            }
            return desktop == .gnomeShell
                ? "screen-reader: in system mode only a desktop that starts the screen reader from its key can have one, and nothing installed here does (Orca's autostart entry, orca.service)"
                : "screen-reader: in system mode only a desktop that starts the screen reader from its key can have one, and \(desktop) does not"
        }
        return kind.unavailableReason(
            installed: installation, x11Display: display.x11Display, waylandDisplay: display.waylandDisplay
        ).map { "\(feature): \($0)" }
    }

    func logSupport() {
        let missing = Feature.allCases.compactMap { unsupportedReasons[$0] }
        let notSupported = missing.isEmpty ? "" : "; not supported: " + missing.joined(separator: "; ")
        logger.info(
            "backend \(backendName), desktop \(desktop): supported features \(supported.sortedWireNames.joined(separator: ", "))\(notSupported)"
        )
    }

    /// `UnsupportedFeature` for the first (sorted) feature not supported, with its reason.
    func requireSupported(_ features: Set<Feature>) throws(GuidedAccessError) {
        guard let missing = features.subtracting(supported).sorted().first else { return }
        throw .unsupportedFeature(unsupportedReasons[missing] ?? "feature '\(missing)' is not supported here")
    }

    // MARK: Programs in the session

    /// The environment a program gets: the service's own (its session's),
    /// the displays found, nothing of the service's systemd unit.
    var programEnvironment: [String: String] {
        var environment = settings.sessionEnvironment
        for name in [
            "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID",
            "SYSTEMD_EXEC_PID",
        ] {
            environment[name] = nil
        }
        if let wayland = display.waylandDisplay { environment["WAYLAND_DISPLAY"] = wayland }
        if let x11 = display.x11Display { environment["DISPLAY"] = x11 }
        if let xauthority = display.xauthority { environment["XAUTHORITY"] = xauthority }
        return environment
    }

    private func executable(_ kind: SessionProgramKind) throws(ProgramError) -> String {
        guard let path = SessionProbe(environment: settings.sessionEnvironment).executable(kind.executable) else {
            throw ProgramError("\(kind.executable) is not installed")
        }
        return path
    }

    /// The features a change from `before` to `after` turns on that need a
    /// program the service runs.
    func programsTurnedOn(from before: Set<Feature>, to after: Set<Feature>) -> Set<Feature> {
        programFeatures.intersection(after).subtracting(before)
    }

    /// Starts the programs of `features` for the session `generation`, once
    /// its keys are written and it is the session (other calls may run
    /// while a unit starts). Throws `BackendFailed` when one cannot be
    /// started; the caller undoes its change, which stops the others. A
    /// session that ended or turned a feature off meanwhile has stopped its
    /// program already.
    func startPrograms(_ features: Set<Feature>, for generation: UInt64) async throws(GuidedAccessError) {
        for feature in features.sorted() {
            guard let program = programs[feature] else { continue }
            let record: ProgramRecord
            do throws(ProgramError) {
                record = try await program.start(try executable(program.kind), environment: programEnvironment)
            } catch {
                guard store.isCurrent(generation) else { return }
                guard session?.features.contains(feature) == true else { continue }  // turned off meanwhile
                throw .backendFailed("\(feature): \(error.message); nothing was changed")
            }
            guard store.isCurrent(generation) else { return }
            guard session?.features.contains(feature) == true else { continue }
            if let problem = store.note({ $0.programs[feature] = record }) {
                logger.error("cannot journal the \(feature) program (\(record)): \(problem)")
            }
        }
    }

    /// Stops the programs of `features` (turned off, or the session ended).
    func stopPrograms(of features: Set<Feature>) {
        for feature in features { programs[feature]?.stop() }
    }

    /// A StartSession whose program could not be started: the session does
    /// not start — its programs stop, its keys go back, the journal holds no
    /// session. If the keys cannot be put back it stays, for EndSession to retry.
    func abandon(_ generation: UInt64) async {
        do {
            let ending = try await store.exclusively { () async throws -> SessionStore.Ending? in
                guard store.isCurrent(generation) else { return nil }
                stopPrograms(of: Set(programs.keys))
                return try await store.end()
            }
            guard let ending else { return }
            for identifier in ending.allowedAgain { await emitRestrictionChanged(identifier, .allow) }
            // Calls meanwhile may have announced the session.
            await announce()
        } catch {
            logger.error("cannot undo the session whose program failed: \(error); it stays for EndSession")
        }
    }

    /// A ConfigureForSession whose program could not be started: what the
    /// call turned on (`added`) goes off again, as a call turning it off
    /// would (all or nothing).
    func turnOff(_ added: Set<Feature>, for generation: UInt64) async {
        do {
            try await store.exclusively {
                guard store.isCurrent(generation), let current = session else { return }
                stopPrograms(of: try await store.setFeatures(current.features.subtracting(added)))
            }
            journalSoonIfBehind()
        } catch {
            logger.error("cannot turn off what a call whose program failed turned on: \(error)")
        }
    }

    /// A resumed session: its programs go again — the journal's runs if they
    /// are still there, else new ones — and the journal's runs of features
    /// the session no longer has this way are stopped.
    func resumePrograms() async {
        guard let recorded = session else { return }
        let generation = store.generation
        var records: [Feature: ProgramRecord] = [:]
        for (feature, program) in programs.sorted(by: { $0.key < $1.key }) {
            if recorded.features.contains(feature), programFeatures.contains(feature) {
                do throws(ProgramError) {
                    records[feature] = try await program.resume(
                        recorded.programs[feature], try executable(program.kind), environment: programEnvironment)
                } catch {
                    logger.error("\(feature): cannot start it for the resumed session: \(error)")
                }
            } else if let leftOver = recorded.programs[feature] {
                await program.stopLeftOver(leftOver, environment: programEnvironment)
            }
        }
        guard store.isCurrent(generation) else { return }
        if let problem = store.note({ $0.programs = records }) { logger.error("\(problem)") }
    }

    func programEvent(_ feature: Feature, _ event: SessionProgram.Event) {
        guard session?.features.contains(feature) == true else { return }
        switch event {
        case .restarted(let record):
            if let problem = store.note({ $0.programs[feature] = record }) { logger.error("\(problem)") }
        case .gaveUp(let exits, let lastExit):
            if let problem = store.note({ $0.programs[feature] = nil }) { logger.error("\(problem)") }
            settings.audit.record(
                .programGaveUp, caller: nil,
                "\(feature): its program exited \(exits) times within a minute (last: \(lastExit)); it is not started again",
                fields: ["FEATURE": feature.wireName, "EXITS": String(exits), "LAST_EXIT": lastExit])
        }
    }
}
