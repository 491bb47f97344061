import GuidedAccessCore

/// The programs the service runs for a feature: what, and what it needs.
public enum ProgramKind: String, CaseIterable, Hashable, Sendable {
    /// Orca (`--replace`: exactly one screen reader speaks, whoever started
    /// another); speech-dispatcher and an output module speak for it; Orca 43
    /// runs `xkbcomp $DISPLAY`: it needs an X display (Xwayland on Wayland).
    case screenReader
    /// wvkbd (`wvkbd-mobintl`): a layer-shell surface typing through the
    /// virtual-keyboard protocol; it needs the Wayland display.
    case onScreenKeyboard
    /// picom on a bare X display (no compositor of the kiosk's own): a
    /// window shader for the colour features (`X11CompositorDriver`), its
    /// arguments given per run.
    case compositor
    /// xsettingsd on a bare X display: GTK's theme, DPI and animations
    /// through XSETTINGS (`X11SettingsDriver`), its file given per run.
    case settingsManager

    public init?(_ feature: Feature) {
        switch feature {
        case .screenReader: self = .screenReader
        case .onScreenKeyboard: self = .onScreenKeyboard
        default: return nil
        }
    }

    /// Its name in logs and unit names: the feature's, or `compositor`.
    public var name: String {
        switch self {
        case .screenReader: return Feature.screenReader.wireName
        case .onScreenKeyboard: return Feature.onScreenKeyboard.wireName
        case .compositor: return "compositor"
        case .settingsManager: return "xsettings"
        }
    }

    /// The transient unit of run `run` of the process with pid `pid`
    /// running it for `owner`.
    public func unitName(pid: Int32, run: Int, owner: ProgramOwner = .service) -> String {
        "\(owner.unitPrefix)-\(name)-\(pid)-\(run).service"
    }

    /// Whether `name` is one of `unitName`'s for `owner`: only those are
    /// ever adopted or stopped, whatever a journal says. The service's and
    /// the agent's names never match each other's.
    public func isUnitName(_ name: String, owner: ProgramOwner = .service) -> Bool {
        let prefix = "\(owner.unitPrefix)-\(self.name)-", suffix = ".service"
        guard name.hasPrefix(prefix), name.hasSuffix(suffix), name.count > prefix.count + suffix.count else {
            return false
        }
        let numbers = name.dropFirst(prefix.count).dropLast(suffix.count).split(separator: "-", omittingEmptySubsequences: false)
        return numbers.count == 2 && numbers.allSatisfy { !$0.isEmpty && $0.count <= 10 && $0.allSatisfy(\.isASCII) && $0.allSatisfy(\.isNumber) }
    }

    /// The glob of `unitName`'s names for `owner`.
    public func unitPattern(owner: ProgramOwner) -> String {
        "\(owner.unitPrefix)-\(name)-*.service"
    }

    /// The program's name on PATH, and its arguments.
    public var executable: String {
        switch self {
        case .screenReader: return "orca"
        case .onScreenKeyboard: return "wvkbd-mobintl"
        case .compositor: return "picom"
        case .settingsManager: return "xsettingsd"
        }
    }
    public var arguments: [String] { self == .screenReader ? ["--replace"] : [] }

    /// Why it cannot run here, or nil: `installed` says which programs
    /// (executables, speech-dispatcher's output modules) the system has.
    public func unavailableReason(
        installed: ProgramInstallation, x11Display: String?, waylandDisplay: String?, needsDisplay: Bool = true
    ) -> String? {
        switch self {
        case .screenReader:
            if installed.executable(executable) == nil { return "orca is not installed (package orca)" }
            if installed.executable("speech-dispatcher") == nil { return "speech-dispatcher is not installed (package speech-dispatcher)" }
            if installed.speechOutputModules.isEmpty {
                return "speech-dispatcher has no output module: install one (e.g. package speech-dispatcher-espeak-ng)"
            }
            if needsDisplay, x11Display == nil { return "the session has no X display, which Orca needs (on Wayland: the compositor's Xwayland)" }
        case .onScreenKeyboard:
            if installed.executable(executable) == nil { return "wvkbd (wvkbd-mobintl) is not installed (package wvkbd)" }
            if needsDisplay, waylandDisplay == nil { return "the session has no Wayland display for wvkbd" }
        case .compositor:
            if installed.executable(executable) == nil { return "picom is not installed (package picom)" }
            if needsDisplay, x11Display == nil { return "the session has no X display" }
        case .settingsManager:
            if installed.executable(executable) == nil { return "xsettingsd is not installed (package xsettingsd)" }
            if needsDisplay, x11Display == nil { return "the session has no X display" }
        }
        return nil
    }
}

/// Who runs a session's programs: the user-mode service, or the session
/// agent for the system service. Their units have names of their own, so
/// that neither takes the other's for a stray.
public enum ProgramOwner: Hashable, Sendable {
    case service
    case agent

    /// `guidedaccess-screen-reader-…` (the service's, as before 1.2) or
    /// `guidedaccess-agent-screen-reader-…`.
    var unitPrefix: String { self == .service ? "guidedaccess" : "guidedaccess-agent" }
}

/// The programs installed, as `ProgramKind.unavailableReason` asks.
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

/// A program the service started in the kiosk's session, as its driver's
/// journal record keeps it so that a restarted service finds it again.
public enum ProgramRecord: Hashable, Sendable, CustomStringConvertible {
    /// A child process: its pid, and what makes the pid that process and no
    /// later one — its start time (clock ticks after boot, `/proc/PID/stat`
    /// field 22) on this boot — and the token the service put in its
    /// environment (`WatchedProcess.tokenVariable`), which must still be
    /// there before it is adopted or stopped: a journal naming a pid and
    /// its start time alone could make the service stop another program.
    /// (Its executable would not do: a program may exec another, as a
    /// wrapper script does, and an upgrade replaces the file.)
    case process(pid: Int32, startTime: UInt64, bootID: String, token: String)
    /// A transient unit of the user's systemd manager, by name.
    case unit(String)

    public var description: String {
        switch self {
        case .process(let pid, _, _, _): return "pid \(pid)"
        case .unit(let name): return "unit \(name)"
        }
    }
}

/// When a supervised program that exits is started again: at once and then
/// with a doubling delay, until more than `burst` exits fall within
/// `interval` — then it gives up (like systemd's StartLimitBurst).
public struct RestartPolicy: Hashable, Sendable {
    public enum Decision: Hashable, Sendable {
        case restart(afterMilliseconds: Int)
        /// `exits`: how many fell within the interval.
        case giveUp(exits: Int)
    }

    public let burst: Int
    public let intervalMilliseconds: Int
    public let firstDelayMilliseconds: Int
    /// Times of the recent exits, milliseconds on a monotonic clock.
    private var exits: [Int] = []

    public init(burst: Int = 5, intervalMilliseconds: Int = 60_000, firstDelayMilliseconds: Int = 100) {
        self.burst = burst
        self.intervalMilliseconds = intervalMilliseconds
        self.firstDelayMilliseconds = firstDelayMilliseconds
    }

    /// Records an exit at `now` and says what to do.
    public mutating func exited(atMilliseconds now: Int) -> Decision {
        exits.removeAll { now - $0 >= intervalMilliseconds }
        exits.append(now)
        guard exits.count <= burst else { return .giveUp(exits: exits.count) }
        return .restart(afterMilliseconds: firstDelayMilliseconds << (exits.count - 1))
    }

    /// Forgets the exits (the program was stopped on purpose).
    public mutating func reset() {
        exits = []
    }
}
