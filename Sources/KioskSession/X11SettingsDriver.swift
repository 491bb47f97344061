import DBus
import Glibc
import GuidedAccessCore
import Logging

/// high-contrast, large-text and reduce-motion for the GTK apps of a bare
/// X display (`Desktop` x11). GTK on X11 reads its settings through
/// XSETTINGS, the owner of `_XSETTINGS_S0` — a settings daemon — not from
/// dconf as on Wayland; a bare kiosk has none, so the service runs
/// xsettingsd for the session with a file of its own:
/// `Net/ThemeName "HighContrast"` (built into GTK 3), `Xft/DPI` 96 dpi ×
/// the text scale, `Gtk/EnableAnimations 0`.
///
/// GTK keeps a theme and an animation setting it was given after the
/// manager is gone (only the DPI falls back), so the session's end first
/// gives GTK the values it had before — its settings.ini's, else its own
/// defaults — and only then stops xsettingsd; the screen is then as it was.
/// A change during the session is a new file and SIGHUP.
///
/// Never a second settings manager: where `_XSETTINGS_S0` has an owner that
/// is not the service's xsettingsd, the features are unavailable, and the
/// reason names it. xsettingsd runs as a `SessionProgram` (supervised,
/// adopted after a restart; one left by a session that ended while the
/// service was down is made to restore GTK's values, then stopped).
public final class X11SettingsDriver: FeatureDriver, @unchecked Sendable {
    public let name = "x11-settings"
    static let features: Set<Feature> = [.highContrast, .largeText, .reduceMotion]
    private let lookout: X11Lookout
    private var desktop: SessionDesktopDriver { lookout.desktop }
    private let owner: ProgramOwner
    private let loop: EventLoop
    private let program: SessionProgram
    private let logger: Logger
    /// The run going, and the settings its file holds.
    private var run: ProgramRecord?
    private var written: String?
    package private(set) var capabilities: [Feature: FeatureCapability] = [:]
    package var desktopPart: DesktopPart? { nil }
    package var followsReads: Bool { true }
    private var events: (@Sendable (DriverEvent) -> Void)?

    /// How long GTK is given to take the restored values before xsettingsd
    /// stops (a theme: 32–50 ms measured here).
    static let restoreWait: Duration = .milliseconds(200)

    public init(
        desktop: SessionDesktopDriver, owner: ProgramOwner = .service, loop: EventLoop, bus: Connection, logger: Logger
    ) {
        // GTK's apps read them (as on Wayland through dconf): a part of the screen.
        lookout = X11Lookout(.settingsManager, features: Self.features, reach: .part, desktop: desktop, loop: loop) {
            facts in facts.settingsManager.map(Self.foreign)
        }
        self.owner = owner
        self.loop = loop
        self.logger = logger
        program = SessionProgram(.settingsManager, owner: owner, loop: loop, bus: bus, logger: logger)
    }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {
        self.events = events
        program.onEvent { [self] event in self.programEvent(event) }
        lookout.follow { [self] in await askAgain() }
        await lookout.ask(running: false)
        capabilities = currentCapabilities()
    }

    package func supportWasRead() {
        Task(executorPreference: loop) { await self.askAgain() }
    }

    package nonisolated(nonsending) func lookAgain(for features: Set<Feature>) async {
        guard !features.isDisjoint(with: Self.features) else { return }
        await askAgain()
    }

    private func askAgain() async {
        await lookout.again(running: { run != nil }) { updateCapabilities() }
    }

    private func currentCapabilities() -> [Feature: FeatureCapability] {
        lookout.capabilities(
            running: run != nil,
            otherwise: configurationPath == nil ? "the session has no XDG_RUNTIME_DIR for xsettingsd's file" : nil)
    }

    /// Tells the service when what it delivers changed.
    private func updateCapabilities() {
        let new = currentCapabilities()
        guard new != capabilities else { return }
        capabilities = new
        events?(.changed)
    }

    static func foreign(_ manager: X11SelectionOwner) -> String {
        "a settings manager of the kiosk's own runs (\(manager)), and the service never runs a second one: "
            + "give the features through it"
    }

    /// xsettingsd's file: in the runtime directory, the service's or the agent's.
    private var configurationPath: String? {
        SessionProbe(environment: desktop.environment).runtimeDirectory.map {
            $0 + (owner == .service ? "/guidedaccess-xsettingsd.conf" : "/guidedaccess-agent-xsettingsd.conf")
        }
    }

    // MARK: The transaction

    package nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool {
        let wanted = target.features.intersection(Self.features).filter { capabilities[$0] == .delivers(.part) }
        guard let path = configurationPath else { return false }
        if run != nil {
            if wanted.isEmpty {
                await restoreAndStop(path)
                return false
            }
            let settings = Self.settings(wanted, textScale: target.textScale, defaults: defaults)
            if settings != written, write(settings, to: path), await program.signal(SIGHUP) { written = settings }
            return false
        }
        guard !wanted.isEmpty else { return false }
        await lookout.ask(running: false)
        if let refused = lookout.refused {
            capabilities = currentCapabilities()
            throw DriverFailure(.unsupported, "\(wanted.sorted()[0]): \(refused); nothing was changed")
        }
        let settings = Self.settings(wanted, textScale: target.textScale, defaults: defaults)
        guard write(settings, to: path) else {
            throw DriverFailure(.failed, "\(wanted.sorted()[0]): cannot write \(path); nothing was changed")
        }
        guard let executable = SessionProbe(environment: desktop.environment).executable(ProgramKind.settingsManager.executable)
        else { throw DriverFailure(.failed, "xsettingsd is not installed; nothing was changed") }
        do throws(ProgramError) {
            run = try await program.start(executable, arguments: ["-c", path], environment: desktop.programEnvironment)
            written = settings
        } catch {
            throw DriverFailure(.failed, "\(wanted.sorted()[0]): xsettingsd: \(error.message); nothing was changed")
        }
        return true
    }

    /// GTK's values from before, to xsettingsd and so to every GTK app;
    /// then xsettingsd stops.
    private func restoreAndStop(_ path: String) async {
        if write(Self.settings([], textScale: 1, defaults: defaults), to: path), await program.signal(SIGHUP) {
            try? await loop.sleep(for: Self.restoreWait)
        }
        program.stop()
        run = nil
        written = nil
        unlink(path)
    }

    private var defaults: GTKDefaults { GTKDefaults(environment: desktop.environment) }

    /// The file for `features`: every setting written, so that one turned
    /// off goes back (GTK keeps a setting that disappears); the DPI left
    /// out when large text is off, which GTK does undo.
    static func settings(_ features: Set<Feature>, textScale: Double, defaults: GTKDefaults) -> String {
        var lines = [
            "Net/ThemeName \"\(features.contains(.highContrast) ? "HighContrast" : defaults.theme)\"",
            "Gtk/EnableAnimations \(features.contains(.reduceMotion) ? 0 : (defaults.animations ? 1 : 0))",
        ]
        if features.contains(.largeText) { lines.append("Xft/DPI \(Int((96 * 1024 * textScale).rounded()))") }
        return lines.joined(separator: "\n") + "\n"
    }

    private func write(_ settings: String, to path: String) -> Bool {
        do throws(FileError) {
            try DurableFile.replace(
                path, with: Array(settings.utf8), mode: 0o644, temporary: path + ".new",
                directory: String(path[..<(path.lastIndex(of: "/") ?? path.endIndex)]))
            return true
        } catch {
            logger.error("xsettings: cannot write \(path): \(error)")
            return false
        }
    }

    private func programEvent(_ event: SessionProgram.Event) {
        guard run != nil else { return }
        switch event {
        case .restarted(let record):
            run = record
            events?(.recordChanged)
        case .gaveUp(let exits, let lastExit):
            run = nil
            events?(.recordChanged)
            for feature in Self.features.sorted() {
                events?(
                    .featureLost(
                        feature,
                        message: "\(feature): xsettingsd exited \(exits) times within a minute (last: \(lastExit)); it is not started again",
                        fields: ["FEATURE": feature.wireName, "EXITS": String(exits), "LAST_EXIT": lastExit]))
            }
        }
    }

    // MARK: The journal

    package var record: JSON? { run.map { .object($0.journalFields) } }

    package func validate(_ record: JSON) throws(DriverRecordError) {
        _ = try ProgramRecord(journal: record, kind: .settingsManager, owner: owner)
    }

    // MARK: Recovery

    /// A session that goes on keeps the journal's xsettingsd (adopted) with
    /// the session's settings; for one that is over, GTK gets its values
    /// back — through the journal's xsettingsd, or a new one if that one
    /// is gone — and then it stops.
    package nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote] {
        let recorded = try? record.map { record throws(DriverRecordError) in
            try ProgramRecord(journal: record, kind: .settingsManager, owner: owner)
        }
        await program.stopUnknownUnits(keeping: recorded)
        let goesOn = target.map { !endsNow && desktop.desktop == .x11 && !$0.features.isDisjoint(with: Self.features) } ?? false
        guard recorded != nil || goesOn, let path = configurationPath,
            let executable = SessionProbe(environment: desktop.environment).executable("xsettingsd")
        else { return [] }
        let features = goesOn ? (target?.features ?? []).intersection(Self.features) : []
        let settings = Self.settings(features, textScale: target?.textScale ?? 1, defaults: defaults)
        var notes: [DriverNote] = []
        do throws(ProgramError) {
            guard write(settings, to: path) else { throw ProgramError("cannot write \(path)") }
            run = try await program.resume(recorded, executable, arguments: ["-c", path], environment: desktop.programEnvironment)
            written = settings
            _ = await program.signal(SIGHUP)
            if !goesOn {
                // Only for GTK to take its values back.
                try? await loop.sleep(for: Self.restoreWait)
                program.stop()
                run = nil
                written = nil
                unlink(path)
            }
        } catch {
            notes.append(DriverNote(.error, "xsettings: cannot \(goesOn ? "resume" : "restore") GTK's settings: \(error)"))
        }
        // Asked at start, the xsettingsd adopted here held the selection: a
        // settings manager of the kiosk's own, it seemed.
        updateCapabilities()
        if run == nil { Task(executorPreference: loop) { await self.askAgain() } }
        return notes
    }
}

/// What GTK 3 would use without a settings manager: its settings.ini
/// files' `gtk-theme-name` and `gtk-enable-animations` (/etc/gtk-3.0, then
/// XDG_CONFIG_DIRS, then the user's, later ones winning), else Adwaita and
/// animations on.
struct GTKDefaults: Hashable, Sendable {
    var theme = "Adwaita"
    var animations = true

    init(theme: String = "Adwaita", animations: Bool = true) {
        self.theme = theme
        self.animations = animations
    }

    init(environment: [String: String]) {
        var files = ["/etc/gtk-3.0/settings.ini"]
        let dirs = environment["XDG_CONFIG_DIRS"].map { $0.split(separator: ":").map(String.init) } ?? ["/etc/xdg"]
        files += dirs.reversed().map { $0 + "/gtk-3.0/settings.ini" }
        if let home = environment["XDG_CONFIG_HOME"] ?? environment["HOME"].map({ $0 + "/.config" }) {
            files.append(home + "/gtk-3.0/settings.ini")
        }
        for file in files {
            guard let bytes = try? FileContents.read(file) else { continue }
            apply(ini: String(decoding: bytes, as: UTF8.self))
        }
    }

    /// The `[Settings]` group's two keys; a theme name xsettingsd's file
    /// could not hold as it is (a quote, a backslash) is left out.
    mutating func apply(ini text: String) {
        var inSettings = false
        for raw in text.split(whereSeparator: \.isNewline) {
            let line = raw.trimmingASCIIWhitespace
            if line.hasPrefix("[") {
                inSettings = line == "[Settings]"
                continue
            }
            guard inSettings, let equals = line.firstIndex(of: "=") else { continue }
            let key = line[..<equals].trimmingASCIIWhitespace
            let value = line[line.index(after: equals)...].trimmingASCIIWhitespace
            switch key {
            case "gtk-theme-name":
                if !value.isEmpty, !value.contains(where: { $0 == "\"" || $0 == "\\" }) { theme = String(value) }
            case "gtk-enable-animations":
                switch value.lowercased() {
                case "false", "0", "no": animations = false
                case "true", "1", "yes": animations = true
                default: break
                }
            default: continue
            }
        }
    }
}
