import DconfBackend
import Foundation
import GuidedAccessCore
import Testing
import TestSupport

let magnifier = "org.gnome.desktop.a11y.magnifier"
let invert = SettingKey(schema: magnifier, key: "invert-lightness")
let magFactor = SettingKey(schema: magnifier, key: "mag-factor")
let screenReader = SettingKey(schema: "org.gnome.desktop.a11y.applications", key: "screen-reader-enabled")

/// Real dconf: `dconf update` builds the database in a temporary DatabaseDir;
/// gsettings reads it through a profile `user-db:user` + `file-db:DIR/NAME`
/// on a private session bus (TestSupport's PrivateDconf)
/// whose dconf-service writes the private user database.
@Suite(.serialized) struct RealDconf {
    let dconf: PrivateDconf
    let databaseDir: String
    let profile: String

    init() throws {
        dconf = try PrivateDconf()
        databaseDir = dconf.root + "/db"
        profile = dconf.root + "/profile"
        try "user-db:user\nfile-db:\(databaseDir)/guidedaccess\n".write(toFile: profile, atomically: true, encoding: .utf8)
    }

    func gsettings(_ arguments: String...) throws -> PrivateDconf.Output {
        try dconf.run("/usr/bin/gsettings", arguments, extra: ["DCONF_PROFILE": profile])
    }

    func get(_ key: SettingKey) throws -> String {
        try gsettings("get", key.schema, key.key).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func writable(_ key: SettingKey) throws -> String {
        try gsettings("writable", key.schema, key.key).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path) }

    @Test func imposesLocksAndRestoresTheUsersOwnValue() async throws {
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        #expect(backend.name == "dconf")
        // Nothing imposed yet: an empty database, so the profile's file-db exists.
        try await backend.apply([invert: nil])
        #expect(exists(databaseDir + "/guidedaccess"))
        #expect(!exists(backend.keyfilePath))

        // The user's own value, in the user database.
        #expect(try gsettings("set", magnifier, "invert-lightness", "true").status == 0)
        #expect(try get(invert) == "true")
        #expect(try backend.userValue(of: invert) == nil)

        // A session imposes and locks.
        try await backend.apply([invert: .bool(false), magFactor: .double(3), screenReader: .bool(true)])
        #expect(
            try String(contentsOfFile: backend.keyfilePath, encoding: .utf8).contains(
                "[org/gnome/desktop/a11y/magnifier]\ninvert-lightness=false\nmag-factor=3.0\n"))
        #expect(
            try String(contentsOfFile: backend.locksPath, encoding: .utf8).contains(
                "/org/gnome/desktop/a11y/magnifier/invert-lightness\n"))
        #expect(try get(invert) == "false")
        #expect(try get(magFactor) == "3.0")
        #expect(try get(screenReader) == "true")
        #expect(try writable(invert) == "false")
        #expect(try writable(magFactor) == "false")
        #expect(try gsettings("set", magnifier, "invert-lightness", "true").status != 0)
        #expect(try get(invert) == "false")
        #expect(try backend.userValue(of: invert) == .bool(false))

        // A restarted service reads what it imposes back from the keyfile.
        let restarted = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        #expect(restarted.imposed == backend.imposed)
        #expect(restarted.imposed.count == 3)

        // The session ends: nothing imposed, both files gone, the user's own value back.
        try await backend.apply([invert: nil, magFactor: nil, screenReader: nil])
        #expect(!exists(backend.keyfilePath))
        #expect(!exists(backend.locksPath))
        #expect(exists(databaseDir + "/guidedaccess"))
        #expect(try get(invert) == "true")
        #expect(try writable(invert) == "true")
        #expect(try get(screenReader) == "false")
        #expect(try dconf.dconfRead("/org/gnome/desktop/a11y/magnifier/invert-lightness") == "true")
    }

    @Test func valueOutOfRangeIsRefusedBeforeAnythingIsWritten() async throws {
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        let error = await #expect(throws: SettingsBackendError.self) {
            try await backend.apply([invert: .bool(true), magFactor: .double(40)])
        }
        #expect(error?.kind == .outOfRange)
        #expect(!exists(databaseDir))
        #expect(backend.imposed.isEmpty)
        let unknown = await #expect(throws: SettingsBackendError.self) {
            try await backend.apply([SettingKey(schema: "org.example.nothing", key: "x"): .bool(true)])
        }
        #expect(unknown?.kind == .unsupported)
        #expect(!exists(databaseDir))
    }

    @Test func failingDconfUpdateIsWriteFailedNamingTheCommand() async throws {
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        try await backend.apply([invert: .bool(true)])
        // A directory where the database goes: dconf update cannot replace it.
        try FileManager.default.removeItem(atPath: backend.databasePath)
        try FileManager.default.createDirectory(atPath: backend.databasePath, withIntermediateDirectories: false)
        let error = await #expect(throws: SettingsBackendError.self) { try await backend.apply([invert: .bool(false)]) }
        #expect(error?.kind == .writeFailed)
        #expect(error?.message.contains("/usr/bin/dconf update \(databaseDir)") == true)
        // Nothing changed: memory and keyfile still say true.
        #expect(backend.imposed == [invert: .bool(true)])
        #expect(try String(contentsOfFile: backend.keyfilePath, encoding: .utf8).contains("invert-lightness=true"))

        let bogus = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false, dconfProgram: "/nonexistent/dconf")
        let spawnError = await #expect(throws: SettingsBackendError.self) { try await bogus.apply([invert: .bool(false)]) }
        #expect(spawnError?.kind == .writeFailed)
        #expect(spawnError?.message.contains("/nonexistent/dconf update") == true)
    }

    @Test func baselineIsLockedOutsideASessionAndComesBackAfterIt() async throws {
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: true)
        let baseline = backend.schemaDefaults(of: [invert, magFactor, screenReader, SettingKey(schema: magnifier, key: "no-such-key")])
        #expect(baseline == [invert: .bool(false), magFactor: .double(2), screenReader: .bool(false)])
        try backend.lockBaseline(baseline)
        #expect(backend.baseline == baseline)
        #expect(backend.imposed.isEmpty)
        #expect(try writable(invert) == "false")
        #expect(try gsettings("set", magnifier, "invert-lightness", "true").status != 0)
        #expect(try get(invert) == "false")

        // What the service does: snapshot, write, restore the snapshot. The
        // session layer imposed nothing before, and its value wins over the
        // baseline while it lasts.
        let before = try backend.userValue(of: invert)
        #expect(before == nil)
        try await backend.apply([invert: .bool(true), magFactor: .double(3)])
        #expect(try get(invert) == "true")
        #expect(try get(magFactor) == "3.0")
        try await backend.apply([invert: before, magFactor: nil])
        #expect(try get(invert) == "false")
        #expect(try get(magFactor) == "2.0")
        #expect(try writable(invert) == "false")
        #expect(try writable(magFactor) == "false")
        #expect(backend.imposed.isEmpty)

        // A restarted service reads both layers back.
        let restarted = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: true)
        #expect(restarted.baseline == baseline)
        #expect(restarted.imposed.isEmpty)
    }

    @Test func turningLockOutsideSessionOffRemovesTheBaselineButNotASession() async throws {
        let locked = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: true)
        try locked.lockBaseline(locked.schemaDefaults(of: [invert, magFactor]))
        try await locked.apply([magFactor: .double(4)])  // a session, resumed after the restart below
        #expect(try writable(invert) == "false")

        let unlocked = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        #expect(unlocked.imposed == [magFactor: .double(4)])
        try unlocked.lockBaseline(unlocked.schemaDefaults(of: [invert, magFactor]))
        #expect(unlocked.baseline.isEmpty)
        #expect(!FileManager.default.fileExists(atPath: unlocked.baselineKeyfilePath))
        #expect(!FileManager.default.fileExists(atPath: unlocked.baselineLocksPath))
        #expect(try writable(invert) == "true")
        #expect(try get(magFactor) == "4.0")
        #expect(try writable(magFactor) == "false")
        try await unlocked.apply([magFactor: nil])
        #expect(try writable(magFactor) == "true")

        // Without LockOutsideSession from the start, nothing is imposed.
        let never = try DconfBackend(databaseDir: dconf.root + "/db2", databaseName: "guidedaccess", lockOutsideSession: false)
        try never.lockBaseline(never.schemaDefaults(of: [invert]))
        #expect(never.baseline.isEmpty)
        #expect(never.imposed.isEmpty)
    }

    @Test func anotherBrokenDatabaseOfTheDirectoryDoesNotFailOurs() async throws {
        // An administrator's database beside ours, with a typo in it.
        try FileManager.default.createDirectory(atPath: databaseDir + "/local.d", withIntermediateDirectories: true)
        try "[org/gnome/desktop/a11y/magnifier\nmag-factor=9.0\n".write(
            toFile: databaseDir + "/local.d/00-site", atomically: true, encoding: .utf8)
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        let warnings = Warnings()
        backend.onWarning = { warnings.add($0) }
        try await backend.apply([magFactor: .double(4)])
        #expect(try get(magFactor) == "4.0")
        #expect(try writable(magFactor) == "false")
        #expect(warnings.all.count == 1)
        #expect(warnings.all.first?.contains(databaseDir + "/local.d: ") == true)

        // Our own broken keyfile is still an error.
        try "[org/gnome/desktop/a11y/magnifier\n".write(
            toFile: backend.keyfileDirectory + "/60-broken", atomically: true, encoding: .utf8)
        let error = await #expect(throws: SettingsBackendError.self) { try await backend.apply([magFactor: .double(5)]) }
        #expect(error?.message.contains("guidedaccess.d") == true)
        #expect(try get(magFactor) == "4.0")
    }

    @Test func startUpRebuildsWhatACrashLeftBetweenTheFilesAndDconfUpdate() async throws {
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        try await backend.apply([magFactor: .double(3)])
        // As if a later apply had written its keyfile and died before `dconf update`.
        let text = try String(contentsOfFile: backend.keyfilePath, encoding: .utf8)
        try text.replacingOccurrences(of: "mag-factor=3.0", with: "mag-factor=6.0")
            .write(toFile: backend.keyfilePath, atomically: true, encoding: .utf8)
        #expect(try get(magFactor) == "3.0")

        let restarted = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        #expect(restarted.imposed == [magFactor: .double(6)])
        try restarted.lockBaseline(restarted.schemaDefaults(of: [magFactor]))
        #expect(try get(magFactor) == "6.0")
        #expect(try writable(magFactor) == "false")
    }

    @Test func temporaryFilesAreDotFilesThatDconfSkips() async throws {
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: true)
        try backend.lockBaseline(backend.schemaDefaults(of: [invert]))
        try await backend.apply([magFactor: .double(3)])
        let names = try FileManager.default.contentsOfDirectory(atPath: backend.keyfileDirectory).sorted()
        #expect(names == ["40-guidedaccess-baseline", "50-guidedaccess", "locks"])
        // A leftover of a crash mid-write neither counts nor stays.
        try "garbage".write(toFile: backend.keyfileDirectory + "/.50-guidedaccess.tmp", atomically: true, encoding: .utf8)
        try await backend.apply([magFactor: .double(4)])
        #expect(try get(magFactor) == "4.0")
        let restarted = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: true)
        try restarted.lockBaseline(restarted.schemaDefaults(of: [invert]))
        #expect(!exists(backend.keyfileDirectory + "/.50-guidedaccess.tmp"))
        #expect(try get(magFactor) == "4.0")
    }

    @Test func aBaselineKeyTheSchemasNoLongerHaveDoesNotStopStartUp() throws {
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: true)
        try backend.lockBaseline(backend.schemaDefaults(of: [invert]))
        // As after an upgrade that dropped a key.
        let text = try String(contentsOfFile: backend.baselineKeyfilePath, encoding: .utf8)
        try (text + "no-such-key=true\n").write(toFile: backend.baselineKeyfilePath, atomically: true, encoding: .utf8)
        let restarted = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: true)
        #expect(restarted.baseline == [invert: .bool(false)])
        try restarted.lockBaseline(restarted.schemaDefaults(of: [invert]))
        #expect(try !String(contentsOfFile: backend.baselineKeyfilePath, encoding: .utf8).contains("no-such-key"))
    }

    @Test func applyTiming() async throws {
        let backend = try DconfBackend(databaseDir: databaseDir, databaseName: "guidedaccess", lockOutsideSession: false)
        var micros: [Double] = []
        for i in 0..<50 {
            let start = DispatchTime.now().uptimeNanoseconds
            try await backend.apply([invert: .bool(i % 2 == 0), magFactor: .double(Double(2 + i % 3))])
            micros.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
        }
        micros.sort()
        print("DconfBackend apply (files + dconf update) over 50: p50 \(Int(micros[25])) µs, p90 \(Int(micros[45])) µs, max \(Int(micros[49])) µs")
        // The last apply is what gsettings reads.
        #expect(try get(invert) == "false")
        #expect(try get(magFactor) == "3.0")
    }
}

final class Warnings: @unchecked Sendable {
    private var lines: [String] = []
    func add(_ line: String) { lines.append(line) }
    var all: [String] { lines }
}
