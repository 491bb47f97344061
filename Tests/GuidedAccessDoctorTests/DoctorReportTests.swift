import GuidedAccessAPI
import Testing

@testable import GuidedAccessDoctor

@Suite struct DoctorReportTests {
    /// A bare bus: nothing acts on the settings.
    static let bare = DoctorService(
        desktop: "none", supportedFeatures: ["large-text"],
        unsupportedReasons: Dictionary(
            uniqueKeysWithValues: Feature.allCases.filter { $0 != .largeText }.map {
                ($0.wireName, "\($0.wireName): the desktop 'none' does not act on it")
            }),
        agent: "", backend: "gsettings", version: "0.1.0")

    static let everything = DoctorService(
        desktop: "none", supportedFeatures: Feature.allCases.map(\.wireName), unsupportedReasons: [:], agent: "",
        backend: "memory", version: "0.1.0")

    @Test func theDefaultRequirementIsTheFourFeaturesOfAPublicKiosk() {
        let report = DoctorReport(mode: "user", bus: "session bus", service: Self.bare, checks: [], required: [])
        #expect(report.required == [.screenReader, .zoom, .invertColors, .grayscale])
        #expect(report.missing == report.required)
        #expect(report.outcome == .unsupported)
        #expect(!report.json.ok)
    }

    @Test func everyFeatureSupportedIsOK() {
        let report = DoctorReport(mode: "user", bus: "session bus", service: Self.everything, checks: [], required: [])
        #expect(report.missing.isEmpty)
        #expect(report.outcome == .ok)
        #expect(report.text.split(separator: "\n").last!.hasPrefix("Missing: nothing"))
        #expect(report.json.features["zoom"]?.reason == nil)
    }

    @Test func featureNarrowsTheRequirement() {
        let report = DoctorReport(
            mode: "user", bus: "session bus", service: Self.bare, checks: [], required: [.largeText, .largeText])
        #expect(report.required == [.largeText])
        #expect(report.outcome == .ok)
        let zoom = DoctorReport(mode: "user", bus: "session bus", service: Self.bare, checks: [], required: [.zoom])
        #expect(zoom.missing == [.zoom])
    }

    @Test func theReasonIsTheServices() {
        let report = DoctorReport(mode: "user", bus: "session bus", service: Self.bare, checks: [], required: [])
        #expect(report.verdict(.zoom).reason == "zoom: the desktop 'none' does not act on it")
        #expect(report.json.features["zoom"]?.reason == "zoom: the desktop 'none' does not act on it")
        // The line shows the feature once.
        let line = report.text.split(separator: "\n").first { $0.contains("zoom:") }!
        #expect(line.hasSuffix("no: the desktop 'none' does not act on it"))
        #expect(line.hasPrefix("*"))
        #expect(report.text.split(separator: "\n").last!
            == "Missing: screen-reader, zoom, invert-colors, grayscale (required, *: screen-reader, zoom, invert-colors, grayscale)")
    }

    @Test func aServiceWithoutReasonsStillSaysNo() {
        var service = Self.bare
        service.unsupportedReasons = [:]
        let report = DoctorReport(mode: "user", bus: "session bus", service: service, checks: [], required: [.zoom])
        #expect(report.verdict(.zoom).reason == "zoom: not supported here (the service gives no reason)")
    }

    @Test func noServiceIsItsOwnOutcome() {
        let report = DoctorReport(
            mode: "system", bus: "system bus", service: nil, serviceError: "no bus", checks: [], required: [])
        #expect(report.outcome == .serviceUnavailable)
        #expect(report.missing == DoctorReport.defaultRequired)
        #expect(report.verdict(.zoom).reason == "zoom: no service answered on the system bus")
        #expect(report.text.split(separator: "\n").last!.contains("no service answered on the system bus"))
        #expect(!report.json.serviceReachable)
    }

    @Test func checksAreListedWithTheirFindings() {
        let checks = [DoctorCheck("orca", ok: false, "not installed"), DoctorCheck("display", ok: true, "DISPLAY=:0")]
        let report = DoctorReport(mode: "user", bus: "session bus", service: Self.everything, checks: checks, required: [])
        let lines = report.text.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.contains { $0.hasPrefix("  orca:") && $0.hasSuffix("no  not installed") })
        #expect(lines.contains { $0.hasPrefix("  display:") && $0.hasSuffix("ok  DISPLAY=:0") })
        #expect(report.json.checks == checks)
    }

    @Test func theDconfProfileLineIsLookedForExactly() {
        let path = "/etc/dconf/profile/user"
        #expect(DoctorCheck.dconfProfile(path: path, text: "user-db:user\n  system-db:guidedaccess \n").ok)
        #expect(!DoctorCheck.dconfProfile(path: path, text: "user-db:user\n#system-db:guidedaccess\n").ok)
        #expect(!DoctorCheck.dconfProfile(path: path, text: "system-db:guidedaccess-old\n").ok)
        let absent = DoctorCheck.dconfProfile(path: path, text: nil)
        #expect(!absent.ok && absent.detail.contains("guidedaccess-dconf-profile"))
    }

    @Test func theUnitIsFineRunningOrStartedOnDemand() {
        let unit = "guidedaccessd-user.service"
        #expect(DoctorCheck.unit(unit, scope: "user", enabled: "disabled", active: "active").ok)
        #expect(DoctorCheck.unit(unit, scope: "user", enabled: "static", active: "inactive").ok)
        #expect(!DoctorCheck.unit(unit, scope: "user", enabled: "masked", active: "inactive").ok)
        let none = DoctorCheck.unit(unit, scope: "user", enabled: nil, active: nil, failure: "systemctl is not installed")
        #expect(!none.ok && none.detail.contains("systemctl is not installed"))
    }
}
