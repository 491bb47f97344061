import CLinux
import DBus
import Glibc
import GuidedAccessCore
import Logging

/// The desktop of the kiosk user's graphical session, as a service running
/// in that session finds it (user mode): what it acts on through the keys
/// the settings driver writes. There is nothing to apply — the desktop does
/// it — but what it delivers decides `SupportedFeatures` and `Desktop`, and
/// what the programs driver must run itself.
///
/// Detection (`Desktop.detect`) is followed live: a shell's name appearing
/// or leaving the session bus, a Wayland or X socket appearing or going.
/// One detection runs at a time; events meanwhile make one more.
public final class SessionDesktopDriver: DesktopDriver, @unchecked Sendable {
    public let name = "desktop"
    /// `[Service] Desktop=`; nil: detected.
    let configured: Desktop?
    /// The service's own environment, which is its session's.
    let environment: [String: String]
    /// The session bus.
    private let connection: Connection
    private let logger: Logger
    public private(set) var desktop: Desktop = .none
    public private(set) var display = SessionDisplay()
    private(set) var facts = DesktopFacts()
    package private(set) var capabilities: [Feature: FeatureCapability] = [:]
    package var desktopPart: DesktopPart? { .desktop(desktop.rawValue) }
    private var events: (@Sendable (DriverEvent) -> Void)?
    /// Called on a change, before `events` (the programs driver).
    private var followers: [() -> Void] = []
    private var watches: [SubscriptionToken] = []
    private var socketWatch: DisplaySocketWatch?
    private let detection = OneAtATime()
    /// The last executable looked at for GNOME Kiosk's magnifier, and the answer.
    private var magnifierChecked: (FileIdentity, Bool)?

    public init(configured: Desktop?, environment: [String: String], connection: Connection, logger: Logger) {
        self.configured = configured
        self.environment = environment
        self.connection = connection
        self.logger = logger
    }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {
        self.events = events
        let loop = connection.loop
        for name in Desktop.watchedBusNames {
            do {
                watches.append(
                    try await connection.subscribe(.nameOwnerChanged(for: name)) { [self] _ in
                        Task(executorPreference: loop) { await self.redetect() }
                    })
            } catch {
                logger.error("desktop: cannot follow \(name) on the bus: \(error)")
            }
        }
        let probe = SessionProbe(environment: environment)
        socketWatch = DisplaySocketWatch(
            directories: [probe.runtimeDirectory, SessionProbe.x11SocketDirectory].compactMap { $0 }, loop: loop
        ) { [self] in
            Task(executorPreference: loop) { await self.redetect() }
        }
        await detect(initial: true)
    }

    /// A display's socket that appeared but does not listen yet is looked
    /// at again after 50 ms, then after twice as long each time, while it
    /// is new (`SessionProbe.newSocketNotListening`): the last delay, or
    /// nil when none is pending.
    private var settleDelay: Duration?
    private var settling: Task<Void, Never>?

    private func lookAgainSoon() {
        guard settling == nil else { return }
        let delay = settleDelay.map { $0 * 2 } ?? .milliseconds(50)
        settleDelay = delay
        let loop = connection.loop
        settling = Task(executorPreference: loop) { [self] in
            guard (try? await loop.sleep(for: delay)) != nil else { return }
            settling = nil
            await redetect()
        }
    }

    /// `follower` is called whenever what was detected changes, before the service hears of it.
    func follow(_ follower: @escaping () -> Void) {
        followers.append(follower)
    }

    // MARK: Detection

    private func redetect() async {
        await detection.run { await detect(initial: false) }
    }

    private func detect(initial: Bool) async {
        let probe = SessionProbe(environment: environment)
        defer { if probe.newSocketNotListening() { lookAgainSoon() } else { settleDelay = nil } }
        var names: Set<String> = []
        for name in Desktop.watchedBusNames where (try? await connection.nameOwner(name)) != nil {
            names.insert(name)
        }
        let display = probe.display()
        let detected = configured ?? Desktop.detect(probe.evidence(busNames: names, display: display))
        var facts = DesktopFacts(sessionStartsScreenReader: names.contains(Desktop.gnomeSessionBusName))
        if detected == .gnomeKiosk { facts.kioskMagnifier = await kioskReadsMagnifier(display) }
        guard initial || detected != desktop || display != self.display || facts != self.facts else { return }
        let source = configured != nil ? "[Service] Desktop=" : "detected"
        desktop = detected
        self.display = display
        self.facts = facts
        capabilities = detected.keyCapabilities(facts, installation: probe.installation)
        let reader = desktop.realisation(facts).byKeys[.screenReader] != nil
            ? "started by the session from its key" : "started by the service"
        logger.info("desktop: \(initial ? "" : "now ")\(desktop) (\(source); \(display)); screen reader \(reader)")
        guard !initial else { return }
        for follower in followers { follower() }
        events?(.changed)
    }

    /// Whether the running GNOME Kiosk follows the magnifier's keys (version
    /// 50 and later): its executable holds the key's name. GNOME Kiosk tells
    /// its version to no one on the bus; its compositor is the process
    /// serving the Wayland socket, or the owner of `org.gnome.Kiosk`.
    private func kioskReadsMagnifier(_ display: SessionDisplay) async -> Bool {
        var pid = display.compositor == "gnome-kiosk" ? display.compositorPID : nil
        if pid == nil, let credentials = try? await connection.credentials(of: Desktop.kioskBusName) {
            if let fd = credentials.processFD { close(fd) }
            pid = credentials.processID.map { Int32(bitPattern: $0) }
        }
        // Only the compositor itself: a pid reused meanwhile is some other program.
        guard let pid, pid > 0, ProcessTable.name(of: pid) == "gnome-kiosk" else { return false }
        let path = "/proc/\(pid)/exe"
        guard let identity = FileIdentity(atPath: path) else { return false }
        if let (checked, answer) = magnifierChecked, checked == identity { return answer }
        let answer = Self.file(path, contains: Array(SettingKey.screenMagnifierEnabled.key.utf8))
        magnifierChecked = (identity, answer)
        return answer
    }

    /// Whether the file holds `needle` (read in blocks, at most 256 MiB).
    static func file(_ path: String, contains needle: [UInt8]) -> Bool {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0, !needle.isEmpty else { return false }
        defer { close(fd) }
        var window: [UInt8] = []
        var block = [UInt8](repeating: 0, count: 1 << 16)
        var total = 0
        while total < 256 << 20 {
            let n = read(fd, &block, block.count)
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return false }
            total += n
            // The tail of the last block, so that a match across blocks is found.
            window = Array(window.suffix(needle.count - 1)) + block[0..<n]
            if contains(window, needle) { return true }
        }
        return false
    }

    private static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard haystack.count >= needle.count else { return false }
        let first = needle[0]
        var i = 0
        while i <= haystack.count - needle.count {
            if haystack[i] == first, haystack[i..<(i + needle.count)].elementsEqual(needle) { return true }
            i += 1
        }
        return false
    }

    // MARK: For the programs driver

    /// The environment a program in the session gets: the service's own
    /// (its session's), the displays found, nothing of the service's
    /// systemd unit.
    var programEnvironment: [String: String] {
        var environment = self.environment
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
}
