import DBus
import Glibc
import Logging
import Testing

@testable import KioskSession

@Suite struct AdoptionTests {
    /// A journaled pid is adopted (and so may be stopped) only if it has
    /// the token the service put in the environment of the program it
    /// started: same pid and start time without it is another program, left
    /// alone, and so is a record of a journal without a token. The token
    /// survives the program's exec of another (a wrapper script).
    @Test func aJournaledPidIsAdoptedOnlyWithTheTokenItWasStartedWith() async throws {
        let loop = EventLoop.spawn()  // running: adoption may wait on its timer
        let child = try WatchedProcess(
            spawning: ["/bin/sh", "-c", "exec sleep 30"], environment: [:], name: "sleep", loop: loop, logger: Logger(label: "test"))
        defer {
            // Killed and reaped here: a zombie child makes swift-testing's
            // wait thread spin on waitid (and the test run never ends).
            child.send(SIGKILL)
            var status: Int32 = 0
            waitpid(child.pid, &status, 0)
        }
        guard case .process(let pid, let startTime, let bootID, let token) = child.record else {
            Issue.record("not a process record: \(child.record)")
            return
        }
        // After the exec: sleep, not sh, and still the token.
        for _ in 0..<100 where ProcessTable.name(of: pid) != "sleep" { usleep(10_000) }
        #expect(ProcessTable.name(of: pid) == "sleep")
        func adopt(pid: Int32 = pid, startTime: UInt64 = startTime, token: String) async -> Bool {
            await WatchedProcess(adopting: .process(pid: pid, startTime: startTime, bootID: bootID, token: token), loop: loop)
                != nil
        }
        #expect(await adopt(token: token))
        #expect(await !adopt(token: token + "0"))
        #expect(await !adopt(token: ""))
        #expect(await !adopt(startTime: startTime + 1, token: token))
        // This test's own process: the right start time, no token.
        let own = try #require(ProcessTable.startTime(of: getpid()))
        #expect(await !adopt(pid: getpid(), startTime: own, token: token))
    }

    /// A program caught in the middle of its exec has its new name but, for
    /// a moment, an empty `/proc/PID/environ` (the kernel reads it empty
    /// until the new image's stack is set up): it is still the program the
    /// service started, and adopted. Before, adoption read the environment
    /// once and left such a program alone (the test above failed so on a
    /// loaded CI). The moment is stretched here: a shell started with an
    /// empty environment waits on a FIFO, which is written 0.1 s after
    /// adoption has begun, then execs a sleep with the token.
    @Test func aProgramWhoseEnvironmentIsEmptyForAMomentIsAdoptedOnceItShowsTheToken() async throws {
        let loop = EventLoop.spawn()  // running: adoption may wait on its timer
        let token = "0123456789abcdef-fedcba9876543210"
        var template = Array("/tmp/ga-adopt-XXXXXX".utf8CString)
        let directory = String(cString: try #require(mkdtemp(&template)))
        defer { _ = system("rm -rf '\(directory)'") }
        let fifo = directory + "/go"
        try #require(mkfifo(fifo, 0o600) == 0)
        let child = try WatchedProcess(
            spawning: [
                "/usr/bin/env", "-i", "/bin/sh", "-c",
                "read x < \(fifo); export \(WatchedProcess.tokenVariable)=\(token); exec /bin/sleep 30",
            ], environment: [:], name: "sleep", loop: loop, logger: Logger(label: "test"))
        defer {
            child.send(SIGKILL)
            var status: Int32 = 0
            waitpid(child.pid, &status, 0)
        }
        guard case .process(let pid, let startTime, let bootID, _) = child.record else {
            Issue.record("not a process record: \(child.record)")
            return
        }
        for _ in 0..<500 where ProcessTable.name(of: pid) != "sh" { usleep(10_000) }
        #expect(WatchedProcess.environment(of: pid) == [])
        // The writer is a process of its own (a task could wait behind the
        // tests that hold the pool's threads).
        #expect(system("(sleep 0.1; echo go > \(fifo)) &") == 0)
        let record = ProgramRecord.process(pid: pid, startTime: startTime, bootID: bootID, token: token)
        #expect(await WatchedProcess(adopting: record, loop: loop) != nil)
        #expect(ProcessTable.name(of: pid) == "sleep")
    }
}
