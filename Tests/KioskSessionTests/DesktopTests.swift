import Testing
import GuidedAccessCore
@testable import KioskSession

@Suite struct DesktopDetectionTests {
    @Test func theShellsNameOnTheBusIsGnomeShellWhateverElseThereIs() {
        let evidence = DesktopEvidence(
            busNames: [Desktop.shellBusName], waylandDisplay: "wayland-0", waylandCompositor: "sway",
            currentDesktop: "sway", x11Display: ":0")
        #expect(Desktop.detect(evidence) == .gnomeShell)
    }

    @Test func kwinsNameOnTheBusIsKwin() {
        #expect(Desktop.detect(DesktopEvidence(busNames: [Desktop.kwinBusName], waylandDisplay: "wayland-0")) == .kwin)
    }

    @Test func theProcessServingTheWaylandSocketNamesTheCompositor() {
        for (comm, desktop) in [
            ("sway", Desktop.sway), ("cage", .cage), ("labwc", .labwc), ("wayfire", .wayfire), ("weston", .weston),
            ("gnome-shell", .gnomeShell), ("kwin_wayland", .kwin),
        ] {
            #expect(Desktop.detect(DesktopEvidence(waylandDisplay: "wayland-1", waylandCompositor: comm)) == desktop)
        }
    }

    @Test func xdgCurrentDesktopNamesAWlrootsCompositorThatCouldNotBeAsked() {
        #expect(Desktop.detect(DesktopEvidence(waylandDisplay: "wayland-1", currentDesktop: "labwc:wlroots")) == .labwc)
        #expect(Desktop.detect(DesktopEvidence(waylandDisplay: "wayland-1", currentDesktop: "sway")) == .sway)
    }

    @Test func gnomeInXdgCurrentDesktopWithoutTheShellsNameIsNotGnomeShell() {
        // The keys act only once the shell runs: it announces itself on the bus.
        #expect(Desktop.detect(DesktopEvidence(waylandDisplay: "wayland-0", currentDesktop: "GNOME")) == .none)
    }

    @Test func anUnknownWaylandCompositorIsNoneEvenWithXwayland() {
        let evidence = DesktopEvidence(waylandDisplay: "wayland-0", waylandCompositor: "hyprland", x11Display: ":1")
        #expect(Desktop.detect(evidence) == .none)
    }

    @Test func anXDisplayWithoutWaylandIsX11() {
        #expect(Desktop.detect(DesktopEvidence(x11Display: ":0")) == .x11)
    }

    @Test func aBareBusIsNone() {
        #expect(Desktop.detect(DesktopEvidence()) == .none)
        #expect(Desktop.detect(DesktopEvidence(busNames: [Desktop.gnomeSessionBusName])) == .none)
    }

    @Test func logindsDesktopNamesMapOntoDesktopsAndOnlyGnomeSessionsStartTheScreenReader() {
        for name in ["gnome", "gnome-xorg", "ubuntu"] {
            #expect(Desktop.named(sessionDesktop: name)! == (.gnomeShell, true), "\(name)")
        }
        #expect(Desktop.named(sessionDesktop: "KDE")! == (.kwin, false))
        #expect(Desktop.named(sessionDesktop: "sway")! == (.sway, false))
        // GNOME Kiosk's own sessions, by their file names.
        for name in ["gnome-kiosk-script-wayland", "org.gnome.Kiosk.SearchApp.Session", "gnome-kiosk-menu-wayland"] {
            #expect(Desktop.named(sessionDesktop: name)! == (.gnomeKiosk, false), "\(name)")
        }
        #expect(Desktop.named(sessionDesktop: "openbox") == nil)
        #expect(Desktop.named(sessionDesktop: "") == nil)
    }

    @Test func gnomeKiosksNameOnTheBusComesBeforeTheShellsItAlsoOwns() {
        let evidence = DesktopEvidence(
            busNames: [Desktop.shellBusName, Desktop.kioskBusName], waylandDisplay: "wayland-0",
            waylandCompositor: "gnome-kiosk")
        #expect(Desktop.detect(evidence) == .gnomeKiosk)
    }

    @Test func gnomeKioskIsRecognisedByItsProcessAndByXdgCurrentDesktop() {
        #expect(Desktop.detect(DesktopEvidence(waylandDisplay: "wayland-0", waylandCompositor: "gnome-kiosk")) == .gnomeKiosk)
        #expect(Desktop.detect(DesktopEvidence(waylandDisplay: "wayland-0", currentDesktop: "GNOME-Kiosk:GNOME")) == .gnomeKiosk)
    }

    @Test func everyDesktopIsANameTheConfigurationTakes() {
        for desktop in Desktop.allCases { #expect(Desktop.configurationKey.check(desktop.rawValue) == nil) }
        #expect(Desktop.configurationKey.check("auto") == nil)
        #expect(Desktop.configured("auto") == nil && Desktop.configured(nil) == nil)
        #expect(Desktop.configured("gnome-kiosk") == .gnomeKiosk)
        #expect(
            Desktop.configurationKey.check("gnome")
                == "expected auto or one of gnome-shell, gnome-kiosk, kwin, sway, cage, labwc, wayfire, weston, x11, none")
    }
}

@Suite struct FeatureRealisationTests {
    static let gnomeSession = DesktopFacts(sessionStartsScreenReader: true)
    static let bare = DesktopFacts()

    @Test func gnomeShellWithGnomeSessionRealisesEveryFeatureThroughTheKeysForTheWholeScreen() {
        let realisation = Desktop.gnomeShell.realisation(Self.gnomeSession)
        #expect(realisation.byKeys == Dictionary(uniqueKeysWithValues: Feature.allCases.map { ($0, .wholeScreen) }))
        #expect(realisation.byProgram.isEmpty)
    }

    /// Only the shell draws its features over the whole screen (a browser
    /// layer leaves them to it); elsewhere the keys reach the desktop's apps
    /// only — but GNOME Kiosk's magnifier, which magnifies everything.
    @Test func onlyTheGnomeCompositorsRealiseKeysForTheWholeScreen() {
        for desktop in Desktop.allCases {
            let whole = desktop.realisation(DesktopFacts(kioskMagnifier: true)).byKeys.filter { $0.value == .wholeScreen }
            switch desktop {
            case .gnomeShell: #expect(Set(whole.keys) == Set(Feature.allCases).subtracting([.screenReader]))
            case .gnomeKiosk: #expect(Set(whole.keys) == [.zoom])
            default: #expect(whole.isEmpty, "\(desktop)")
            }
        }
    }

    @Test func aBareGnomeShellGetsItsScreenReaderFromTheService() {
        let realisation = Desktop.gnomeShell.realisation(Self.bare)
        #expect(Set(realisation.byKeys.keys) == Set(Feature.allCases).subtracting([.screenReader]))
        #expect(realisation.byProgram == [.screenReader])
    }

    @Test func gnomeKioskActsOnTextContrastMotionAndFromVersion50TheMagnifierButNoColourEffects() {
        let before50 = Desktop.gnomeKiosk.realisation(Self.bare)
        #expect(before50.byKeys == [.largeText: .part, .highContrast: .part, .reduceMotion: .part])
        #expect(before50.byProgram == [.screenReader])
        #expect(
            before50.notActing(.invertColors, on: .gnomeKiosk)
                == "the desktop 'gnome-kiosk' does not act on it (GNOME Kiosk has no colour effects; gnome-shell and x11 do)")
        #expect(before50.notActing(.zoom, on: .gnomeKiosk).contains("from version 50"))
        let from50 = Desktop.gnomeKiosk.realisation(DesktopFacts(sessionStartsScreenReader: true, kioskMagnifier: true))
        #expect(from50.byKeys[.zoom] == .wholeScreen && from50.byKeys[.screenReader] == .wholeScreen)
        #expect(from50.byKeys[.invertColors] == nil && from50.byKeys[.grayscale] == nil && from50.byProgram.isEmpty)
    }

    @Test func wlrootsCompositorsWithLayerShellGetTheGtkKeysAScreenReaderAndAKeyboard() {
        for desktop in [Desktop.sway, .labwc, .wayfire] {
            let realisation = desktop.realisation(Self.gnomeSession)
            #expect(realisation.byKeys == [.largeText: .part, .highContrast: .part, .reduceMotion: .part])
            #expect(realisation.byProgram == [.screenReader, .onScreenKeyboard])
        }
    }

    @Test func cageAndWestonHaveNoProtocolForAKeyboard() {
        for desktop in [Desktop.cage, .weston] {
            #expect(desktop.realisation(Self.bare).byProgram == [.screenReader])
        }
    }

    /// The reason names what would deliver the feature: the desktops that do.
    @Test func aFeatureADesktopDoesNotActOnNamesTheDesktopsThatDo() {
        #expect(
            Desktop.cage.realisation(Self.bare).notActing(.onScreenKeyboard, on: .cage)
                == "the desktop 'cage' does not act on it (gnome-shell, sway, labwc and wayfire do)")
        #expect(
            Desktop.sway.realisation(Self.bare).notActing(.zoom, on: .sway)
                == "the desktop 'sway' does not act on it (gnome-shell and gnome-kiosk do)")
        #expect(
            Desktop.gnomeKiosk.realisation(Self.bare).notActing(.zoom, on: .gnomeKiosk)
                == "the desktop 'gnome-kiosk' does not act on it (GNOME Kiosk has a magnifier from version 50, and the one running has none; gnome-shell does)")
        #expect(
            Desktop.none.realisation(Self.bare).notActing(.screenReader, on: .none)
                == "the desktop 'none' does not act on it (gnome-shell, gnome-kiosk, kwin, sway, cage, labwc, wayfire, weston and x11 do)")
    }

    /// X11's colour features and GTK settings are programs the service runs (picom, xsettingsd).
    @Test func x11GetsItsProgramsKwinOnlyTheScreenReaderAndNoneNothing() {
        #expect(Desktop.kwin.realisation(Self.bare) == FeatureRealisation(byKeys: [:], byProgram: [.screenReader]))
        let x11 = Desktop.x11.realisation(Self.bare)
        #expect(x11.byKeys.isEmpty && x11.byProgram == Set(Feature.allCases).subtracting([.zoom, .onScreenKeyboard]))
        #expect(Desktop.x11.realisation(Self.bare).notActing(.zoom, on: .x11).contains("picom has none"))
        #expect(Desktop.none.realisation(Self.gnomeSession) == FeatureRealisation(byKeys: [:], byProgram: []))
    }

    static func installed(_ programs: Set<String>, modules: [String] = ["sd_espeak-ng"]) -> ProgramInstallation {
        ProgramInstallation(executable: { programs.contains($0) ? "/usr/bin/\($0)" : nil }, speechOutputModules: modules)
    }

    @Test func aScreenReaderNeedsOrcaSpeechAnOutputModuleAndForTheServiceAnXDisplay() {
        let all = Self.installed(["orca", "speech-dispatcher"])
        let reader = ProgramKind.screenReader
        #expect(reader.unavailableReason(installed: all, x11Display: ":0", waylandDisplay: nil) == nil)
        #expect(
            reader.unavailableReason(installed: Self.installed(["speech-dispatcher"]), x11Display: ":0", waylandDisplay: nil)
                == "orca is not installed (package orca)")
        #expect(
            reader.unavailableReason(installed: Self.installed(["orca"]), x11Display: ":0", waylandDisplay: nil)
                == "speech-dispatcher is not installed (package speech-dispatcher)")
        #expect(
            reader.unavailableReason(
                installed: Self.installed(["orca", "speech-dispatcher"], modules: []), x11Display: ":0", waylandDisplay: nil
            ) == "speech-dispatcher has no output module: install one (e.g. package speech-dispatcher-espeak-ng)")
        #expect(
            reader.unavailableReason(installed: all, x11Display: nil, waylandDisplay: "wayland-0")?.contains("no X display")
                == true)
        #expect(reader.unavailableReason(installed: all, x11Display: nil, waylandDisplay: nil, needsDisplay: false) == nil)
    }

    @Test func aKeyboardNeedsWvkbdAndAWaylandDisplay() {
        let keyboard = ProgramKind.onScreenKeyboard
        #expect(keyboard.unavailableReason(installed: Self.installed(["wvkbd-mobintl"]), x11Display: nil, waylandDisplay: "wayland-1") == nil)
        #expect(
            keyboard.unavailableReason(installed: Self.installed([]), x11Display: nil, waylandDisplay: "wayland-1")
                == "wvkbd (wvkbd-mobintl) is not installed (package wvkbd)")
        #expect(
            keyboard.unavailableReason(installed: Self.installed(["wvkbd-mobintl"]), x11Display: ":0", waylandDisplay: nil)
                == "the session has no Wayland display for wvkbd")
    }

    @Test func onlyUnitNamesOfTheServicesOwnPatternAreItsUnits() {
        let reader = ProgramKind.screenReader
        #expect(reader.unitName(pid: 4242, run: 3) == "guidedaccess-screen-reader-4242-3.service")
        #expect(reader.isUnitName("guidedaccess-screen-reader-4242-3.service"))
        for other in [
            "sway-session.service", "guidedaccess-on-screen-keyboard-1-1.service", "guidedaccess-screen-reader-1.service",
            "guidedaccess-screen-reader-1-x.service", "guidedaccess-screen-reader--1.service",
            "guidedaccess-screen-reader-1-1.service/../x.service", "guidedaccess-screen-reader-1-1.scope",
        ] {
            #expect(!reader.isUnitName(other), "\(other)")
        }
    }

    @Test func theAgentsUnitsAndTheServicesNeverTakeEachOthersNames() {
        let reader = ProgramKind.screenReader
        let agents = reader.unitName(pid: 4242, run: 3, owner: .agent)
        #expect(agents == "guidedaccess-agent-screen-reader-4242-3.service")
        #expect(reader.isUnitName(agents, owner: .agent))
        // The user-mode service never stops the agent's units as strays, nor the agent the service's.
        #expect(!reader.isUnitName(agents, owner: .service))
        #expect(!reader.isUnitName(reader.unitName(pid: 4242, run: 3), owner: .agent))
        #expect(reader.unitPattern(owner: .service) == "guidedaccess-screen-reader-*.service")
        #expect(reader.unitPattern(owner: .agent) == "guidedaccess-agent-screen-reader-*.service")
    }

    @Test func onlyTheScreenReaderAndTheKeyboardAreRunAsPrograms() {
        #expect(Feature.allCases.compactMap(ProgramKind.init) == [.screenReader, .onScreenKeyboard])
        #expect(ProgramKind.screenReader.executable == "orca" && ProgramKind.screenReader.arguments == ["--replace"])
    }
}

@Suite struct RestartPolicyTests {
    @Test func exitsAreRestartedWithADoublingDelay() {
        var policy = RestartPolicy()
        let delays = (0..<5).map { policy.exited(atMilliseconds: 1000 + $0 * 100) }
        #expect(delays == [100, 200, 400, 800, 1600].map { .restart(afterMilliseconds: $0) })
    }

    @Test func theSixthExitWithinSixtySecondsGivesUp() {
        var policy = RestartPolicy()
        for i in 0..<5 { _ = policy.exited(atMilliseconds: i * 1000) }
        #expect(policy.exited(atMilliseconds: 59_000) == .giveUp(exits: 6))
    }

    @Test func exitsOlderThanTheIntervalNoLongerCount() {
        var policy = RestartPolicy()
        for i in 0..<5 { _ = policy.exited(atMilliseconds: i * 1000) }
        // The first exit is 60 s old: five within the minute, restarted.
        #expect(policy.exited(atMilliseconds: 60_000) == .restart(afterMilliseconds: 1600))
    }

    @Test func aResetForgetsTheExits() {
        var policy = RestartPolicy()
        for i in 0..<5 { _ = policy.exited(atMilliseconds: i) }
        policy.reset()
        #expect(policy.exited(atMilliseconds: 10) == .restart(afterMilliseconds: 100))
    }
}
