import DBus
import Foundation
import Glibc
import GuidedAccessCore
import Testing

@testable import KioskSession

@Suite struct X11Tests {
    // MARK: The compositor's shader and arguments

    /// Exactly the features on: grayscale by Rec. 709 luma, inversion
    /// 1 − value (premultiplied), grayscale first when both; nothing of a
    /// system picom.conf.
    @Test func theShaderDoesExactlyTheFeaturesOn() {
        let luma = "dot(c.rgb, vec3(0.2126, 0.7152, 0.0722))"
        let gray = X11CompositorDriver.shader([.grayscale]), invert = X11CompositorDriver.shader([.invertColors])
        let both = X11CompositorDriver.shader([.grayscale, .invertColors])
        // One inversion is picom's own, for its inversion rules (none given).
        func inversions(_ shader: String) -> Int { shader.ranges(of: "c.rgb = c.a - c.rgb;").count }
        #expect(gray.contains(luma) && inversions(gray) == 1)
        #expect(!invert.contains(luma) && inversions(invert) == 2)
        let grayAt = both.firstRange(of: luma), invertAt = both.firstRange(of: "c.rgb = c.a - c.rgb;")
        #expect(grayAt != nil && invertAt != nil && grayAt!.lowerBound < invertAt!.lowerBound)
        let arguments = X11CompositorDriver.arguments([.grayscale])
        #expect(Array(arguments.prefix(5)) == ["--config", "/dev/null", "--backend", "glx", "--glx-fshader-win"])
        #expect(arguments.last == gray)
    }

    // MARK: The journal

    @Test func aRecordKeepsTheRunAndItsFeaturesAndRefusesOthers() throws {
        let unit = ProgramKind.compositor.unitName(pid: 4242, run: 2)
        #expect(unit == "guidedaccess-compositor-4242-2.service")
        let good = JSON.object([("unit", .string(unit)), ("features", .array([.string("grayscale"), .string("invert-colors")]))])
        let (run, features) = try X11CompositorDriver.run(of: good, owner: .service)
        #expect(run == .unit(unit) && features == [.grayscale, .invertColors])
        let bad: [JSON] = [
            // Another program's unit, the agent's, a feature picom does not do, no features.
            .object([("unit", .string("guidedaccess-screen-reader-4242-2.service")), ("features", .array([]))]),
            .object([("unit", .string(ProgramKind.compositor.unitName(pid: 1, run: 1, owner: .agent))), ("features", .array([]))]),
            .object([("unit", .string(unit)), ("features", .array([.string("zoom")]))]),
            .object([("unit", .string(unit))]),
        ]
        for record in bad {
            #expect(throws: DriverRecordError.self, "\(record)") { try X11CompositorDriver.run(of: record, owner: .service) }
        }
    }

    // MARK: GTK's settings through XSETTINGS

    /// Every setting written — one off goes back to GTK's value from
    /// before, since GTK keeps a setting that disappears — but the DPI,
    /// which GTK does undo.
    @Test func theSettingsFileHoldsTheFeaturesOnAndGTKsValuesForTheRest() {
        let before = GTKDefaults(theme: "Kiosk-Blue", animations: false)
        #expect(X11SettingsDriver.settings([], textScale: 1.5, defaults: before)
            == "Net/ThemeName \"Kiosk-Blue\"\nGtk/EnableAnimations 0\n")
        #expect(X11SettingsDriver.settings([.highContrast, .largeText, .reduceMotion], textScale: 1.25, defaults: GTKDefaults())
            == "Net/ThemeName \"HighContrast\"\nGtk/EnableAnimations 0\nXft/DPI 122880\n")
        #expect(X11SettingsDriver.settings([.largeText], textScale: 2, defaults: GTKDefaults())
            == "Net/ThemeName \"Adwaita\"\nGtk/EnableAnimations 1\nXft/DPI 196608\n")
    }

    /// settings.ini's `[Settings]` keys, a later file winning; a theme the
    /// file could not quote is left out; other groups do not count.
    @Test func gtksValuesFromBeforeComeFromItsSettingsFiles() {
        var defaults = GTKDefaults()
        defaults.apply(ini: "[Settings]\ngtk-theme-name = Kiosk\ngtk-enable-animations=false\n[Other]\ngtk-theme-name=No\n")
        #expect(defaults == GTKDefaults(theme: "Kiosk", animations: false))
        defaults.apply(ini: "[Settings]\ngtk-theme-name=Bad\"Name\ngtk-enable-animations = 1")
        #expect(defaults == GTKDefaults(theme: "Kiosk", animations: true))
        #expect(GTKDefaults(environment: ["XDG_CONFIG_HOME": "/nonexistent", "XDG_CONFIG_DIRS": "/nonexistent"]) == GTKDefaults()
            || access("/etc/gtk-3.0/settings.ini", F_OK) == 0)
    }

    // MARK: Finding the display

    @Test func displayNumbers() {
        #expect(X11Display.displayNumber(":0") == 0)
        #expect(X11Display.displayNumber(":12.0") == 12)
        #expect(X11Display.displayNumber("unix:3") == 3)
        for remote in ["host:0", "", ":", ":x", "localhost:10.0"] { #expect(X11Display.displayNumber(remote) == nil, "\(remote)") }
    }

    /// The cookie of a local entry for the display (or any display), this
    /// host's first; never one of another display or another scheme.
    @Test func theCookieIsTheLocalEntryForTheDisplay() {
        func entry(_ family: Int, _ address: [UInt8], _ number: String, _ name: String, _ data: [UInt8]) -> [UInt8] {
            func field(_ bytes: [UInt8]) -> [UInt8] { [UInt8(bytes.count >> 8), UInt8(bytes.count & 0xff)] + bytes }
            return [UInt8(family >> 8), UInt8(family & 0xff)] + field(address) + field(Array(number.utf8))
                + field(Array(name.utf8)) + field(data)
        }
        var host = [CChar](repeating: 0, count: 256)
        gethostname(&host, 255)
        let hostname = Array(host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) })
        let a = [UInt8](repeating: 0xaa, count: 16), b = [UInt8](repeating: 0xbb, count: 16), c = [UInt8](repeating: 0xcc, count: 16)
        let file = entry(256, hostname, "1", "MIT-MAGIC-COOKIE-1", a)  // another display
            + entry(0, [127, 0, 0, 1], "0", "MIT-MAGIC-COOKIE-1", c)  // over TCP
            + entry(256, Array("other".utf8), "0", "MIT-MAGIC-COOKIE-1", c)  // another host's name
            + entry(256, hostname, "0", "XDM-AUTHORIZATION-1", a)
            + entry(256, hostname, "0", "MIT-MAGIC-COOKIE-1", b)
        #expect(Xauthority.cookie(in: file, display: 0) == b)
        #expect(Xauthority.cookie(in: file, display: 1) == a)
        #expect(Xauthority.cookie(in: file, display: 2) == nil)
        // A host renamed since the file was written: its local entry still serves.
        #expect(Xauthority.cookie(in: entry(256, Array("other".utf8), "0", "MIT-MAGIC-COOKIE-1", c), display: 0) == c)
        // Cut short: what was read whole still counts, nothing past it.
        #expect(Xauthority.cookie(in: Array(file.dropLast(3)), display: 0) == c)
    }

    /// The lowest-numbered X socket that answers and whose server is this
    /// user's; files that are not listening sockets are passed over.
    @Test func theUsersXServerIsTheLowestNumberedSocketThatAnswers() throws {
        let directory = try temporaryDirectory()
        defer { _ = system("rm -rf '\(directory)'") }
        close(open(directory + "/X1", O_CREAT | O_WRONLY | O_CLOEXEC, 0o600))  // a stale file, no server
        let listening = [try listen(at: directory + "/X7"), try listen(at: directory + "/X12")]
        defer { listening.forEach { close($0) } }
        let found = try #require(SessionProbe.x11Server(for: getuid(), in: directory))
        #expect(found.display == ":7" && found.pid == getpid())
        // Another user's session: only a server of root's would do (a display manager's Xorg).
        #expect(SessionProbe.x11Server(for: getuid() &+ 4242, in: directory)?.display == (getuid() == 0 ? ":7" : nil))
    }

    // MARK: An X server that does not answer

    /// A socket that accepts and never answers holds the question up for
    /// the bound, not longer; one that hangs up is an error at once.
    @Test func aSilentXServerCostsTheBoundAndOneThatHangsUpNothing() async throws {
        let loop = EventLoop.spawn()
        let directory = try temporaryDirectory()
        defer { _ = system("rm -rf '\(directory)'") }
        let server = try listen(at: directory + "/X5")
        defer { close(server) }
        let started = X11Display.now()
        await #expect(throws: X11Error.self) {
            try await X11Display.facts(
                of: ":5", xauthority: nil, loop: loop, within: .milliseconds(300), socketDirectory: directory)
        }
        let took = X11Display.now() - started
        // Parallel tests may keep this task waiting for a thread a while.
        #expect(took >= .milliseconds(290) && took < .seconds(10), "took \(took)")

        // The first connection waits in the backlog (closed by now); the
        // second hangs up. On a thread of its own: accept blocks.
        let hangUp = Thread {
            for _ in 0..<2 {
                let peer = accept(server, nil, nil)
                if peer >= 0 { close(peer) }
            }
        }
        hangUp.start()
        let second = X11Display.now()
        do {
            _ = try await X11Display.facts(of: ":5", xauthority: nil, loop: loop, within: .seconds(5), socketDirectory: directory)
            Issue.record("an X server that hung up gave facts")
        } catch {
            #expect(error.description.contains("closed"), "\(error)")
        }
        #expect(X11Display.now() - second < .seconds(4), "an X server that hung up was waited for")
        await #expect(throws: X11Error.self) {
            try await X11Display.facts(of: "remote:0", xauthority: nil, loop: loop, socketDirectory: directory)
        }
    }

    private func temporaryDirectory() throws -> String {
        var template = Array("/tmp/ga-x11-XXXXXX".utf8CString)
        return String(cString: try #require(mkdtemp(&template)))
    }

    private func listen(at path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        try #require(fd >= 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        try #require(bound == 0 && Glibc.listen(fd, 8) == 0)
        return fd
    }
}
