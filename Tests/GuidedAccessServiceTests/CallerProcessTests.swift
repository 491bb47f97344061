import CProcess
import Foundation
import Glibc
import GuidedAccessCore
import Testing

@testable import GuidedAccessService

/// What /proc says about a caller's process, with real processes.
@Suite struct CallerProcessTests {
    /// A process running `argv`, killed and reaped at the end of the test.
    final class Child {
        let process = Process()
        var pid: UInt32 { UInt32(process.processIdentifier) }

        init(_ argv: [String]) throws {
            process.executableURL = URL(fileURLWithPath: argv[0])
            process.arguments = Array(argv.dropFirst())
            try process.run()
        }

        func killAndReap() {
            guard process.isRunning else { return }
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }

        deinit { killAndReap() }
    }

    /// Waits until the child has exec'd `program` (`setpriv` execs it in place).
    func settled(_ child: Child, running program: String) throws -> CallerProcess {
        for _ in 0..<200 {
            // Read again once it runs the program: the first reading may
            // have read `status` before the exec and `exe` after it.
            if CallerProcess(pid: child.pid)?.executable?.isFile(at: program) == true,
                let process = CallerProcess(pid: child.pid)
            {
                return process
            }
            usleep(10_000)
        }
        throw CancellationError()
    }

    @Test func theStartTimeIsField22AfterACommandNameWithSpacesAndParentheses() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10"
        #expect(CallerProcess.startTicks(fromStat: ArraySlice(stat.utf8)) == 987_654)
        #expect(CallerProcess.startTicks(fromStat: ArraySlice("4242 (short) S 1 2".utf8)) == nil)
        #expect(CallerProcess.startTicks(fromStat: ArraySlice(stat.replacing("987654", with: "98765x").utf8)) == nil)
    }

    @Test func theUidIsTheEffectiveOne() {
        let status = "Name:\tsudo\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n"
        #expect(CallerProcess.effectiveUID(fromStatus: ArraySlice(status.utf8)) == 0)
        #expect(CallerProcess.effectiveUID(fromStatus: ArraySlice("Name:\tx\n".utf8)) == nil)
        #expect(CallerProcess.effectiveUID(fromStatus: ArraySlice("Uid:\t1\t4294967296\t0\t0\n".utf8)) == nil)
    }

    @Test func aProcessIsReadWithItsProgramAsAFile() throws {
        let child = try Child(["/bin/sleep", "30"])
        let process = try settled(child, running: "/bin/sleep")
        #expect(process.effectiveUID == geteuid())
        #expect(process.executable?.path == String(cString: realpath("/bin/sleep", nil)))
        #expect(process.executable?.isFile(at: "/usr/bin/env") == false)
    }

    @Test(.enabled(if: geteuid() == 0, "needs root to run a process as nobody"))
    func aProcessOfAnotherUserShowsThatUser() throws {
        let child = try Child(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sleep", "30"])
        let process = try settled(child, running: "/bin/sleep")
        #expect(process.effectiveUID == 65534)
    }

    @Test func aProcessStartedAfterAMomentDidNotStartBeforeIt() throws {
        let before = ConnectionAges.now()
        usleep(30_000)  // more than /proc's tick of 1/100 s
        let child = try Child(["/bin/sleep", "30"])
        let process = try #require(CallerProcess(pid: child.pid))
        #expect(!process.started(before: before))
        #expect(process.started(before: ConnectionAges.now()))
    }

    @Test func readsThroughTheProcDirectoryFailOnceItsProcessIsGone() throws {
        // So a pid given to another process meanwhile is never read as this one.
        let child = try Child(["/bin/sleep", "30"])
        let directory = try #require(ProcDirectory(pid: child.pid))
        let first = try #require(CallerProcess(directory))
        // Read again with the start time known (a connection's process,
        // kept between its calls): the same facts.
        #expect(CallerProcess(directory, startTicks: first.startTicks) == first)
        child.killAndReap()
        #expect(CallerProcess(directory) == nil)
        #expect(CallerProcess(directory, startTicks: first.startTicks) == nil)
    }

    @Test func aPidFDNamesItsProcessUntilItIsReaped() throws {
        let child = try Child(["/bin/sleep", "30"])
        let pidFD = ConnectionPidFD(adopting: ga_pidfd_open(pid_t(child.pid)))
        #expect(pidFD.pid == child.pid)
        #expect(pidFD.isAlive)
        child.killAndReap()
        #expect(pidFD.pid == nil)
        #expect(!pidFD.isAlive)
    }

    @Test func aConnectionKeepsTheFirstDateItWasGiven() {
        var ages = ConnectionAges(capacity: 4)
        ages.noteAppeared(":1.5", atBoottime: 100)
        ages.noteAppeared(":1.5", atBoottime: 200)
        #expect(ages.appearance(of: ":1.5") == 100)
        ages.noteLeft(":1.5")
        #expect(ages.appearance(of: ":1.5") == nil)
    }

    @Test func whenFullNewConnectionsGoUndatedNotOldOnes() {
        var ages = ConnectionAges(capacity: 2)
        for n in 1...3 { ages.noteAppeared(":1.\(n)", atBoottime: UInt64(n)) }
        #expect(ages.count == 2)
        #expect(ages.appearance(of: ":1.1") == 1)
        #expect(ages.appearance(of: ":1.3") == nil)
    }
}
