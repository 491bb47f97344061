import DBus
import GuidedAccessCore
import Logging

/// The desktop of the kiosk, as a service outside the kiosk user's session
/// finds it (system mode): `[Service] Desktop=` where set, else logind's
/// active session on `seat0` (its `Desktop` and `Type`), followed live; with
/// neither, `none`. Never what is installed: an installed package is no
/// evidence of what the kiosk runs.
///
/// What it delivers is what the locked keys deliver on that desktop. The
/// system service runs no program in the kiosk user's session; without a
/// session agent the screen reader counts only where that session starts
/// one from its key: a GNOME session (the display manager starts it through
/// gnome-session, which starts Orca from `screen-reader-enabled`). While an
/// agent is registered (`agentPresent`) it says nothing: the agent, which
/// sees the session from inside, tells the desktop and what it delivers.
///
/// It also tells who the user of seat0's active session is (`activeUser`),
/// by which the service admits an agent where `[Agent] AllowUsers=` names
/// none.
public final class SeatDesktopDriver: DesktopDriver, @unchecked Sendable {
    public let name = "desktop"
    let configured: Desktop?
    /// The system bus, where logind is.
    private let connection: Connection
    private let logger: Logger
    public private(set) var desktop: Desktop = .none
    /// What logind says of seat0's active session; nil: no graphical one (or no logind).
    private var seatSession: SeatSession?
    /// What the locked keys deliver on `desktop`, without an agent.
    private var ownCapabilities: [Feature: FeatureCapability] = [:]
    package var capabilities: [Feature: FeatureCapability] { agentPresent ? [:] : ownCapabilities }
    package var desktopPart: DesktopPart? { agentPresent ? nil : .desktop(desktop.rawValue) }
    /// A session agent is registered and tells what it delivers: this
    /// driver stands aside (the caller announces the change).
    public var agentPresent = false
    /// The uid of the user of seat0's active graphical session; nil: none.
    public var activeUser: UInt32? { seatSession?.uid }

    /// The same, asked of logind now rather than as it was last announced.
    public nonisolated(nonsending) func askActiveUser() async -> UInt32? { await activeSeatSession()?.uid }
    /// Called when seat0's active session changed, before the service hears of it.
    private var followers: [() -> Void] = []
    private var events: (@Sendable (DriverEvent) -> Void)?
    private var watches: [SubscriptionToken] = []
    private let detection = OneAtATime()

    static let login1 = "org.freedesktop.login1"
    static let seatPath: ObjectPath = "/org/freedesktop/login1/seat/seat0"

    struct SeatSession: Hashable, Sendable, CustomStringConvertible {
        var desktopName: String
        var type: String
        /// Its user; nil when logind did not say.
        var uid: UInt32?
        var description: String { "\(type) session '\(desktopName)'" }
    }

    public init(configured: Desktop?, connection: Connection, logger: Logger) {
        self.configured = configured
        self.connection = connection
        self.logger = logger
    }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {
        self.events = events
        let loop = connection.loop
        // logind announces a new active session on the seat, and changes of
        // a session's type, with PropertiesChanged; it may also restart.
        let rules = [
            MatchRule(sender: Self.login1, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged"),
            MatchRule.nameOwnerChanged(for: Self.login1),
        ]
        for rule in rules {
            do {
                watches.append(
                    try await connection.subscribe(rule) { [self] _ in
                        Task(executorPreference: loop) { await self.redetect() }
                    })
            } catch {
                logger.error("desktop: cannot follow logind on the bus: \(error)")
            }
        }
        await detect(initial: true)
    }

    /// `follower` is called whenever seat0's active session changes.
    public func follow(_ follower: @escaping () -> Void) {
        followers.append(follower)
    }

    // MARK: Detection

    private nonisolated(nonsending) func redetect() async {
        await detection.run { await detect(initial: false) }
    }

    private nonisolated(nonsending) func detect(initial: Bool) async {
        let seatSession = await activeSeatSession()
        let named = seatSession.flatMap { session -> (desktop: Desktop, gnomeSession: Bool)? in
            if let named = Desktop.named(sessionDesktop: session.desktopName) { return named }
            return session.type == "x11" ? (.x11, false) : nil
        }
        let detected = configured ?? named?.desktop ?? .none
        guard initial || detected != desktop || seatSession != self.seatSession else { return }
        desktop = detected
        self.seatSession = seatSession
        let gnomeSession = named?.gnomeSession == true && named?.desktop == detected
        ownCapabilities = Self.capabilities(of: detected, gnomeSession: gnomeSession, seatSession: seatSession)
        let source = configured != nil
            ? "[Service] Desktop=" : seatSession.map { "logind: seat0's session, \($0.desktopName)" } ?? "logind: no graphical session on seat0"
        logger.info(
            "desktop: \(initial ? "" : "now ")\(desktop) (\(source)); screen reader \(gnomeSession ? "started by the GNOME session from its key" : "started by nothing in the session")"
        )
        guard !initial else { return }
        for follower in followers { follower() }
        events?(.changed)
    }

    /// What the locked keys deliver on `desktop`; for the features a program
    /// would deliver, what would.
    static func capabilities(
        of desktop: Desktop, gnomeSession: Bool, seatSession: SeatSession?
    ) -> [Feature: FeatureCapability] {
        let facts = DesktopFacts(sessionStartsScreenReader: gnomeSession)
        let realisation = desktop.realisation(facts)
        // The kiosk's programs are installed where the service is.
        var capabilities = desktop.keyCapabilities(facts, installation: SessionProbe(environment: [:]).installation)
        for feature in Feature.allCases where realisation.byKeys[feature] == nil {
            if feature == .screenReader {
                let here =
                    seatSession == nil
                    ? "logind reports no graphical session on seat0"
                    : desktop == .gnomeShell || desktop == .gnomeKiosk
                        ? "logind's session on seat0 (\(seatSession!.desktopName)) is not a GNOME session"
                        : "nothing on \(desktop) starts a screen reader from its key"
                capabilities[feature] = .unavailable(
                    "\(noAgent); without one, the screen reader comes only from a GNOME session, whose gnome-session starts Orca from its key, and \(here)"
                )
            } else if realisation.byProgram.contains(feature) {
                capabilities[feature] = .unavailable(
                    "\(noAgent), which runs one on \(desktop): the desktop has none of its own")
            } else if desktop == .none {
                capabilities[feature] = .notActing(
                    realisation.notActing(
                        feature, on: desktop,
                        also: seatSession == nil
                            ? "logind reports no graphical session on seat0; [Service] Desktop= names the desktop" : nil))
            }
        }
        return capabilities
    }

    /// Why a feature only a session agent could deliver is not supported
    /// while none is registered (spec 1.2, section 1).
    public static let noAgent =
        "no session agent is registered (guidedaccess-agent.service of the kiosk user: systemctl --global enable guidedaccess-agent.service starts it at the login, [Agent] AllowUsers= admits the user)"

    /// seat0's active session's `Desktop` and `Type` when it is a graphical
    /// one, or nil (no logind, no active session, no answer within 2 s).
    private nonisolated(nonsending) func activeSeatSession() async -> SeatSession? {
        func property(_ path: ObjectPath, _ interface: String, _ name: String) async -> DBusValue? {
            await connection.property(name, of: interface, at: path, on: Self.login1, timeout: .seconds(2))
        }
        guard case .structure(let active)? = await property(Self.seatPath, "org.freedesktop.login1.Seat", "ActiveSession"),
            active.count == 2, case .objectPath(let path) = active[1], path.rawValue != "/"
        else { return nil }
        guard case .string(let type)? = await property(path, "org.freedesktop.login1.Session", "Type"),
            type == "wayland" || type == "x11"
        else { return nil }
        let desktopName: String
        if case .string(let name)? = await property(path, "org.freedesktop.login1.Session", "Desktop") {
            desktopName = name
        } else {
            desktopName = ""
        }
        // User (uo): the uid and the user's object.
        var uid: UInt32?
        if case .structure(let user)? = await property(path, "org.freedesktop.login1.Session", "User"),
            case .uint32(let id)? = user.first
        {
            uid = id
        }
        return SeatSession(desktopName: desktopName, type: type, uid: uid)
    }
}
