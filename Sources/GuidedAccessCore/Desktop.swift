/// The graphical session the features act on, as the `Desktop` property and
/// `[Service] Desktop=` name it.
public enum Desktop: String, CaseIterable, Hashable, Sendable, CustomStringConvertible {
    case gnomeShell = "gnome-shell"
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
    public static let shellBusName = "org.gnome.Shell"
    public static let kwinBusName = "org.kde.KWin"
    /// gnome-session: it starts Orca from `screen-reader-enabled` (autostart condition).
    public static let gnomeSessionBusName = "org.gnome.SessionManager"
    /// Every name detection follows.
    public static let watchedBusNames = [shellBusName, kwinBusName, gnomeSessionBusName]

    /// The desktop a Wayland compositor's process name (`/proc/PID/comm`) says.
    public static func compositor(named comm: String) -> Desktop? {
        switch comm {
        case "gnome-shell": return .gnomeShell
        case "kwin_wayland": return .kwin
        case "sway": return .sway
        case "cage": return .cage
        case "labwc": return .labwc
        case "wayfire": return .wayfire
        case "weston": return .weston
        default: return nil
        }
    }

    /// The desktop a session's desktop name says: an `XDG_CURRENT_DESKTOP`
    /// entry (`labwc:wlroots`) or logind's `Desktop` (`gnome`, `sway`).
    public static func named(sessionDesktop: String) -> Desktop? {
        for entry in sessionDesktop.split(separator: ":") {
            switch entry.lowercased() {
            case "gnome", "gnome-wayland", "gnome-xorg", "ubuntu": return .gnomeShell
            case "kde", "plasma", "plasmawayland": return .kwin
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
}

/// What the service can see of its graphical session (user mode); the input
/// of `Desktop.detect`.
public struct DesktopEvidence: Hashable, Sendable {
    /// Which of `Desktop.watchedBusNames` have an owner on the session bus.
    public var busNames: Set<String>
    /// The Wayland display's socket path, when there is one.
    public var waylandDisplay: String?
    /// The process name of the compositor serving that socket.
    public var waylandCompositor: String?
    /// `XDG_CURRENT_DESKTOP`.
    public var currentDesktop: String?
    /// The X display (`:0`), when there is one.
    public var x11Display: String?

    public init(
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
    /// 1. a shell's bus name (`org.gnome.Shell`, then `org.kde.KWin`): the
    ///    desktop that acts on the keys is running;
    /// 2. the compositor serving the Wayland socket, by its process name;
    /// 3. with a Wayland display, `XDG_CURRENT_DESKTOP` (a compositor whose
    ///    process could not be asked);
    /// 4. an X display and no Wayland one: `x11` (X without a desktop we know);
    /// 5. `none`. A Wayland compositor we do not know is `none` too: nothing
    ///    is promised on it.
    public static func detect(_ evidence: DesktopEvidence) -> Desktop {
        if evidence.busNames.contains(shellBusName) { return .gnomeShell }
        if evidence.busNames.contains(kwinBusName) { return .kwin }
        if evidence.waylandDisplay != nil {
            if let comm = evidence.waylandCompositor, let desktop = compositor(named: comm) { return desktop }
            if let name = evidence.currentDesktop, let desktop = named(sessionDesktop: name),
                desktop != .gnomeShell, desktop != .kwin
            {
                return desktop
            }
            return .none
        }
        return evidence.x11Display != nil ? .x11 : .none
    }

    /// How this desktop realises features.
    /// - `sessionStartsScreenReader`: something in the session starts Orca
    ///   from `screen-reader-enabled` (gnome-session, gsd ≥ 49).
    public func realisation(sessionStartsScreenReader: Bool) -> FeatureRealisation {
        switch self {
        case .gnomeShell:
            var byKeys = Set(Feature.allCases)
            if !sessionStartsScreenReader { byKeys.remove(.screenReader) }
            return FeatureRealisation(byKeys: byKeys, screenReaderByService: !sessionStartsScreenReader)
        case .sway, .cage, .labwc, .wayfire, .weston:
            // GTK apps on Wayland read these keys live through dconf; the
            // compositor has no magnifier or colour filter.
            return FeatureRealisation(byKeys: [.largeText, .highContrast, .reduceMotion], screenReaderByService: true)
        case .kwin, .x11:
            return FeatureRealisation(byKeys: [], screenReaderByService: true)
        case .none:
            return FeatureRealisation(byKeys: [], screenReaderByService: false)
        }
    }
}

/// Which features a desktop gives the person at the kiosk, and how.
public struct FeatureRealisation: Hashable, Sendable {
    /// Features the desktop acts on through their GSettings keys alone.
    public var byKeys: Set<Feature>
    /// Nothing in the session starts a screen reader: the service starts
    /// Orca itself (and writes the key, which Orca follows).
    public var screenReaderByService: Bool

    public init(byKeys: Set<Feature>, screenReaderByService: Bool) {
        self.byKeys = byKeys
        self.screenReaderByService = screenReaderByService
    }
}

/// What a screen reader the service starts needs, as found on this system;
/// `unavailableReason` says why it cannot speak (`UnsupportedFeature`).
public struct ScreenReaderInstallation: Hashable, Sendable {
    public var orca: String?
    public var speechDispatcher: String?
    /// speech-dispatcher's output modules (`sd_espeak-ng`, …), `sd_dummy` left out.
    public var outputModules: [String]
    /// The X display the session offers (Orca 43 runs `xkbcomp $DISPLAY`).
    public var x11Display: String?

    public init(orca: String?, speechDispatcher: String?, outputModules: [String], x11Display: String?) {
        self.orca = orca
        self.speechDispatcher = speechDispatcher
        self.outputModules = outputModules
        self.x11Display = x11Display
    }

    /// Why it cannot speak here, or nil. `needsDisplay`: the service starts
    /// it, so the session must offer the X display it runs on.
    public func unavailableReason(needsDisplay: Bool) -> String? {
        if orca == nil { return "orca is not installed" }
        if speechDispatcher == nil { return "speech-dispatcher is not installed" }
        if outputModules.isEmpty { return "speech-dispatcher has no output module (e.g. speech-dispatcher-espeak-ng)" }
        if needsDisplay, x11Display == nil { return "the session has no X display, which Orca needs (Xwayland on Wayland)" }
        return nil
    }
}
