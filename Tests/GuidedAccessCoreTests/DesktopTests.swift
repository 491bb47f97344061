import Testing
@testable import GuidedAccessCore

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

    @Test func logindsDesktopNamesMapOntoDesktops() {
        #expect(Desktop.named(sessionDesktop: "gnome") == .gnomeShell)
        #expect(Desktop.named(sessionDesktop: "KDE") == .kwin)
        #expect(Desktop.named(sessionDesktop: "sway") == .sway)
        #expect(Desktop.named(sessionDesktop: "openbox") == nil)
    }
}

@Suite struct FeatureRealisationTests {
    @Test func gnomeShellWithGnomeSessionRealisesEveryFeatureThroughTheKeys() {
        let realisation = Desktop.gnomeShell.realisation(sessionStartsScreenReader: true)
        #expect(realisation.byKeys == Set(Feature.allCases))
        #expect(!realisation.screenReaderByService)
    }

    @Test func aBareGnomeShellGetsItsScreenReaderFromTheService() {
        let realisation = Desktop.gnomeShell.realisation(sessionStartsScreenReader: false)
        #expect(realisation.byKeys == Set(Feature.allCases).subtracting([.screenReader]))
        #expect(realisation.screenReaderByService)
    }

    @Test func wlrootsCompositorsGetTheGtkKeysAndTheServicesScreenReaderOnly() {
        for desktop in [Desktop.sway, .cage, .labwc, .wayfire] {
            let realisation = desktop.realisation(sessionStartsScreenReader: true)
            #expect(realisation.byKeys == [.largeText, .highContrast, .reduceMotion])
            #expect(realisation.screenReaderByService)
        }
    }

    @Test func x11AndKwinGetOnlyTheScreenReaderAndNoneNothing() {
        for desktop in [Desktop.x11, .kwin] {
            #expect(desktop.realisation(sessionStartsScreenReader: false) == FeatureRealisation(byKeys: [], screenReaderByService: true))
        }
        #expect(Desktop.none.realisation(sessionStartsScreenReader: true) == FeatureRealisation(byKeys: [], screenReaderByService: false))
    }

    @Test func aScreenReaderNeedsOrcaSpeechAnOutputModuleAndForTheServiceAnXDisplay() {
        let full = ScreenReaderInstallation(
            orca: "/usr/bin/orca", speechDispatcher: "/usr/bin/speech-dispatcher", outputModules: ["sd_espeak-ng"],
            x11Display: ":0")
        #expect(full.unavailableReason(needsDisplay: true) == nil)
        var noOrca = full
        noOrca.orca = nil
        #expect(noOrca.unavailableReason(needsDisplay: false) == "orca is not installed")
        var noSpeech = full
        noSpeech.speechDispatcher = nil
        #expect(noSpeech.unavailableReason(needsDisplay: true) == "speech-dispatcher is not installed")
        var noModule = full
        noModule.outputModules = []
        #expect(noModule.unavailableReason(needsDisplay: true)?.hasPrefix("speech-dispatcher has no output module") == true)
        var noDisplay = full
        noDisplay.x11Display = nil
        #expect(noDisplay.unavailableReason(needsDisplay: true)?.contains("no X display") == true)
        #expect(noDisplay.unavailableReason(needsDisplay: false) == nil)
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
