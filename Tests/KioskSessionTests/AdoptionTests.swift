import DBus
import Glibc
import Testing

@testable import KioskSession

@Suite struct AdoptionTests {
    /// A journaled pid is adopted (and so may be stopped) only if it still
    /// runs the executable it was started with: same pid, same start time
    /// and another executable is another program, left alone; a record of
    /// a journal without the executable is not adopted either.
    @Test func aJournaledPidIsAdoptedOnlyWithTheSameExecutable() throws {
        let loop = EventLoop()
        let pid = getpid()
        let startTime = try #require(ProcessTable.startTime(of: pid))
        let executable = try #require(WatchedProcess.executable(of: pid))
        func adopt(_ executable: String) -> Bool {
            WatchedProcess(
                adopting: .process(pid: pid, startTime: startTime, bootID: ProcessTable.bootID, executable: executable),
                loop: loop) != nil
        }
        #expect(adopt(executable))
        #expect(!adopt("/usr/bin/orca"))
        #expect(!adopt(""))
        #expect(
            WatchedProcess(
                adopting: .process(pid: pid, startTime: startTime + 1, bootID: ProcessTable.bootID, executable: executable),
                loop: loop) == nil)
    }
}
