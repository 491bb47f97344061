/// Who is calling, as the bus's credentials say (never as the caller says).
public struct CallerIdentity: Hashable, Sendable {
    public var uid: UInt32
    /// Supplementary and primary groups.
    public var gids: [UInt32]
    public var pid: UInt32
    /// `/proc/PID/exe`; nil when it could not be read.
    public var executablePath: String?
    /// The systemd unit of the process's cgroup, if any.
    public var systemdUnit: String?

    public init(uid: UInt32, gids: [UInt32] = [], pid: UInt32 = 0, executablePath: String? = nil, systemdUnit: String? = nil) {
        self.uid = uid
        self.gids = gids
        self.pid = pid
        self.executablePath = executablePath
        self.systemdUnit = systemdUnit
    }

    /// The part of the identity that take-over compares.
    public var ownerIdentity: OwnerIdentity { OwnerIdentity(uid: uid, executablePath: executablePath) }
}

/// A session owner's identity: its Unix user and its executable.
public struct OwnerIdentity: Hashable, Sendable, CustomStringConvertible {
    public var uid: UInt32
    public var executablePath: String?

    public init(uid: UInt32, executablePath: String?) {
        self.uid = uid
        self.executablePath = executablePath
    }

    /// Whether `other` is the same user running the same executable. An
    /// executable that could not be read matches nothing: sameness must be
    /// shown, not assumed.
    public func matches(_ other: OwnerIdentity) -> Bool {
        guard let mine = executablePath, let theirs = other.executablePath else { return false }
        return uid == other.uid && mine == theirs
    }

    public var description: String { "uid \(uid) running \(executablePath ?? "an unknown executable")" }
}
