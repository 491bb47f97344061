import Glibc

/// What the bus daemon knows about a connection (`GetConnectionCredentials`).
public struct Credentials: Sendable, Hashable {
    public var unixUserID: UInt32?
    public var unixGroupIDs: [UInt32]?
    public var processID: UInt32?
    /// A pidfd for the process, where the bus gives one (dbus ≥ 1.15.6 with
    /// a recent kernel); the receiver owns it.
    public var processFD: Int32?
    public var securityLabel: [UInt8]?

    public init(
        unixUserID: UInt32? = nil, unixGroupIDs: [UInt32]? = nil, processID: UInt32? = nil,
        processFD: Int32? = nil, securityLabel: [UInt8]? = nil
    ) {
        self.unixUserID = unixUserID
        self.unixGroupIDs = unixGroupIDs
        self.processID = processID
        self.processFD = processFD
        self.securityLabel = securityLabel
    }
}

public enum RequestNameReply: UInt32, Sendable {
    case primaryOwner = 1
    case inQueue = 2
    case exists = 3
    case alreadyOwner = 4
}

extension Connection {
    static let busName = "org.freedesktop.DBus"
    static let busPath: ObjectPath = "/org/freedesktop/DBus"

    func callBus(_ member: String, _ arguments: [DBusValue]) async throws(DBusError) -> [DBusValue] {
        try await call(
            destination: Connection.busName, path: Connection.busPath, interface: Connection.busName,
            member: member, arguments)
    }

    /// Asks for a well-known name. Flags: `DO_NOT_QUEUE` by default.
    public func requestName(_ name: String, allowReplacement: Bool = false, replaceExisting: Bool = false)
        async throws(DBusError) -> RequestNameReply
    {
        guard DBusNames.isValidBusName(name), !name.hasPrefix(":") else {
            throw .invalidArgs("'\(name)' is not a valid well-known bus name")
        }
        var flags: UInt32 = 0x4  // DBUS_NAME_FLAG_DO_NOT_QUEUE
        if allowReplacement { flags |= 0x1 }
        if replaceExisting { flags |= 0x2 }
        let reply = try await callBus("RequestName", [.string(name), .uint32(flags)])
        guard case .uint32(let code)? = reply.first, let result = RequestNameReply(rawValue: code) else {
            throw .failed("unexpected RequestName reply \(reply)")
        }
        return result
    }

    public func releaseName(_ name: String) async throws(DBusError) {
        _ = try await callBus("ReleaseName", [.string(name)])
    }

    /// The unique name owning `name`, or nil when nobody does.
    public func nameOwner(_ name: String) async throws(DBusError) -> String? {
        do {
            let reply = try await callBus("GetNameOwner", [.string(name)])
            guard case .string(let owner)? = reply.first else { return nil }
            return owner
        } catch where error.name == "org.freedesktop.DBus.Error.NameHasNoOwner" {
            return nil
        }
    }

    /// Every name on the bus now, unique and well-known (`ListNames`).
    public func listNames() async throws(DBusError) -> [String] {
        let reply = try await callBus("ListNames", [])
        guard case .array(.string, let names)? = reply.first else { throw .failed("unexpected ListNames reply") }
        return names.compactMap { if case .string(let name) = $0 { name } else { nil } }
    }

    /// The bus's own id (`org.freedesktop.DBus.GetId`).
    public func busID() async throws(DBusError) -> String {
        let reply = try await callBus("GetId", [])
        guard case .string(let id)? = reply.first else { throw .failed("unexpected GetId reply") }
        return id
    }

    /// The credentials of the connection that owns `name`, from the bus —
    /// never from anything the peer says about itself.
    public func credentials(of name: String) async throws(DBusError) -> Credentials {
        let reply = try await callBus("GetConnectionCredentials", [.string(name)])
        guard case .dictionary(.string, .variant, let entries)? = reply.first else {
            throw .failed("unexpected GetConnectionCredentials reply")
        }
        var credentials = Credentials()
        for entry in entries {
            guard case .string(let key) = entry.key, case .variant(let value) = entry.value else { continue }
            switch (key, value) {
            case ("UnixUserID", .uint32(let uid)): credentials.unixUserID = uid
            case ("ProcessID", .uint32(let pid)): credentials.processID = pid
            case ("ProcessFD", .unixFD(let fd)): credentials.processFD = fd
            case ("UnixGroupIDs", .array(.uint32, let gids)):
                credentials.unixGroupIDs = gids.compactMap { if case .uint32(let g) = $0 { g } else { nil } }
            case ("LinuxSecurityLabel", .array(.byte, let bytes)):
                credentials.securityLabel = bytes.compactMap { if case .byte(let b) = $0 { b } else { nil } }
            default:
                if case .unixFD(let fd) = value { Glibc.close(fd) }
            }
        }
        return credentials
    }
}

/// Facts about a local process from /proc.
public enum ProcessInfo {
    /// The executable's path (`/proc/PID/exe`), or nil when the process is
    /// gone or not ours to inspect.
    public static func executable(of pid: UInt32, procRoot: String = "/proc") -> String? {
        link("\(procRoot)/\(pid)/exe")
    }

    /// Where a symbolic link points; `path` relative to the open directory
    /// `directory` (an absolute path ignores it).
    public static func link(_ path: String, relativeTo directory: Int32 = AT_FDCWD) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlinkat(directory, path, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The system unit the process runs in, from its cgroup path
    /// (`/proc/PID/cgroup`); see `systemdUnit(fromCgroupFile:)`.
    public static func systemdUnit(of pid: UInt32, procRoot: String = "/proc") -> String? {
        guard let text = readSmallFile("\(procRoot)/\(pid)/cgroup") else { return nil }
        return systemdUnit(fromCgroupFile: text)
    }

    /// Parses a cgroup file's content (cgroup v2 line `0::/path`, else the
    /// `name=systemd` hierarchy of v1) as `sd_pid_get_unit` does: the unit
    /// is the first element after the slices. Below it the unit's processes
    /// may make cgroups of any name (delegation): a user's own units live in
    /// `user@UID.service`'s subtree, and are that system unit's processes.
    public static func systemdUnit(fromCgroupFile text: String) -> String? {
        var text = text
        return text.withUTF8 { systemdUnit(cgroupBytes: $0) }
    }

    public static func systemdUnit(fromCgroupFile bytes: some Collection<UInt8>) -> String? {
        Array(bytes).withUnsafeBufferPointer { systemdUnit(cgroupBytes: $0) }
    }

    /// `systemdUnit(fromCgroupFile:)` of the file's bytes: read for every
    /// call a caller makes, so parsed in place, with plain loops (generic
    /// collection algorithms cost many times more in a debug build, and a
    /// caller that floods calls is served at this speed).
    public static func systemdUnit(cgroupBytes b: UnsafeBufferPointer<UInt8>) -> String? {
        let colon = UInt8(ascii: ":"), newline = UInt8(ascii: "\n"), slash = UInt8(ascii: "/")
        func next(_ byte: UInt8, from start: Int, to end: Int) -> Int {
            var i = start
            while i < end, b[i] != byte { i += 1 }
            return i
        }
        func equal(_ start: Int, _ end: Int, _ literal: [UInt8]) -> Bool {
            guard end - start == literal.count else { return false }
            for i in 0..<literal.count where b[start + i] != literal[i] { return false }
            return true
        }
        func hasSuffix(_ start: Int, _ end: Int, _ literal: [UInt8]) -> Bool {
            end - start >= literal.count && equal(end - literal.count, end, literal)
        }
        var path: (Int, Int)?
        var start = 0
        while start < b.count {
            let end = next(newline, from: start, to: b.count)
            defer { start = end + 1 }
            // HIERARCHY:CONTROLLERS:PATH
            let first = next(colon, from: start, to: end)
            guard first < end else { continue }
            let second = next(colon, from: first + 1, to: end)
            guard second < end else { continue }
            if first == start + 1, b[start] == UInt8(ascii: "0"), second == first + 1 {
                path = (second + 1, end)
                break
            }
            if equal(first + 1, second, Self.systemdHierarchy) { path = (second + 1, end) }
        }
        guard let (from, to) = path else { return nil }
        var element = from
        while element < to {
            let end = next(slash, from: element, to: to)
            defer { element = end + 1 }
            if end == element { continue }
            // systemd escapes a name that could clash with the kernel's files with a leading "_".
            let name = b[element] == UInt8(ascii: "_") ? element + 1 : element
            if hasSuffix(name, end, Self.sliceSuffix) { continue }
            guard hasSuffix(name, end, Self.serviceSuffix) || hasSuffix(name, end, Self.scopeSuffix) else { return nil }
            return String(decoding: UnsafeBufferPointer(rebasing: b[name..<end]), as: UTF8.self)
        }
        return nil
    }

    private static let systemdHierarchy = Array("name=systemd".utf8)
    private static let sliceSuffix = Array(".slice".utf8)
    private static let serviceSuffix = Array(".service".utf8)
    private static let scopeSuffix = Array(".scope".utf8)

    /// A /proc file's text (at most 1 MiB); `path` relative to the open
    /// directory `directory` (an absolute path ignores it).
    public static func readSmallFile(_ path: String, relativeTo directory: Int32 = AT_FDCWD) -> String? {
        let fd = openat(directory, path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 1 << 20 {
            let n = read(fd, &chunk, chunk.count)
            if n < 0, errno == EINTR { continue }
            if n < 0 { return nil }
            if n == 0 { break }
            bytes += chunk[0..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

extension ArraySlice where Element == UInt8 {
    fileprivate func hasSuffix(_ suffix: String) -> Bool {
        let tail = suffix.utf8
        return count >= tail.count && self.suffix(tail.count).elementsEqual(tail)
    }
}
