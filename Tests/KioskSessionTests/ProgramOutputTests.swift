import DBus
import Glibc
import Logging
import Synchronization
import Testing

@testable import KioskSession

/// What a program the service started writes is logged as that program's,
/// line by line, bounded — never passed through as the service's own lines.
@Suite struct ProgramOutputTests {
    /// Records what is logged.
    struct Recorder: LogHandler {
        let box: Box
        var logLevel: Logger.Level = .trace
        var metadata: Logger.Metadata = [:]
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(
            level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String, file: String,
            function: String, line: UInt
        ) {
            box.lines.withLock { $0.append((level, message.description)) }
        }
    }

    final class Box: Sendable {
        let lines = Mutex<[(Logger.Level, String)]>([])
        var logger: Logger { Logger(label: "test") { _ in Recorder(box: self) } }
        func logged() -> [(Logger.Level, String)] { lines.withLock { $0 } }
    }

    private func run(_ script: String, name: String, until done: ([(Logger.Level, String)]) -> Bool) throws -> (Int32, [(Logger.Level, String)]) {
        let loop = EventLoop.spawn()
        let box = Box()
        let child = try WatchedProcess(
            spawning: ["/bin/sh", "-c", script], environment: ["PATH": "/usr/bin:/bin"], name: name, loop: loop,
            logger: box.logger)
        // Until the program has exited and its lines are in (the loop's
        // thread reads them; on a loaded machine it may lag), then a moment
        // more in which an extra line would show.
        var status: Int32 = 0
        waitpid(child.pid, &status, 0)
        let deadline = ContinuousClock.now + .seconds(5)
        while !done(box.logged()), ContinuousClock.now < deadline { usleep(10_000) }
        usleep(200_000)
        return (child.pid, box.logged())
    }

    /// stdout and stderr, each line labelled with the program and its pid,
    /// at info: a traceback at shutdown is not a warning of the service.
    @Test func eachLineIsLoggedAsTheProgramsAtInfo() throws {
        let (pid, logged) = try run("echo 'Screen reader on.'; echo 'Traceback (most recent call last):' >&2; printf 'no newline'", name: "orca") {
            $0.count >= 3
        }
        #expect(logged.map(\.1) == ["orca[\(pid)]: Screen reader on.", "orca[\(pid)]: Traceback (most recent call last):", "orca[\(pid)]: no newline"])
        #expect(logged.allSatisfy { $0.0 == .info })
    }

    /// A flood is drained (the program is never held up) and logged up to
    /// 100 lines per 10 s; a line over 1,000 bytes is cut.
    @Test func aFloodIsDrainedAndBoundedAndALongLineIsCut() throws {
        let started = Glibc.time(nil)
        let (pid, logged) = try run(
            "head -c 3000 /dev/zero | tr '\\0' x; echo; i=0; while [ $i -lt 5000 ]; do echo line $i; i=$((i+1)); done; echo last",
            name: "chatty"
        ) { $0.count >= ProgramOutput.linesPerWindow }
        #expect(Glibc.time(nil) - started < 8, "the program was held up by its output")
        #expect(logged.count == ProgramOutput.linesPerWindow, "\(logged.count) lines logged")
        let first = logged.first?.1 ?? ""
        #expect(first.hasPrefix("chatty[\(pid)]: xxxx") && first.hasSuffix("…") && first.utf8.count < 1100, "\(first.prefix(80))")
    }
}
