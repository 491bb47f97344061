import Foundation
import Testing
@testable import GuidedAccessCore

@Suite struct ServiceConfigurationTests {
    func configured(_ entries: [(String, String, String)], mode: ServiceMode = .user) throws(ConfigurationError) -> ServiceConfiguration {
        var configuration = ServiceConfiguration(defaultsFor: mode)
        for (group, key, value) in entries { try configuration.apply(group: group, key: key, value: value, file: "/etc/ga.conf") }
        return configuration
    }

    func error(_ group: String, _ key: String, _ value: String, _ reason: String) -> ConfigurationError {
        ConfigurationError(file: "/etc/ga.conf", group: group, key: key, value: value, reason: reason)
    }

    @Test func userModeDefaultsToGSettingsAndSystemModeToDconf() {
        #expect(ServiceConfiguration(defaultsFor: .user).backend == .gsettings)
        #expect(ServiceConfiguration(defaultsFor: .system).backend == .dconf)
    }

    @Test func defaultsMatchTheDocumentedFile() {
        let configuration = ServiceConfiguration(defaultsFor: .system)
        #expect(configuration.session == SessionDefaults(timeLimitSec: 0, inhibitSleep: true, zoomFactor: 2.0, textScale: 1.5))
        #expect(configuration.dconf.databaseDir == "/etc/dconf/db")
        #expect(configuration.dconf.databaseName == "guidedaccess")
        #expect(configuration.dconf.lockOutsideSession)
        #expect(configuration.clients == nil)
        #expect(configuration.operators == nil)
    }

    /// systemd/guidedaccess.conf.example with every `#Key=value` taken in:
    /// each value it shows is one the service accepts (scripts/check-docs
    /// checks that it shows every key).
    @Test func theExampleFileIsAccepted() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let example = try String(contentsOf: root.appendingPathComponent("systemd/guidedaccess.conf.example"), encoding: .utf8)
        var configuration = ServiceConfiguration(defaultsFor: .system)
        var group = ""
        var applied = 0
        for line in example.split(separator: "\n").map(String.init) {
            if line.hasPrefix("["), line.hasSuffix("]") {
                group = String(line.dropFirst().dropLast())
                try configuration.applyGroup(group, file: "example")
            } else if line.hasPrefix("#"), let equals = line.firstIndex(of: "="),
                line.dropFirst().prefix(while: { $0.isLetter }).count == line.distance(from: line.index(after: line.startIndex), to: equals)
            {
                let key = String(line[line.index(after: line.startIndex)..<equals])
                try configuration.apply(group: group, key: key, value: String(line[line.index(after: equals)...]), file: "example")
                applied += 1
            }
        }
        #expect(applied > 10)
    }

    @Test func everyDocumentedKeyIsRead() throws {
        let configuration = try configured([
            ("Service", "Backend", "memory"),
            ("Clients", "AllowUsers", "kiosk"),
            ("Clients", "AllowGroups", ""),
            ("Clients", "AllowExecutables", "/usr/bin/kiosk-browser"),
            ("Clients", "AllowUnits", "kiosk-app.service;other.service;"),
            ("Operators", "AllowUsers", ""),
            ("Operators", "AllowGroups", "wheel"),
            ("Session", "TimeLimitSec", "3600"),
            ("Session", "InhibitSleep", "false"),
            ("Session", "ZoomFactor", "4.5"),
            ("Session", "TextScale", "2"),
            ("Dconf", "DatabaseDir", "/tmp/db"),
            ("Dconf", "DatabaseName", "kiosk"),
            ("Dconf", "LockOutsideSession", "false"),
        ])
        #expect(configuration.backend == .memory)
        #expect(configuration.clients?.allowUsers == ["kiosk"])
        #expect(configuration.clients?.allowGroups == [])
        #expect(configuration.clients?.allowExecutables == ["/usr/bin/kiosk-browser"])
        #expect(configuration.clients?.allowUnits == ["kiosk-app.service", "other.service"])
        #expect(configuration.operators?.allowGroups == ["wheel"])
        #expect(configuration.session == SessionDefaults(timeLimitSec: 3600, inhibitSleep: false, zoomFactor: 4.5, textScale: 2.0))
        #expect(configuration.dconf.databaseDir == "/tmp/db")
        #expect(configuration.dconf.databaseName == "kiosk")
        #expect(!configuration.dconf.lockOutsideSession)
    }

    @Test func aGroupHeaderAloneMakesTheGroupPresent() throws {
        var configuration = ServiceConfiguration(defaultsFor: .user)
        try configuration.applyGroup("Clients", file: "/etc/ga.conf")
        #expect(configuration.clients == ServiceConfiguration.ClientLists())
        #expect(configuration.operators == nil)
    }

    @Test func anUnknownGroupNamesTheFileAndGroup() {
        #expect(throws: error("Kiosk", "", "", "unknown group")) { try configured([("Kiosk", "Mode", "on")]) }
        #expect(error("Kiosk", "", "", "unknown group").description == "/etc/ga.conf: [Kiosk]: unknown group")
    }

    @Test func anUnknownKeyNamesFileGroupKeyAndValue() {
        #expect(throws: error("Session", "TimeLimit", "60", "unknown key")) { try configured([("Session", "TimeLimit", "60")]) }
        #expect(error("Session", "TimeLimit", "60", "unknown key").description == "/etc/ga.conf: [Session] TimeLimit=60: unknown key")
    }

    @Test func desktopNamesTheSessionOrAutoDetectsIt() throws {
        #expect(ServiceConfiguration(defaultsFor: .user).desktop == nil)
        #expect(try configured([("Service", "Desktop", "sway")]).desktop == .sway)
        #expect(try configured([("Service", "Desktop", "gnome-shell"), ("Service", "Desktop", "auto")]).desktop == nil)
        #expect(
            throws: error(
                "Service", "Desktop", "gnome",
                "expected auto or one of gnome-shell, kwin, sway, cage, labwc, wayfire, weston, x11, none")
        ) { try configured([("Service", "Desktop", "gnome")]) }
    }

    @Test func anUnknownBackendIsAnError() {
        #expect(throws: error("Service", "Backend", "kwin", "expected one of gsettings, dconf, memory")) {
            try configured([("Service", "Backend", "kwin")])
        }
    }

    @Test func aWrongTypeIsAnError() {
        #expect(throws: error("Session", "InhibitSleep", "yes", "expected true or false")) {
            try configured([("Session", "InhibitSleep", "yes")])
        }
        #expect(throws: error("Session", "TimeLimitSec", "-1", "expected a non-negative integer")) {
            try configured([("Session", "TimeLimitSec", "-1")])
        }
        #expect(throws: error("Session", "ZoomFactor", "big", "expected a number")) {
            try configured([("Session", "ZoomFactor", "big")])
        }
    }

    @Test func outOfRangeValuesAreErrors() {
        #expect(throws: error("Session", "TimeLimitSec", "2678401", "out of range 0…2678400")) {
            try configured([("Session", "TimeLimitSec", "2678401")])
        }
        #expect(throws: error("Session", "ZoomFactor", "0.5", "out of range 1.0…32.0")) {
            try configured([("Session", "ZoomFactor", "0.5")])
        }
        #expect(throws: error("Session", "TextScale", "3.5", "out of range 1.0…3.0")) {
            try configured([("Session", "TextScale", "3.5")])
        }
    }

    @Test func anEmptyItemInsideAListIsAnError() {
        #expect(throws: error("Clients", "AllowUsers", "kiosk;;admin", "empty item in list")) {
            try configured([("Clients", "AllowUsers", "kiosk;;admin")])
        }
    }

    @Test func aRelativeExecutableIsAnError() {
        #expect(throws: error("Clients", "AllowExecutables", "kiosk-browser", "executable 'kiosk-browser' is not an absolute path")) {
            try configured([("Clients", "AllowExecutables", "kiosk-browser")])
        }
    }

    @Test func aDatabaseNameWithASlashIsAnError() {
        #expect(throws: error("Dconf", "DatabaseName", "../user", "expected a database name without '/'")) {
            try configured([("Dconf", "DatabaseName", "../user")])
        }
    }

    @Test func laterEntriesOverrideEarlierOnesAsDropInsDo() throws {
        let configuration = try configured([("Session", "ZoomFactor", "3"), ("Session", "ZoomFactor", "5")])
        #expect(configuration.session.zoomFactor == 5.0)
    }
}

@Suite struct DevToolsEndpointTests {
    func endpoint(_ value: String) throws(ConfigurationError) -> DevToolsEndpoint? {
        var configuration = ServiceConfiguration(defaultsFor: .user)
        try configuration.apply(group: "Browser", key: "DevToolsEndpoint", value: value, file: "/etc/ga.conf")
        return configuration.devToolsEndpoint
    }

    @Test func loopbackAddressesAreTaken() throws {
        #expect(try endpoint("http://127.0.0.1:9222")?.description == "http://127.0.0.1:9222")
        #expect(try endpoint(" http://127.0.0.1:9222/ ")?.authority == "127.0.0.1:9222")
        #expect(try endpoint("http://127.3.2.1:1")?.address == .ipv4(127, 3, 2, 1))
        #expect(try endpoint("http://localhost:9222")?.description == "http://127.0.0.1:9222")
        #expect(try endpoint("HTTP://127.0.0.1:9222")?.description == "http://127.0.0.1:9222")
        #expect(try endpoint("http://[::1]:9222")?.address == .ipv6Loopback)
        #expect(try endpoint("http://[::1]:9222")?.authority == "[::1]:9222")
        #expect(try endpoint("") == nil)
        #expect(ServiceConfiguration(defaultsFor: .system).devToolsEndpoint == nil)
    }

    @Test(arguments: [
        ("http://10.0.0.1:9222", "host '10.0.0.1' is not a loopback address"),
        ("http://example.com:9222", "host 'example.com' is not a loopback address"),
        ("http://127.1:9222", "host '127.1' is not a loopback address"),
        ("http://127.000.0.1:9222", "host '127.000.0.1' is not a loopback address"),
        ("http://[::2]:9222", "host '[::2]' is not a loopback address"),
        ("http://0.0.0.0:9222", "host '0.0.0.0' is not a loopback address"),
        ("https://127.0.0.1:9222", "expected a loopback http:// address"),
        ("ws://127.0.0.1:9222", "expected a loopback http:// address"),
        ("127.0.0.1:9222", "expected a loopback http:// address"),
        ("http://127.0.0.1", "expected ':PORT' after the host"),
        ("http://127.0.0.1:", "port '' is not a number from 1 to 65535"),
        ("http://127.0.0.1:0", "port '0' is not a number from 1 to 65535"),
        ("http://127.0.0.1:99999", "port '99999' is not a number from 1 to 65535"),
        ("http://127.0.0.1:+80", "port '+80' is not a number from 1 to 65535"),
        ("http://127.0.0.1:9222/json", "expected only a host and a port after http://, found '/'"),
        ("http://user@127.0.0.1:9222", "expected only a host and a port after http://, found '@'"),
        ("http://127.0.0.1:9222?x", "expected only a host and a port after http://, found '?'"),
    ])
    func anythingElseIsAStartUpErrorNamingTheValue(value: String, reason: String) {
        do {
            _ = try endpoint(value)
            Issue.record("\(value) was taken")
        } catch {
            #expect(error.file == "/etc/ga.conf" && error.group == "Browser" && error.key == "DevToolsEndpoint")
            #expect(error.value == value)
            #expect(error.reason.hasPrefix(reason), "\(error.reason)")
            #expect(error.description.hasPrefix("/etc/ga.conf: [Browser] DevToolsEndpoint=\(value): "))
        }
    }
}
