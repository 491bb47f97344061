import Glibc

/// Who is calling, as the bus's credentials say (never as the caller says).
public struct CallerIdentity: Hashable, Sendable {
    public var uid: UInt32
    /// Supplementary and primary groups.
    public var gids: [UInt32]
    public var pid: UInt32
    /// The program the connection's process runs; nil when it could not be
    /// read, or when the process at the connection's pid is not the one that
    /// connected (see `GuidedAccessService.identify`).
    public var executable: Executable?
    /// The systemd unit of the process's cgroup, if any (nil like `executable`).
    public var systemdUnit: String?
    /// (1.2) A page of the kiosk browser: its origin, as the browser reports
    /// the document's execution context; the rest of the identity is the
    /// launcher's that attached the browser. nil for a bus caller.
    public var origin: String?

    public init(
        uid: UInt32, gids: [UInt32] = [], pid: UInt32 = 0, executable: Executable? = nil, systemdUnit: String? = nil,
        origin: String? = nil
    ) {
        self.origin = origin
        self.uid = uid
        self.gids = gids
        self.pid = pid
        self.executable = executable
        self.systemdUnit = systemdUnit
    }

    /// For messages and logs.
    public var executablePath: String? { executable?.path }

    /// The part of the identity that take-over compares, as the journal keeps it.
    public var ownerIdentity: OwnerIdentity { OwnerIdentity(uid: uid, executablePath: executable?.path, origin: origin) }
}

/// A file as the kernel knows it: one device and inode is one file, whatever
/// path leads to it and whatever another mount namespace mounts there.
public struct FileIdentity: Hashable, Sendable {
    public var device: UInt64
    public var inode: UInt64

    public init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }

    /// The file at `path` now, in this process's own view of the file system
    /// (symbolic links followed); nil when there is none.
    public init?(atPath path: String) {
        var status = stat()
        guard stat(path, &status) == 0 else { return nil }
        self.init(device: UInt64(status.st_dev), inode: UInt64(status.st_ino))
    }
}

/// The program a process runs.
public struct Executable: Hashable, Sendable {
    /// Where the process's own mount namespace shows it (`/proc/PID/exe`):
    /// for messages, never for comparing, since a namespace of the caller's
    /// can mount any file at any path.
    public var path: String
    public var file: FileIdentity

    public init(path: String, file: FileIdentity) {
        self.path = path
        self.file = file
    }

    /// Whether this is the file at `path` in the service's own namespace now.
    public func isFile(at path: String) -> Bool { FileIdentity(atPath: path) == file }
}

/// A session owner's identity: its Unix user and its executable's path,
/// and for a page of the kiosk browser its origin (the user and executable
/// are then the launcher's).
public struct OwnerIdentity: Hashable, Sendable, CustomStringConvertible {
    public var uid: UInt32
    public var executablePath: String?
    /// (1.2) The owning page's origin; nil for a bus caller.
    public var origin: String?

    public init(uid: UInt32, executablePath: String?, origin: String? = nil) {
        self.uid = uid
        self.executablePath = executablePath
        self.origin = origin
    }

    /// Whether `caller` is the same user running the program at the owner's
    /// path — the file there in the service's namespace now, so an upgraded
    /// program still matches and another one mounted over the path in the
    /// caller's namespace does not. An executable that could not be read
    /// matches nothing: sameness must be shown, not assumed. A page's
    /// session is taken over only by a page of the same origin, a bus
    /// caller's only by a bus caller.
    public func matches(_ caller: CallerIdentity) -> Bool {
        guard let path = executablePath, let executable = caller.executable, origin == caller.origin else { return false }
        return uid == caller.uid && executable.isFile(at: path)
    }

    public var description: String {
        let program = "uid \(uid) running \(executablePath ?? "an unknown executable")"
        guard let origin else { return program }
        return "page \(origin) in the browser of \(program)"
    }
}

/// The system's users, by uid.
public enum SystemUsers {
    /// The name of user `uid`, or nil when it has none.
    public static func name(of uid: UInt32) -> String? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getpwuid_r(uid, &entry, &buffer, buffer.count, &result) == 0, result != nil, let name = entry.pw_name else {
            return nil
        }
        return String(cString: name)
    }
}
