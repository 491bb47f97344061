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
            return FeatureRealisation(
                byKeys: byKeys, byProgram: sessionStartsScreenReader ? [] : [.screenReader], wholeScreen: true)
        case .sway, .labwc, .wayfire:
            // GTK apps on Wayland read these keys live through dconf; the
            // compositor has no magnifier or colour filter, but layer-shell
            // and virtual-keyboard for an on-screen keyboard.
            return FeatureRealisation(
                byKeys: [.largeText, .highContrast, .reduceMotion], byProgram: [.screenReader, .onScreenKeyboard])
        case .cage, .weston:
            // No layer-shell or virtual-keyboard protocol for a keyboard.
            return FeatureRealisation(byKeys: [.largeText, .highContrast, .reduceMotion], byProgram: [.screenReader])
        case .kwin, .x11:
            return FeatureRealisation(byKeys: [], byProgram: [.screenReader])
        case .none:
            return FeatureRealisation(byKeys: [], byProgram: [])
        }
    }
}

/// Which features a desktop gives the person at the kiosk, and how.
public struct FeatureRealisation: Hashable, Sendable {
    /// Features the desktop acts on through their GSettings keys alone.
    public var byKeys: Set<Feature>
    /// Features nothing in the session delivers from the key, for which the
    /// service runs a program in the session (`SessionProgramKind`): Orca,
    /// an on-screen keyboard. Their keys are written too.
    public var byProgram: Set<Feature>
    /// Whether what `byKeys` realises covers the whole screen (the shell
    /// draws it), not only the desktop's own apps (GTK apps reading the
    /// keys under sway): then a browser layer leaves those features to it.
    public var wholeScreen: Bool

    public init(byKeys: Set<Feature>, byProgram: Set<Feature>, wholeScreen: Bool = false) {
        self.byKeys = byKeys
        self.byProgram = byProgram
        self.wholeScreen = wholeScreen
    }
}

/// The programs the service runs for a feature: what, and what it needs.
public enum SessionProgramKind: String, CaseIterable, Hashable, Sendable {
    /// Orca (`--replace`: exactly one screen reader speaks, whoever started
    /// another); speech-dispatcher and an output module speak for it; Orca 43
    /// runs `xkbcomp $DISPLAY`: it needs an X display (Xwayland on Wayland).
    case screenReader
    /// wvkbd (`wvkbd-mobintl`): a layer-shell surface typing through the
    /// virtual-keyboard protocol; it needs the Wayland display.
    case onScreenKeyboard

    public init?(_ feature: Feature) {
        switch feature {
        case .screenReader: self = .screenReader
        case .onScreenKeyboard: self = .onScreenKeyboard
        default: return nil
        }
    }

    public var feature: Feature { self == .screenReader ? .screenReader : .onScreenKeyboard }

    /// The transient unit of run `run` of the service with pid `pid`.
    public func unitName(pid: Int32, run: Int) -> String {
        "guidedaccess-\(feature.wireName)-\(pid)-\(run).service"
    }

    /// Whether `name` is one of `unitName`'s: only those are ever adopted or
    /// stopped, whatever a journal says.
    public func isUnitName(_ name: String) -> Bool {
        let prefix = "guidedaccess-\(feature.wireName)-", suffix = ".service"
        guard name.hasPrefix(prefix), name.hasSuffix(suffix), name.count > prefix.count + suffix.count else {
            return false
        }
        let numbers = name.dropFirst(prefix.count).dropLast(suffix.count).split(separator: "-", omittingEmptySubsequences: false)
        return numbers.count == 2 && numbers.allSatisfy { !$0.isEmpty && $0.count <= 10 && $0.allSatisfy(\.isASCII) && $0.allSatisfy(\.isNumber) }
    }

    /// The program's name on PATH, and its arguments.
    public var executable: String { self == .screenReader ? "orca" : "wvkbd-mobintl" }
    public var arguments: [String] { self == .screenReader ? ["--replace"] : [] }

    /// Why it cannot run here, or nil: `installed` says which programs
    /// (executables, speech-dispatcher's output modules) the system has.
    public func unavailableReason(
        installed: ProgramInstallation, x11Display: String?, waylandDisplay: String?, needsDisplay: Bool = true
    ) -> String? {
        switch self {
        case .screenReader:
            if installed.executable(executable) == nil { return "orca is not installed" }
            if installed.executable("speech-dispatcher") == nil { return "speech-dispatcher is not installed" }
            if installed.speechOutputModules.isEmpty {
                return "speech-dispatcher has no output module (e.g. speech-dispatcher-espeak-ng)"
            }
            if needsDisplay, x11Display == nil { return "the session has no X display, which Orca needs (Xwayland on Wayland)" }
        case .onScreenKeyboard:
            if installed.executable(executable) == nil { return "wvkbd (wvkbd-mobintl) is not installed" }
            if needsDisplay, waylandDisplay == nil { return "the session has no Wayland display for wvkbd" }
        }
        return nil
    }
}

/// The programs installed, as `SessionProgramKind.unavailableReason` asks.
public struct ProgramInstallation: Sendable {
    /// An executable's absolute path on PATH, or nil.
    public var executable: @Sendable (String) -> String?
    /// speech-dispatcher's output modules, `sd_dummy` left out.
    public var speechOutputModules: [String]

    public init(executable: @escaping @Sendable (String) -> String?, speechOutputModules: [String]) {
        self.executable = executable
        self.speechOutputModules = speechOutputModules
    }
}
