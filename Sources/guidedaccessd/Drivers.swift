import BrowserLayer
import DBus
import DconfBackend
import GSettingsBackend
import GuidedAccessCore
import KioskSession
import SessionAgent

/// The drivers of this service, in the order the session transaction runs
/// them: the one place that names them. Adding a desktop or a transport is
/// a driver in a driver module and a line here.
enum Drivers {
    /// The configuration keys the drivers' modules own.
    static let configurationKeys: [DriverConfigurationKey] = [
        Desktop.configurationKey, BrowserPagesDriver.configurationKey, BrowserPagesDriver.originsKey,
    ]

    /// `[Service] Backend=`: where the settings keys go.
    static func settingsBackend(_ configuration: ServiceConfiguration, loop: EventLoop) throws -> any SettingsBackend {
        switch configuration.backend {
        case .gsettings:
            let gsettings = GSettingsBackend(loop: loop)
            logger.info("gsettings backend: \(gsettings.store.rawValue) store")
            gsettings.onNote = { logger.info("gsettings backend: \($0)") }
            return gsettings
        case .memory:
            return MemorySettingsBackend()
        case .dconf:
            let dconf: DconfBackend
            do {
                dconf = try DconfBackend(
                    databaseDir: configuration.dconf.databaseDir, databaseName: configuration.dconf.databaseName,
                    lockOutsideSession: configuration.dconf.lockOutsideSession)
                dconf.onWarning = { logger.warning("dconf backend: \($0)") }
                // Before the journal is recovered and the name requested. Keys a
                // resumed session imposes keep their values. Without
                // LockOutsideSession this removes a baseline an earlier
                // configuration left.
                let hadBaseline = !dconf.baseline.isEmpty
                try dconf.lockBaseline(dconf.schemaDefaults(of: FeatureKeyMap.allRequirements.map { $0.key }))
                if configuration.dconf.lockOutsideSession {
                    logger.info("dconf backend: \(dconf.baseline.count) keys locked at their defaults outside a session")
                } else if hadBaseline {
                    logger.notice("dconf backend: LockOutsideSession is off: the baseline lock of an earlier configuration is removed")
                }
            } catch {
                throw StartError("dconf backend: \(error.message)")
            }
            if let warning = profileWarning(databaseDir: configuration.dconf.databaseDir, name: configuration.dconf.databaseName) {
                logger.warning("dconf backend: \(warning)")
            }
            return dconf
        }
    }

    /// Why the kiosk user's session may not see the database, or nil: the
    /// profile beside the databases (`/etc/dconf/profile/user` for
    /// `/etc/dconf/db`), which every user without one of their own reads,
    /// does not name it — sessions would then succeed and change nothing on
    /// the screen.
    static func profileWarning(databaseDir: String, name: String) -> String? {
        let base = databaseDir.hasSuffix("/db") ? String(databaseDir.dropLast(3)) : databaseDir + "/.."
        let profile = base + "/profile/user"
        let lines = ((try? FileContents.read(profile)) ?? nil).map { String(decoding: $0, as: UTF8.self) } ?? ""
        let names = lines.split(whereSeparator: \.isNewline).map { $0.trimmingASCIIWhitespace }
        guard !names.contains(where: { $0 == "system-db:" + name }) else { return nil }
        return "\(profile) does not read system-db:\(name): the kiosk user's session sees none of the session's "
            + "settings or locks, so sessions change nothing on its screen; run guidedaccess-dconf-profile once "
            + "(or add the line to the kiosk user's own profile, if it has one)"
    }

    /// The list for `mode`: the settings keys first; then the desktop that
    /// acts on them — user mode: found in the session the service runs in,
    /// which also runs the programs the desktop lacks, and the kiosk
    /// browser's pages where configured; system mode: logind's seat0, and
    /// the session agent, which does in the kiosk user's session what user
    /// mode does there. Returns the agents' registry too (system mode).
    static func list(
        mode: ServiceMode, configuration: ServiceConfiguration, policy: AccessPolicy, backend: any SettingsBackend,
        connection: Connection, environment: [String: String]
    ) -> (drivers: [any FeatureDriver], agents: AgentProxyDriver?) {
        var drivers: [any FeatureDriver] = [SettingsDriver(backend: backend)]
        switch mode {
        case .user:
            // The memory backend stands for a whole kiosk by itself: nothing runs in a session.
            drivers += session(
                configuration, owner: .service, connection: connection, environment: environment,
                programs: !backend.realisesEveryFeature)
            return (drivers, nil)
        case .system:
            let seat = SeatDesktopDriver(
                configured: Desktop.configured(configuration.driverValue(group: "Service", key: "Desktop")),
                connection: connection, logger: logger)
            let agents = AgentProxyDriver(
                connection: connection, allowedUIDs: policy.agentUIDs, seatUser: { fresh in fresh ? await seat.askActiveUser() : seat.activeUser },
                presence: { seat.agentPresent = $0 }, logger: logger)
            seat.follow { agents.seatChanged() }
            // The browser's pages are the agent's: the system unit has no network.
            return (drivers + [seat, agents], agents)
        }
    }

    /// The drivers of the kiosk user's session, as the user-mode service
    /// and the session agent run them (`connection`: the session bus): the
    /// desktop found there, the programs it lacks (`programs`), the kiosk
    /// browser's pages where configured.
    static func session(
        _ configuration: ServiceConfiguration, owner: ProgramOwner, connection: Connection, environment: [String: String],
        programs: Bool = true
    ) -> [any FeatureDriver] {
        let desktop = SessionDesktopDriver(
            configured: Desktop.configured(configuration.driverValue(group: "Service", key: "Desktop")),
            environment: environment, connection: connection, logger: logger)
        var drivers: [any FeatureDriver] = [desktop]
        if programs {
            drivers.append(SessionProgramsDriver(desktop: desktop, owner: owner, loop: connection.loop, bus: connection, logger: logger))
            drivers.append(X11CompositorDriver(desktop: desktop, owner: owner, loop: connection.loop, bus: connection, logger: logger))
            drivers.append(X11SettingsDriver(desktop: desktop, owner: owner, loop: connection.loop, bus: connection, logger: logger))
        }
        // Always there: a launcher may attach a browser (`AttachBrowser`).
        drivers.append(
            BrowserPagesDriver(
                endpoint: BrowserPagesDriver.configured(configuration.driverValue(group: "Browser", key: "DevToolsEndpoint")),
                allowedOrigins: BrowserPagesDriver.origins(configuration.driverValue(group: "Browser", key: "AllowOrigins")),
                loop: connection.loop, logger: logger))
        return drivers
    }
}

struct StartError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
