import Foundation
import Glibc

/// A dbus-daemon of a test's own: a session-type bus on a socket in a new
/// temporary directory, with a policy that lets everyone send, receive and
/// own names. The directory is the test's to use for more files; the daemon
/// is killed and the directory removed when this is released.
public final class PrivateBus: @unchecked Sendable {
    public let address: String
    public let pid: pid_t
    public let directory: String

    public init(prefix: String = "dbus-tests") throws {
        var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw TestSupportError("mkdtemp failed: errno \(errno)") }
        directory = String(cString: dir)
        try """
            <busconfig>
              <type>session</type>
              <listen>unix:path=\(directory)/bus</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow send_destination="*" eavesdrop="true"/>
                <allow receive_sender="*"/>
                <allow own="*"/>
              </policy>
            </busconfig>
            """.write(toFile: directory + "/bus.conf", atomically: true, encoding: .utf8)
        let output = try Self.run(
            ["/usr/bin/dbus-daemon", "--config-file=\(directory)/bus.conf", "--fork", "--print-address=1", "--print-pid=1"],
            expectedLines: 2)
        let lines = output.split(separator: "\n")
        guard lines.count >= 2, let pid = pid_t(lines[1]) else { throw TestSupportError("dbus-daemon said: \(output)") }
        address = String(lines[0])
        self.pid = pid
    }

    deinit {
        kill(pid, SIGKILL)
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Starts a program with this process's environment; the caller reaps it.
    public static func spawn(_ argv: [String]) throws -> pid_t {
        var cArgs = argv.map { strdup($0) } + [nil]
        defer { cArgs.forEach { free($0) } }
        var child: pid_t = 0
        let rc = posix_spawn(&child, argv[0], nil, nil, &cArgs, environ)
        guard rc == 0 else { throw TestSupportError("cannot start \(argv[0]): \(String(cString: strerror(rc)))") }
        return child
    }

    /// Runs a program and returns its standard output, read until
    /// `expectedLines` lines have come (a forking daemon keeps the pipe open)
    /// or the pipe closes.
    public static func run(_ argv: [String], expectedLines: Int = .max) throws -> String {
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw TestSupportError("pipe failed: errno \(errno)") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 1)
        posix_spawn_file_actions_addclose(&actions, pipeFDs[0])
        var cArgs = argv.map { strdup($0) } + [nil]
        defer { cArgs.forEach { free($0) } }
        var child: pid_t = 0
        let rc = posix_spawn(&child, argv[0], &actions, nil, &cArgs, environ)
        posix_spawn_file_actions_destroy(&actions)
        close(pipeFDs[1])
        guard rc == 0 else {
            close(pipeFDs[0])
            throw TestSupportError("cannot start \(argv[0]): \(String(cString: strerror(rc)))")
        }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1024)
        while bytes.filter({ $0 == UInt8(ascii: "\n") }).count < expectedLines {
            let n = read(pipeFDs[0], &chunk, chunk.count)
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        close(pipeFDs[0])
        var status: Int32 = 0
        waitpid(child, &status, 0)
        return String(decoding: bytes, as: UTF8.self)
    }
}

public struct TestSupportError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
