import CProcess
import DBus
import Glibc
import GuidedAccessCore

/// What /proc says about one process, every file read through one open
/// `/proc/PID` directory: once that process has been reaped and its pid
/// given to another, reads through the directory fail instead of reading
/// the other one, so all the facts are of one process. Whether that process
/// is the one that made a connection is for `identify` to show.
struct CallerProcess: Hashable {
    var pid: UInt32
    /// Clock ticks after boot (field 22 of `/proc/PID/stat`).
    var startTicks: UInt64
    /// The effective uid (the second field of `Uid:` in `/proc/PID/status`).
    var effectiveUID: UInt32
    var executable: Executable?
    var systemdUnit: String?

    /// nil when there is no such process (any more).
    init?(pid: UInt32) {
        let directory = open("/proc/\(pid)", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { return nil }
        defer { close(directory) }
        self.init(pid: pid, procDirectory: directory)
    }

    /// Read through `/proc/PID`, open as `directory`.
    init?(pid: UInt32, procDirectory directory: Int32) {
        guard let stat = ProcessInfo.readSmallFile("stat", relativeTo: directory),
            let start = Self.startTicks(fromStat: stat),
            let status = ProcessInfo.readSmallFile("status", relativeTo: directory),
            let uid = Self.effectiveUID(fromStatus: status)
        else { return nil }
        self.pid = pid
        startTicks = start
        effectiveUID = uid
        executable = Self.executable(in: directory)
        systemdUnit = ProcessInfo.readSmallFile("cgroup", relativeTo: directory)
            .flatMap(ProcessInfo.systemdUnit(fromCgroupFile:))
    }

    /// Whether it started before `time` (CLOCK_BOOTTIME, which /proc's start
    /// times count, in ticks of 1/100 s: a process started in the same tick
    /// as `time` counts as before).
    func started(before time: UInt64) -> Bool {
        startTicks * (1_000_000_000 / UInt64(sysconf(Int32(_SC_CLK_TCK)))) <= time
    }

    static func startTicks(fromStat text: String) -> UInt64? {
        // The fields after the command name, which may hold spaces and parentheses;
        // the first of them is field 3.
        guard let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        return fields.count > 19 ? UInt64(fields[19]) : nil
    }

    static func effectiveUID(fromStatus text: String) -> UInt32? {
        guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Uid:") }) else { return nil }
        let ids = line.dropFirst(4).split(whereSeparator: { $0 == "\t" || $0 == " " })  // real, effective, saved, fs
        return ids.count == 4 ? UInt32(ids[1]) : nil
    }

    /// The file `exe` links to, and the path the process's namespace shows it at.
    private static func executable(in directory: Int32) -> Executable? {
        var status = stat()
        guard fstatat(directory, "exe", &status, 0) == 0, let path = ProcessInfo.link("exe", relativeTo: directory)
        else { return nil }
        return Executable(path: path, file: FileIdentity(device: UInt64(status.st_dev), inode: UInt64(status.st_ino)))
    }
}

/// The pidfd a bus gives for a connection's process (`ProcessFD`, dbus ≥
/// 1.15.6): it refers to the process that connected and to no later one
/// with its pid. Closed with its last reference.
final class ConnectionPidFD: Sendable {
    let fd: Int32

    init(adopting fd: Int32) {
        self.fd = fd
    }

    deinit { close(fd) }

    /// Its pid in the service's pid namespace (`Pid:` of /proc/self/fdinfo);
    /// nil once the process has exited.
    var pid: UInt32? {
        guard let bytes = try? FileContents.read("/proc/self/fdinfo/\(fd)") else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Pid:") }) else { return nil }
        return UInt32(line.dropFirst(4).trimmingASCIIWhitespace)  // -1 once exited: nil
    }

    /// Whether the process has not been reaped: until then its pid is its own.
    var isAlive: Bool {
        let result = ga_pidfd_send_signal(fd, 0)
        return result == 0 || result == -EPERM
    }
}

/// When each unique name appeared on the bus (CLOCK_BOOTTIME), for
/// `identify` to check that the process at a connection's pid started
/// before the connection did — otherwise the pid was reused. Names already
/// there when the service began to follow the bus are dated then; a name
/// not known here cannot be dated. Bounded: when full, new names go
/// undated, never old ones.
struct ConnectionAges {
    let capacity: Int
    private var appeared: [String: UInt64] = [:]

    init(capacity: Int) {
        precondition(capacity > 0)
        self.capacity = capacity
    }

    var count: Int { appeared.count }

    /// The first date given for a name counts.
    mutating func noteAppeared(_ name: String, atBoottime time: UInt64) {
        guard appeared[name] == nil, appeared.count < capacity else { return }
        appeared[name] = time
    }

    mutating func noteLeft(_ name: String) {
        appeared[name] = nil
    }

    func appearance(of name: String) -> UInt64? { appeared[name] }

    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_BOOTTIME, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }
}
