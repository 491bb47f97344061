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
        // Not a group of the service's, nor of a driver's: unknown.
        #expect(throws: error("Browser", "", "", "unknown group")) { try configured([("Browser", "DevToolsEndpoint", "")]) }
        #expect(error("Kiosk", "", "", "unknown group").description == "/etc/ga.conf: [Kiosk]: unknown group")
    }

    @Test func anUnknownKeyNamesFileGroupKeyAndValue() {
        #expect(throws: error("Session", "TimeLimit", "60", "unknown key")) { try configured([("Session", "TimeLimit", "60")]) }
        #expect(error("Session", "TimeLimit", "60", "unknown key").description == "/etc/ga.conf: [Session] TimeLimit=60: unknown key")
    }

    /// A driver module's key: checked by its check, its value kept for it.
    static let shade = DriverConfigurationKey(group: "Kiosk", key: "Shade") { $0 == "blue" || $0 == "auto" ? nil : "expected blue" }

    @Test func aDriversKeyIsCheckedByItsDriverAndKeptForIt() throws {
        var configuration = ServiceConfiguration(defaultsFor: .user, driverKeys: [Self.shade])
        #expect(configuration.driverValue(group: "Kiosk", key: "Shade") == nil)
        try configuration.apply(group: "Kiosk", key: "Shade", value: " blue ", file: "/etc/ga.conf")
        #expect(configuration.driverValue(group: "Kiosk", key: "Shade") == "blue")
        #expect(throws: error("Kiosk", "Shade", "red", "expected blue")) {
            try configuration.apply(group: "Kiosk", key: "Shade", value: "red", file: "/etc/ga.conf")
        }
        #expect(throws: error("Kiosk", "Tint", "x", "unknown key")) {
            try configuration.apply(group: "Kiosk", key: "Tint", value: "x", file: "/etc/ga.conf")
        }
        // A key in a group of the service's own.
        let desktop = DriverConfigurationKey(group: "Service", key: "Desktop") { _ in nil }
        var withDesktop = ServiceConfiguration(defaultsFor: .user, driverKeys: [desktop])
        try withDesktop.apply(group: "Service", key: "Desktop", value: "sway", file: "/etc/ga.conf")
        #expect(withDesktop.driverValue(group: "Service", key: "Desktop") == "sway")
    }

    @Test func everyKeyIsListedOnceTheServicesThenTheDrivers() {
        let keys = ServiceConfiguration(defaultsFor: .user, driverKeys: [Self.shade]).allKeys.map { "[\($0.group)] \($0.key)" }
        #expect(keys.count == Set(keys).count)
        #expect(keys.first == "[Service] Backend" && keys.last == "[Kiosk] Shade")
        #expect(keys.contains("[Dconf] LockOutsideSession") && keys.contains("[Session] TimeLimitSec"))
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
