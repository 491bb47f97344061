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
        guard let directory = ProcDirectory(pid: pid) else { return nil }
        self.init(directory)
    }

    /// Read through its `/proc/PID` directory, which the caller keeps open
    /// (a connection's process, read again at each call): `startTicks`
    /// given is not read again, as the directory pins the process. Read as
    /// bytes and parsed as bytes: every call a caller makes reads these
    /// files, and splitting them as Strings cost more than reading them.
    init?(_ process: ProcDirectory, startTicks known: UInt64? = nil) {
        let (pid, directory) = (process.pid, process.fd)
        var buffer = [UInt8](unsafeUninitializedCapacity: 4096) { _, count in count = 4096 }
        guard let start = known ?? Self.read("stat", in: directory, into: &buffer, Self.startTicks(fromStat:)),
            let uid = Self.read("status", in: directory, into: &buffer, Self.effectiveUID(fromStatus:))
        else { return nil }
        self.pid = pid
        startTicks = start
        effectiveUID = uid
        executable = Self.executable(in: directory)
        systemdUnit = Self.read("cgroup", in: directory, into: &buffer) { bytes in
            bytes.withUnsafeBufferPointer { ProcessInfo.systemdUnit(cgroupBytes: $0) }
        }
    }

    /// What `parse` makes of file `name` of `directory`, read into `buffer`
    /// (grown as needed, up to 1 MiB); nil when it cannot be read.
    private static func read<T>(
        _ name: String, in directory: Int32, into buffer: inout [UInt8], _ parse: (ArraySlice<UInt8>) -> T?
    ) -> T? {
        let fd = openat(directory, name, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var count = 0
        while true {
            if count == buffer.count {
                guard buffer.count < 1 << 20 else { break }
                buffer += repeatElement(0, count: buffer.count)
            }
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + count, $0.count - count) }
            if n < 0, errno == EINTR { continue }
            if n < 0 { return nil }
            if n == 0 { break }
            count += n
        }
        return parse(buffer[0..<count])
    }

    /// Whether it started before `time` (CLOCK_BOOTTIME, which /proc's start
    /// times count, in ticks of 1/100 s: a process started in the same tick
    /// as `time` counts as before).
    func started(before time: UInt64) -> Bool {
        startTicks * (1_000_000_000 / UInt64(sysconf(Int32(_SC_CLK_TCK)))) <= time
    }

    /// Field 22 of `/proc/PID/stat`. The fields after the command name,
    /// which may hold spaces and parentheses: the first of them is field 3.
    static func startTicks(fromStat bytes: ArraySlice<UInt8>) -> UInt64? {
        guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        var fields = bytes[(close + 1)...].split(separator: UInt8(ascii: " "), maxSplits: 21).dropFirst(19).makeIterator()
        return fields.next().flatMap(decimal)
    }

    /// The second field of `Uid:` in `/proc/PID/status`: real, effective, saved, fs.
    static func effectiveUID(fromStatus bytes: ArraySlice<UInt8>) -> UInt32? {
        // Plain loops over the bytes: read for every call a caller makes.
        bytes.withUnsafeBufferPointer { b -> UInt32? in
            let (tab, space) = (UInt8(ascii: "\t"), UInt8(ascii: " "))
            var start = 0
            while start < b.count {
                var end = start
                while end < b.count, b[end] != UInt8(ascii: "\n") { end += 1 }
                if end - start >= 4, b[start] == UInt8(ascii: "U"), b[start + 1] == UInt8(ascii: "i"),
                    b[start + 2] == UInt8(ascii: "d"), b[start + 3] == UInt8(ascii: ":")
                {
                    // Four whitespace-separated numbers; the second.
                    var ids = 0
                    var second: Range<Int>?
                    var index = start + 4
                    while index < end, ids < 5 {
                        while index < end, b[index] == tab || b[index] == space { index += 1 }
                        let from = index
                        while index < end, b[index] != tab, b[index] != space { index += 1 }
                        if index > from {
                            ids += 1
                            if ids == 2 { second = from..<index }
                        }
                    }
                    guard ids == 4, let second else { return nil }
                    return decimal(ArraySlice(UnsafeBufferPointer(rebasing: b[second]))).flatMap(UInt32.init(exactly:))
                }
                start = end + 1
            }
            return nil
        }
    }

    /// A decimal number of ASCII digits (no sign), or nil.
    private static func decimal(_ digits: ArraySlice<UInt8>) -> UInt64? {
        guard !digits.isEmpty, digits.count <= 20 else { return nil }
        var value: UInt64 = 0
        for digit in digits {
            guard digit >= UInt8(ascii: "0"), digit <= UInt8(ascii: "9") else { return nil }
            let (times10, overflow) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = times10.addingReportingOverflow(UInt64(digit - UInt8(ascii: "0")))
            guard !overflow, !overflow2 else { return nil }
            value = sum
        }
        return value
    }

    /// The file `exe` links to, and the path the process's namespace shows it at.
    private static func executable(in directory: Int32) -> Executable? {
        var status = stat()
        guard fstatat(directory, "exe", &status, 0) == 0, let path = ProcessInfo.link("exe", relativeTo: directory)
        else { return nil }
        return Executable(path: path, file: FileIdentity(device: UInt64(status.st_dev), inode: UInt64(status.st_ino)))
    }
}

/// A process's `/proc/PID` directory, open: once the process has been
/// reaped, reads through it fail, also when its pid was given to another
/// process meanwhile. Closed with its last reference.
final class ProcDirectory: Sendable {
    let pid: UInt32
    let fd: Int32

    init?(pid: UInt32) {
        let fd = open("/proc/\(pid)", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        self.pid = pid
        self.fd = fd
    }

    deinit { close(fd) }
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
