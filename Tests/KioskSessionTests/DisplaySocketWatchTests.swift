import DBus
import Glibc
import Synchronization
import Testing

@testable import KioskSession

@Suite struct DisplaySocketWatchTests {
    /// X<digits> (in /tmp/.X11-unix, which every user may write), and
    /// wayland-NAME but not its lock, as SessionProbe finds displays.
    @Test func onlyXDigitsAndWaylandNamesAreDisplaySocketNames() {
        for name in ["X0", "X12", "wayland-0", "wayland-17", "wayland-kiosk"] {
            #expect(DisplaySocketWatch.isDisplayName(Substring(name)), "\(name)")
        }
        for name in ["X", "Xfoo", "X1.lock", "X1a", ".X0-lock", "wayland-", "wayland-0.lock", "x1", "XX1", "X12345678901"] {
            #expect(!DisplaySocketWatch.isDisplayName(Substring(name)), "\(name)")
        }
    }

    /// /tmp/.X11-unix made after the service started (the X server came
    /// later) is watched from then on; other names there do not count; a
    /// churn of display names is reported a few times a second at most.
    /// The pause is stretched to 1 s here, so that "at once" and "after a
    /// pause" stay apart on a loaded machine.
    @Test func aDirectoryMadeAfterTheStartIsWatchedAndAChurnIsCoalesced() throws {
        let loop = EventLoop.spawn()
        var template = Array("/tmp/ga-watch-XXXXXX".utf8CString)
        let root = String(cString: try #require(mkdtemp(&template)))
        defer { _ = system("rm -rf '\(root)'") }
        let directory = root + "/.X11-unix"
        let calls = Mutex(0)
        let watch = try #require(
            DisplaySocketWatch(directories: [directory], loop: loop, pause: .seconds(1)) { calls.withLock { $0 += 1 } })
        func count() -> Int { calls.withLock { $0 } }
        func waitFor(_ n: Int, seconds: Double) -> Bool {
            for _ in 0..<Int(seconds * 100) {
                if count() >= n { return true }
                usleep(10_000)
            }
            return count() >= n
        }
        func touch(_ name: String) { close(open(directory + "/" + name, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)) }

        #expect(mkdir(directory, 0o1777) == 0)
        #expect(waitFor(1, seconds: 2), "the directory's coming was not seen")
        usleep(400_000)
        touch("not-a-display")
        touch("X1.lock")
        // Past the pause those two may have begun, and a pause's length
        // after the wake that ends it: X42 then comes to a watch at rest.
        usleep(2_200_000)
        #expect(count() == 1, "names that are not display sockets counted")
        touch("X42")
        #expect(waitFor(2, seconds: 2), "X42 was not seen in the directory made after the start")
        // A display's next step right after (Xwayland after the compositor):
        // seen at once, not after a pause.
        touch("X43")
        #expect(waitFor(3, seconds: 0.7), "X43, 0 s after X42, waited for a pause")

        usleep(1_200_000)
        let before = count()
        var start = timespec(), now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &start)
        var made = 0
        repeat {
            let name = "X\(9000 + made % 100)"
            touch(name)
            unlink(directory + "/" + name)
            made += 1
            clock_gettime(CLOCK_MONOTONIC, &now)
        } while now.tv_sec - start.tv_sec < 2
        usleep(1_200_000)
        let reported = count() - before
        // 2 s of churn with 1 s pauses: about 4 calls, not thousands.
        #expect(reported >= 2 && reported <= 8, "\(made) creations reported \(reported) times")
        withExtendedLifetime(watch) {}
    }
}
