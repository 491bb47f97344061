import GuidedAccessCore

/// The graphical session the features act on, as the `Desktop` property and
/// `[Service] Desktop=` name it.
public enum Desktop: String, CaseIterable, Hashable, Sendable, CustomStringConvertible {
    case gnomeShell = "gnome-shell"
    case gnomeKiosk = "gnome-kiosk"
    case kwin
    case sway
    case cage
    case labwc
    case wayfire
    case weston
    case x11
    case none

    public var description: String { rawValue }

    /// Bus names whose owners identify a desktop (user mode: on the session bus).
    static let kioskBusName = "org.gnome.Kiosk"
    static let shellBusName = "org.gnome.Shell"
    static let kwinBusName = "org.kde.KWin"
    /// gnome-session: it starts Orca from `screen-reader-enabled` (autostart
    /// condition; gnome-settings-daemon's a11y plugin from GNOME 49).
    static let gnomeSessionBusName = "org.gnome.SessionManager"
    /// Every name detection follows.
    static let watchedBusNames = [kioskBusName, shellBusName, kwinBusName, gnomeSessionBusName]

    /// The desktop a Wayland compositor's process name (`/proc/PID/comm`) says.
    static func compositor(named comm: String) -> Desktop? {
        switch comm {
        case "gnome-shell": return .gnomeShell
        case "gnome-kiosk": return .gnomeKiosk
        case "kwin_wayland": return .kwin
        case "sway": return .sway
        case "cage": return .cage
        case "labwc": return .labwc
        case "wayfire": return .wayfire
        case "weston": return .weston
        default: return nil
        }
    }

    /// The desktop an `XDG_CURRENT_DESKTOP` entry names (`labwc:wlroots`,
    /// `GNOME-Kiosk:GNOME`), the first one known.
    static func named(currentDesktop: String) -> Desktop? {
        for entry in currentDesktop.split(separator: ":") {
            switch entry.lowercased() {
            case "gnome-kiosk": return .gnomeKiosk
            case "gnome", "ubuntu": return .gnomeShell
            case "kde": return .kwin
            case "sway": return .sway
            case "cage": return .cage
            case "labwc": return .labwc
            case "wayfire": return .wayfire
            case "weston": return .weston
            default: continue
            }
        }
        return nil
    }

    /// What logind's `Desktop` of a session says (`XDG_SESSION_DESKTOP`: the
    /// name of the session file the display manager started): the desktop,
    /// and whether the session is a GNOME session, which the display manager
    /// starts through gnome-session (its `gnome.desktop` runs `gnome-session`).
    static func named(sessionDesktop: String) -> (desktop: Desktop, gnomeSession: Bool)? {
        let name = sessionDesktop.lowercased()
        switch name {
        case "gnome", "gnome-wayland", "gnome-xorg", "gnome-classic", "gnome-classic-wayland", "gnome-classic-xorg",
            "ubuntu", "ubuntu-wayland", "ubuntu-xorg":
            return (.gnomeShell, true)
        case _ where name.hasPrefix("gnome-kiosk") || name.hasPrefix("org.gnome.kiosk"):
            // GNOME Kiosk's sessions (gnome-kiosk-script-wayland,
            // org.gnome.Kiosk.SearchApp.Session, gnome-kiosk-menu-wayland).
            return (.gnomeKiosk, false)
        case "plasma", "plasmawayland", "plasmax11", "kde", "kde-plasma": return (.kwin, false)
        default:
            return named(currentDesktop: name).map { ($0, false) }
        }
    }
}

/// What the service can see of its graphical session (user mode); the input
/// of `Desktop.detect`.
struct DesktopEvidence: Hashable, Sendable {
    /// Which of `Desktop.watchedBusNames` have an owner on the session bus.
    var busNames: Set<String>
    /// The Wayland display's socket path, when there is one.
    var waylandDisplay: String?
    /// The process name of the compositor serving that socket.
    var waylandCompositor: String?
    /// `XDG_CURRENT_DESKTOP`.
    var currentDesktop: String?
    /// The X display (`:0`), when there is one.
    var x11Display: String?

    init(
        busNames: Set<String> = [], waylandDisplay: String? = nil, waylandCompositor: String? = nil,
        currentDesktop: String? = nil, x11Display: String? = nil
    ) {
        self.busNames = busNames
        self.waylandDisplay = waylandDisplay
        self.waylandCompositor = waylandCompositor
        self.currentDesktop = currentDesktop
        self.x11Display = x11Display
    }
}

extension Desktop {
    /// User mode's detection rules, most specific first:
    /// 1. a shell's bus name (`org.gnome.Kiosk` — GNOME Kiosk also owns
    ///   `org.gnome.Shell` from version 49 — then `org.gnome.Shell`, then
    ///   `org.kde.KWin`): the desktop that acts on the keys is running;
    /// 2. the compositor serving the Wayland socket, by its process name;
    /// 3. with a Wayland display, `XDG_CURRENT_DESKTOP` (a compositor whose
    ///    process could not be asked); GNOME Shell and KWin only by their
    ///    names on the bus, which they own once they act on the keys;
    /// 4. an X display and no Wayland one: `x11` (X without a desktop we know);
    /// 5. `none`. A Wayland compositor we do not know is `none` too: nothing
    ///    is promised on it.
    static func detect(_ evidence: DesktopEvidence) -> Desktop {
        if evidence.busNames.contains(kioskBusName) { return .gnomeKiosk }
        if evidence.busNames.contains(shellBusName) { return .gnomeShell }
        if evidence.busNames.contains(kwinBusName) { return .kwin }
        if evidence.waylandDisplay != nil {
            if let comm = evidence.waylandCompositor, let desktop = compositor(named: comm) { return desktop }
            if let name = evidence.currentDesktop, let desktop = named(currentDesktop: name),
                desktop != .gnomeShell, desktop != .kwin
            {
                return desktop
            }
            return .none
        }
        return evidence.x11Display != nil ? .x11 : .none
    }

    /// How this desktop realises features, given what else is known of it.
    func realisation(_ facts: DesktopFacts) -> FeatureRealisation {
        let keysForApps: [Feature: FeatureCapability.Reach] = [.largeText: .part, .highContrast: .part, .reduceMotion: .part]
        switch self {
        case .gnomeShell:
            var byKeys: [Feature: FeatureCapability.Reach] = [:]
            for feature in Feature.allCases where feature != .screenReader || facts.sessionStartsScreenReader {
                byKeys[feature] = .wholeScreen
            }
            return FeatureRealisation(byKeys: byKeys, byProgram: facts.sessionStartsScreenReader ? [] : [.screenReader])
        case .gnomeKiosk:
            // It follows the text, contrast and motion keys (for its apps:
            // high contrast is the toolkit's), and from version 50 the
            // magnifier's; it has no colour effects and no keyboard.
            var byKeys = keysForApps
            if facts.kioskMagnifier { byKeys[.zoom] = .wholeScreen }
            if facts.sessionStartsScreenReader { byKeys[.screenReader] = .wholeScreen }
            return FeatureRealisation(
                byKeys: byKeys, byProgram: facts.sessionStartsScreenReader ? [] : [.screenReader],
                notes: [
                    .invertColors: "GNOME Kiosk has no colour effects", .grayscale: "GNOME Kiosk has no colour effects",
                    .zoom: "GNOME Kiosk has a magnifier from version 50, and the one running has none",
                    .onScreenKeyboard: "GNOME Kiosk has no on-screen keyboard",
                ])
        case .sway, .labwc, .wayfire:
            // GTK apps on Wayland read these keys live through dconf; the
            // compositor has no magnifier or colour filter, but layer-shell
            // and virtual-keyboard for an on-screen keyboard.
            return FeatureRealisation(byKeys: keysForApps, byProgram: [.screenReader, .onScreenKeyboard])
        case .cage, .weston:
            // No layer-shell or virtual-keyboard protocol for a keyboard.
            return FeatureRealisation(byKeys: keysForApps, byProgram: [.screenReader])
        case .kwin:
            return FeatureRealisation(byKeys: [:], byProgram: [.screenReader])
        case .x11:
            // A bare X server and a window manager: Orca the service runs,
            // the colour features through the picom it runs
            // (`X11CompositorDriver`), GTK's settings through its
            // xsettingsd (`X11SettingsDriver`).
            return FeatureRealisation(
                byKeys: [:], byProgram: [.screenReader, .invertColors, .grayscale, .highContrast, .largeText, .reduceMotion],
                notes: [
                    .zoom: "X11 has no compositor zoom here: picom has none",
                    .onScreenKeyboard:
                        "no on-screen keyboard is run on X11: onboard, the packaged one, docks only through GSettings keys of its own, and floating it covers the kiosk's app under matchbox",
                ])
        case .none:
            return FeatureRealisation(byKeys: [:], byProgram: [])
        }
    }
}

extension Desktop {
    /// What this desktop delivers through the keys; for every other
    /// feature, that it does not act on it (a program may).
    func keyCapabilities(_ facts: DesktopFacts, installation: ProgramInstallation) -> [Feature: FeatureCapability] {
        let realisation = realisation(facts)
        var capabilities: [Feature: FeatureCapability] = [:]
        for feature in Feature.allCases {
            if let reach = realisation.byKeys[feature] {
                // The session starts the screen reader; it needs something to speak with all the same.
                if feature == .screenReader,
                    let missing = ProgramKind.screenReader.unavailableReason(
                        installed: installation, x11Display: nil, waylandDisplay: nil, needsDisplay: false)
                {
                    capabilities[feature] = .unavailable(missing)
                } else {
                    capabilities[feature] = .delivers(reach)
                }
            } else {
                capabilities[feature] = .notActing(realisation.notActing(feature, on: self))
            }
        }
        return capabilities
    }
}

/// What else decides what a desktop delivers.
struct DesktopFacts: Hashable, Sendable {
    /// Something in the session starts Orca from `screen-reader-enabled`
    /// (gnome-session, gnome-settings-daemon ≥ 49).
    var sessionStartsScreenReader = false
    /// GNOME Kiosk's compositor reads the magnifier's keys (version 50 and later).
    var kioskMagnifier = false
}

/// Which features a desktop gives the person at the kiosk, and how.
struct FeatureRealisation: Hashable, Sendable {
    /// Features the desktop acts on through their keys alone, and whether
    /// it covers the whole screen with them (the shell draws it) or only its
    /// own apps (GTK apps reading the keys): then a browser layer adds them
    /// in its pages.
    var byKeys: [Feature: FeatureCapability.Reach]
    /// Features nothing in the session delivers from the key, for which the
    /// service runs a program in the session (`ProgramKind`): Orca, an
    /// on-screen keyboard; on X11 picom and xsettingsd too. Their keys are
    /// written too.
    var byProgram: Set<Feature>
    /// Why the desktop does not act on a feature, where there is more to
    /// say than that.
    var notes: [Feature: String] = [:]

    /// The reason for a feature the desktop does not act on: the note, and
    /// the desktops that do deliver it (`… (GNOME Kiosk has no colour
    /// effects; gnome-shell and x11 do)`), what would deliver it — each in
    /// its latest version (GNOME Kiosk 50's magnifier counts); then `also`.
    func notActing(_ feature: Feature, on desktop: Desktop, also: String? = nil) -> String {
        let others = Desktop.allCases.filter { other in
            guard other != desktop, other != .none else { return false }
            let realisation = other.realisation(DesktopFacts(sessionStartsScreenReader: true, kioskMagnifier: true))
            return realisation.byKeys[feature] != nil || realisation.byProgram.contains(feature)
        }
        let names = others.map(\.rawValue)
        let delivering =
            names.count < 2
            ? names.joined()
            : names.dropLast().joined(separator: ", ") + " and " + names.last!
        let parts = [notes[feature], delivering.isEmpty ? nil : delivering + (names.count == 1 ? " does" : " do"), also]
            .compactMap { $0 }
        return "the desktop '\(desktop)' does not act on it" + (parts.isEmpty ? "" : " (" + parts.joined(separator: "; ") + ")")
    }
}

extension Desktop {
    /// `[Service] Desktop=`: `auto` (detected, the default) or a desktop's
    /// name, for where detection cannot tell.
    package static let configurationKey = DriverConfigurationKey(group: "Service", key: "Desktop") { value in
        value == "auto" || Desktop(rawValue: value) != nil
            ? nil : "expected auto or one of " + allCases.map(\.rawValue).joined(separator: ", ")
    }

    /// The desktop a checked `[Service] Desktop=` names; nil: detect it.
    package static func configured(_ value: String?) -> Desktop? {
        value.flatMap { $0 == "auto" ? nil : Desktop(rawValue: $0) }
    }
}

/// A driver that says what the kiosk's desktop does with the keys the
/// settings driver writes: the desktop does it, so there is nothing to
/// apply, to record or to take up after a restart. Both modes find the
/// desktop their own way (`SessionDesktopDriver`, `SeatDesktopDriver`).
protocol DesktopDriver: FeatureDriver {}

extension DesktopDriver {
    package nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool { false }
    package var record: JSON? { nil }
    package nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote] {
        []
    }
}

/// Detection that runs one at a time: what asks for it while it runs makes
/// one more run once it is done, however many asked (a burst of socket
/// events, names coming and going).
final class OneAtATime {
    private var running = false
    private var again = false

    func run(_ body: () async -> Void) async {
        guard !running else {
            again = true
            return
        }
        running = true
        repeat {
            again = false
            await body()
        } while again
        running = false
    }
}
