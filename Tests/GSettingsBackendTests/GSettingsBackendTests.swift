import DBus
import Foundation
@testable import GSettingsBackend
import GuidedAccessCore
import Testing
import TestSupport

let magnifier = "org.gnome.desktop.a11y.magnifier"
let applications = "org.gnome.desktop.a11y.applications"
let interface = "org.gnome.desktop.interface"

/// Checks that need only the installed schemas: they never create a GSettings
/// object, so they run in this process without a bus.
@Suite struct SchemaChecks {
    /// Never run: these checks fail before anything waits on it.
    let backend = GSettingsBackend(loop: EventLoop())

    @Test func nameIsGsettings() {
        #expect(backend.name == "gsettings")
    }

    @Test func mappedKeyIsAvailable() {
        #expect(backend.availability(of: SettingKey(schema: magnifier, key: "mag-factor"), for: .double(2)) == .available)
        #expect(
            backend.availability(of: SettingKey(schema: magnifier, key: "screen-position"), for: .string("full-screen"))
                == .available)
    }

    @Test func unknownSchemaIsMissingSchemaWithoutCrashing() async throws {
        let key = SettingKey(schema: "org.example.no-such-schema", key: "enabled")
        #expect(backend.availability(of: key, for: .bool(true)) == .missingSchema)
        let error = #expect(throws: SettingsBackendError.self) { try backend.check([key: .bool(true)]) }
        #expect(error?.kind == .unsupported)
        #expect(error?.message.contains("org.example.no-such-schema") == true)
        #expect(throws: SettingsBackendError.self) { try backend.userValue(of: key) }
        await #expect(throws: SettingsBackendError.self) { try await backend.apply([key: .bool(true)]) }
    }

    @Test func reducedMotionIsMissingKeyOnGnome43() throws {
        let key = SettingKey(schema: "org.gnome.desktop.a11y.interface", key: "reduced-motion")
        #expect(backend.availability(of: key, for: .string("reduce")) == .missingKey)
        let error = #expect(throws: SettingsBackendError.self) { try backend.check([key: .string("reduce")]) }
        #expect(error?.kind == .unsupported)
        #expect(error?.message.contains("org.gnome.desktop.a11y.interface reduced-motion") == true)
    }

    @Test func valueOfAnotherTypeIsWrongType() throws {
        let key = SettingKey(schema: magnifier, key: "mag-factor")
        #expect(backend.availability(of: key, for: .bool(true)) == .wrongType(expected: "d"))
        let error = #expect(throws: SettingsBackendError.self) { try backend.check([key: .string("2")]) }
        #expect(error?.kind == .unsupported)
    }

    @Test func magFactor40IsOutOfRange() throws {
        let error = #expect(throws: SettingsBackendError.self) {
            try backend.check([SettingKey(schema: magnifier, key: "mag-factor"): .double(40)])
        }
        #expect(error?.kind == .outOfRange)
        #expect(error?.message == "org.gnome.desktop.a11y.magnifier mag-factor 40.0 is out of range")
    }

    @Test func nanIsOutOfRange() throws {
        let error = #expect(throws: SettingsBackendError.self) {
            try backend.check([SettingKey(schema: magnifier, key: "mag-factor"): .double(.nan)])
        }
        #expect(error?.kind == .outOfRange)
    }

    @Test func unknownEnumNickIsOutOfRange() throws {
        let key = SettingKey(schema: magnifier, key: "screen-position")
        let error = #expect(throws: SettingsBackendError.self) { try backend.check([key: .string("bogus")]) }
        #expect(error?.kind == .outOfRange)
        #expect(error?.message == "org.gnome.desktop.a11y.magnifier screen-position 'bogus' is out of range")
        _ = try backend.check([key: .string("full-screen")])
    }

    @Test func valuesInRangeValidate() throws {
        _ = try backend.check([SettingKey(schema: magnifier, key: "mag-factor"): .double(32)])
        _ = try backend.check([SettingKey(schema: magnifier, key: "color-saturation"): .double(0)])
        _ = try backend.check([SettingKey(schema: applications, key: "screen-reader-enabled"): .bool(true)])
    }
}

/// Reads and writes through real dconf on a private bus, with the backend in
/// the probe process and cross-checks by `gsettings` and `dconf`; each test
/// once per store (libdconf change sets, and GSettings objects).
@Suite struct RealDconf {
    @Test(arguments: GSettingsBackend.Store.allCases) func appliedValueIsVisibleToAnotherProcessWhenApplyReturns(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        #expect(try dconf.probe("set \(magnifier) mag-factor 3.5") == ["ok"])
        #expect(try dconf.gsettingsGet(magnifier, "mag-factor") == "3.5")
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/mag-factor") == "3.5")
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func enumKeyIsWrittenAsItsNick(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        #expect(
            try dconf.probe("set \(magnifier) screen-position 'top-half'", "get \(magnifier) screen-position")
                == ["ok", "'top-half'"])
        #expect(try dconf.gsettingsGet(magnifier, "screen-position") == "'top-half'")
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func unsetKeyHasNoUserValue(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        #expect(try dconf.probe("get \(magnifier) mag-factor") == ["unset"])
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func userValueReadsWhatAnotherProcessWrote(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        #expect(try dconf.run("/usr/bin/gsettings", ["set", applications, "screen-reader-enabled", "true"]).status == 0)
        #expect(try dconf.probe("get \(applications) screen-reader-enabled") == ["true"])
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func resetLeavesTheKeyUnset(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        #expect(try dconf.probe("set \(magnifier) invert-lightness true") == ["ok"])
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/invert-lightness") == "true")
        #expect(try dconf.probe("reset \(magnifier) invert-lightness", "get \(magnifier) invert-lightness") == ["ok", "unset"])
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/invert-lightness") == "")
        #expect(try dconf.gsettingsGet(magnifier, "invert-lightness") == "false")
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func batchAppliesValuesAndResetsAcrossSchemas(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        #expect(try dconf.probe("set \(magnifier) color-saturation 0.5") == ["ok"])
        let lines = try dconf.probe(
            "stage \(applications) screen-magnifier-enabled true",
            "stage \(magnifier) mag-factor 1.0",
            "stage \(magnifier) invert-lightness true",
            "stage \(magnifier) color-saturation -",
            "stage \(interface) text-scaling-factor 1.5",
            "apply")
        #expect(lines == ["ok", "ok", "ok", "ok", "ok", "ok"])
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/applications/screen-magnifier-enabled") == "true")
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/mag-factor") == "1.0")
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/invert-lightness") == "true")
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/color-saturation") == "")
        #expect(try dconf.dconfRead("/org/gnome/desktop/interface/text-scaling-factor") == "1.5")
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func batchWithAValueOutOfRangeWritesNothing(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        let lines = try dconf.probe(
            "stage \(magnifier) invert-lightness true",
            "stage \(magnifier) mag-factor 40.0",
            "apply")
        #expect(lines == ["ok", "ok", "error outOfRange: org.gnome.desktop.a11y.magnifier mag-factor 40.0 is out of range"])
        #expect(try dconf.run("/usr/bin/dconf", ["dump", "/"]).stdout == "")
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func unknownSchemaIsRefusedWithoutCrashingTheProcess(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        let lines = try dconf.probe(
            "availability org.example.none enabled true",
            "set org.example.none enabled true",
            "get org.example.none enabled",
            "availability org.gnome.desktop.a11y.interface reduced-motion 'reduce'",
            "set org.gnome.desktop.a11y.interface reduced-motion 'reduce'")
        #expect(lines.count == 5)
        #expect(lines[0] == "missingSchema")
        #expect(lines[1].hasPrefix("error unsupported: org.example.none"))
        #expect(lines[2].hasPrefix("error unsupported: org.example.none"))
        #expect(lines[3] == "missingKey")
        #expect(lines[4].hasPrefix("error unsupported: org.gnome.desktop.a11y.interface reduced-motion"))
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func lockedKeyIsRefusedAndTheBatchIsNotWritten(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        // A file-db with a lock, as system mode makes them (`dconf update DIR`).
        let db = dconf.root + "/db"
        try FileManager.default.createDirectory(atPath: db + "/site.d/locks", withIntermediateDirectories: true)
        try "[org/gnome/desktop/a11y/magnifier]\nmag-factor=6.0\n"
            .write(toFile: db + "/site.d/10-site", atomically: true, encoding: .utf8)
        try "/org/gnome/desktop/a11y/magnifier/mag-factor\n"
            .write(toFile: db + "/site.d/locks/site", atomically: true, encoding: .utf8)
        #expect(try dconf.run("/usr/bin/dconf", ["update", db]).status == 0)
        try "user-db:user\nfile-db:\(db)/site\n".write(toFile: dconf.root + "/profile", atomically: true, encoding: .utf8)
        let profile = ["DCONF_PROFILE": dconf.root + "/profile"]

        let lines = try dconf.probe(
            "stage \(magnifier) invert-lightness true",
            "stage \(magnifier) mag-factor 3.0",
            "apply",
            extra: profile)
        #expect(lines.last == "error writeFailed: org.gnome.desktop.a11y.magnifier mag-factor is not writable (locked)")
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/invert-lightness") == "")
        #expect(try dconf.run("/usr/bin/gsettings", ["get", magnifier, "mag-factor"], extra: profile).stdout == "6.0\n")
    }

    @Test(arguments: GSettingsBackend.Store.allCases) func writeWithoutDconfServiceIsAWriteFailure(store: GSettingsBackend.Store) throws {
        let dconf = try PrivateDconf(store: store)
        let lines = try dconf.probe(
            "set \(magnifier) mag-factor 4.0",
            extra: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(dconf.root)/no-bus"])
        #expect(lines.count == 1)
        #expect(lines.first?.hasPrefix("error writeFailed: org.gnome.desktop.a11y.magnifier mag-factor 4.0") == true)
    }
}

/// The dconf store's writes: over libdbus to the writer of the profile's
/// user database, found as libdconf finds its profile; libdconf otherwise.
@Suite struct DconfWriterChoice {
    @Test func theDefaultProfileWritesToTheUserDatabaseWithoutGDBus() throws {
        let dconf = try PrivateDconf(store: .dconf)
        let lines = try dconf.probe("writer", "set \(magnifier) mag-factor 2.5", "threads")
        #expect(lines.prefix(2) == ["/ca/desrt/dconf/Writer/user", "ok"])
        // GDBus would have started its worker thread, "gdbus".
        #expect(lines.last?.split(separator: " ").contains("gdbus") == false, "\(lines)")
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/mag-factor") == "2.5")
    }

    @Test func aProfileNamingAnotherUserDatabaseWritesThere() throws {
        let dconf = try PrivateDconf(store: .dconf)
        let profile = dconf.root + "/kiosk.profile"
        try "# a kiosk\n\n  user-db:kiosk   # ours\nsystem-db:local\n".write(toFile: profile, atomically: true, encoding: .utf8)
        let env = ["DCONF_PROFILE": profile]
        #expect(try dconf.probe("writer", "set \(magnifier) mag-factor 3.25", "get \(magnifier) mag-factor", extra: env)
            == ["/ca/desrt/dconf/Writer/kiosk", "ok", "3.25"])
        #expect(try dconf.run("/usr/bin/dconf", ["read", "/org/gnome/desktop/a11y/magnifier/mag-factor"], extra: env).stdout == "3.25\n")
        #expect(FileManager.default.fileExists(atPath: dconf.root + "/config/dconf/kiosk"))
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/mag-factor") == "")
    }

    @Test func theRuntimeProfileCountsWhenDconfProfileIsUnset() throws {
        let dconf = try PrivateDconf(store: .dconf)
        try FileManager.default.createDirectory(atPath: dconf.root + "/runtime/dconf", withIntermediateDirectories: true)
        try "user-db:runtime\n".write(toFile: dconf.root + "/runtime/dconf/profile", atomically: true, encoding: .utf8)
        #expect(try dconf.probe("writer", "set \(magnifier) invert-lightness true") == ["/ca/desrt/dconf/Writer/runtime", "ok"])
        #expect(FileManager.default.fileExists(atPath: dconf.root + "/config/dconf/runtime"))
    }

    @Test func aProfileNotStartingWithAUserDatabaseLeavesTheWritesToLibdconf() throws {
        let dconf = try PrivateDconf(store: .dconf)
        let profile = dconf.root + "/service.profile"
        try "service-db:other\nuser-db:user\n".write(toFile: profile, atomically: true, encoding: .utf8)
        #expect(try dconf.probe("writer", extra: ["DCONF_PROFILE": profile]) == ["libdconf"])
        #expect(try dconf.probe("writer", extra: ["DCONF_PROFILE": dconf.root + "/missing.profile"]) == ["libdconf"])
        #expect(try dconf.probe("writer", extra: ["GUIDEDACCESS_PROBE_STORE": "gsettings"]) == ["libdconf"])
    }

    @Test(arguments: [
        ("user-db:user", "/ca/desrt/dconf/Writer/user"),
        ("\t user-db:my_db2 \t# comment\nsystem-db:x", "/ca/desrt/dconf/Writer/my_db2"),
        ("# only comments\n\nnonsense\nweird-db:x\nuser-db:\nuser-db:second", "/ca/desrt/dconf/Writer/second"),
        ("system-db:local\nuser-db:user", nil),
        ("file-db:/etc/x\nuser-db:user", nil),
        ("user-db:bad-name", nil),
        ("", nil),
    ] as [(String, String?)])
    func theWriterIsTheFirstDatabaseDconfAccepts(profile: String, writer: String?) {
        #expect(DconfWriter.firstUserDatabase(profile) == writer)
    }
}

/// Which store the service uses, as GLib would choose its backend.
@Suite struct StoreChoice {
    @Test func dconfUnlessGSettingsBackendNamesAnother() throws {
        let dconf = try PrivateDconf(store: .dconf)
        let env = ["GUIDEDACCESS_PROBE_STORE": ""]
        #expect(try dconf.probe("store", extra: env) == ["dconf"])
        #expect(try dconf.probe("store", extra: env.merging(["GSETTINGS_BACKEND": "keyfile"]) { $1 }) == ["gsettings"])
        #expect(try dconf.probe("store", extra: env.merging(["GSETTINGS_BACKEND": ""]) { $1 }) == ["dconf"])
    }

    /// GSettings' keyfile backend: the gsettings store with a backend other than dconf.
    @Test func keyfileBackendIsWrittenThroughGSettings() throws {
        let dconf = try PrivateDconf(store: .dconf)
        let env = ["GUIDEDACCESS_PROBE_STORE": "", "GSETTINGS_BACKEND": "keyfile"]
        #expect(try dconf.probe("set \(magnifier) mag-factor 3.5", "get \(magnifier) mag-factor", extra: env) == ["ok", "3.5"])
        let keyfile = try String(contentsOfFile: dconf.root + "/config/glib-2.0/settings/keyfile", encoding: .utf8)
        #expect(keyfile.contains("[org/gnome/desktop/a11y/magnifier]"))
        #expect(keyfile.contains("mag-factor=3.5"))
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/mag-factor") == "")
    }
}
