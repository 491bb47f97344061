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
    @Test func aJournaledPidIsAdoptedOnlyWithTheTokenItWasStartedWith() throws {
        let loop = EventLoop()
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
        func adopt(pid: Int32 = pid, startTime: UInt64 = startTime, token: String) -> Bool {
            WatchedProcess(adopting: .process(pid: pid, startTime: startTime, bootID: bootID, token: token), loop: loop) != nil
        }
        #expect(adopt(token: token))
        #expect(!adopt(token: token + "0"))
        #expect(!adopt(token: ""))
        #expect(!adopt(startTime: startTime + 1, token: token))
        // This test's own process: the right start time, no token.
        let own = try #require(ProcessTable.startTime(of: getpid()))
        #expect(!adopt(pid: getpid(), startTime: own, token: token))
    }
}
