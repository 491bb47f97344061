import Foundation
import Glibc

/// A private session bus with real dconf behind it: its own dbus-daemon (which
/// activates /usr/libexec/dconf-service from the system's service files) and
/// its own HOME, XDG_CONFIG_HOME and XDG_RUNTIME_DIR, so the user's database
/// under test is `ROOT/config/dconf/user`. The daemon gets the same
/// environment, and dconf-service inherits it. The daemon is stopped when
/// this is released; dconf-service exits with its bus.
public final class PrivateDconf: Sendable {
    public let root: String
    /// What programs run with: the private directories and bus, the
    /// system's schemas, and nothing else of this process's environment.
    public let environment: [String: String]
    private let daemon: pid_t

    /// `extra` is added to the environment of the daemon and of every program run.
    public init(environment extra: [String: String] = [:]) throws {
        // Short: a unix socket path has to fit in 108 bytes.
        var template = Array("/tmp/dconf-tests-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw TestSupportError("mkdtemp failed: errno \(errno)") }
        root = String(cString: dir)
        let files = FileManager.default
        for dir in ["home", "config", "runtime"] {
            try files.createDirectory(
                atPath: root + "/" + dir, withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])
        }
        try """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <type>session</type>
          <listen>unix:path=\(root)/bus</listen>
          <auth>EXTERNAL</auth>
          <servicedir>/usr/share/dbus-1/services</servicedir>
          <policy context="default">
            <allow send_destination="*" eavesdrop="true"/>
            <allow eavesdrop="true"/>
            <allow receive_sender="*"/>
            <allow own="*"/>
          </policy>
        </busconfig>
        """.write(toFile: root + "/bus.conf", atomically: true, encoding: .utf8)

        var env: [String: String] = [
            "HOME": root + "/home",
            "XDG_CONFIG_HOME": root + "/config",
            "XDG_RUNTIME_DIR": root + "/runtime",
            "XDG_CACHE_HOME": root + "/home/.cache",
            "DBUS_SESSION_BUS_ADDRESS": "unix:path=\(root)/bus",
            "GSETTINGS_BACKEND": "dconf",
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
        ]
        // Where the schemas are.
        if let dataDirs = ProcessInfo.processInfo.environment["XDG_DATA_DIRS"] {
            env["XDG_DATA_DIRS"] = dataDirs
        }
        env.merge(extra) { $1 }
        environment = env

        // The daemon prints its address once it listens.
        let addressFile = root + "/address"
        daemon = try Self.spawn(
            "/usr/bin/dbus-daemon", ["--config-file=\(root)/bus.conf", "--nofork", "--print-address=1"],
            environment: env, stdout: addressFile, stderr: root + "/daemon.log")
        for _ in 0..<500 {
            if let text = try? String(contentsOfFile: addressFile, encoding: .utf8), text.contains("\n") { return }
            usleep(10_000)
        }
        throw TestSupportError("dbus-daemon did not start (\(root)/daemon.log)")
    }

    deinit {
        // dconf-service exits when its bus goes away.
        kill(daemon, SIGTERM)
        var status: Int32 = 0
        waitpid(daemon, &status, 0)
        try? FileManager.default.removeItem(atPath: root)
    }

    public struct Output: Sendable {
        public let status: Int32
        public let stdout: String
        public let stderr: String
        /// stdout split into lines, without the final empty one.
        public var lines: [String] {
            stdout.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init)
        }
    }

    /// Runs a program in the private environment (plus `extra`).
    public func run(_ program: String, _ arguments: [String], extra: [String: String] = [:]) throws -> Output {
        let id = UUID().uuidString
        let outPath = root + "/out-" + id
        let errPath = root + "/err-" + id
        let pid = try Self.spawn(
            program, arguments, environment: environment.merging(extra) { $1 }, stdout: outPath, stderr: errPath)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        let output = Output(
            status: (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f),
            stdout: try String(contentsOfFile: outPath, encoding: .utf8),
            stderr: try String(contentsOfFile: errPath, encoding: .utf8))
        if !output.stderr.isEmpty {
            // Shown with the test's output, like the daemon logs of power-profiles-daemon's tests.
            print("[\(URL(fileURLWithPath: program).lastPathComponent) stderr] \(output.stderr)")
        }
        return output
    }

    /// `gsettings get SCHEMA KEY`, trimmed.
    public func gsettingsGet(_ schema: String, _ key: String) throws -> String {
        try run("/usr/bin/gsettings", ["get", schema, key]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `dconf read PATH`, trimmed: empty when the key is unset.
    public func dconfRead(_ path: String) throws -> String {
        try run("/usr/bin/dconf", ["read", path]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// posix_spawn with an empty signal mask and default signal handling. Not
    /// Foundation's Process: it spawns with the calling thread's mask, in which
    /// SIGTERM can be blocked, and then neither dbus-daemon nor dconf-service
    /// (which raises SIGTERM on itself when its bus closes) ever exits.
    private static func spawn(
        _ program: String, _ arguments: [String], environment: [String: String], stdout: String, stderr: String
    ) throws -> pid_t {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdout, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, stderr, O_WRONLY | O_CREAT | O_TRUNC, 0o600)

        let argv = ([program] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, program, &actions, &attributes, argv, envp)
        guard result == 0 else { throw TestSupportError("cannot start \(program): \(String(cString: strerror(result)))") }
        return pid
    }
}
