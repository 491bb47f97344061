import CLinux
import DBus
import Glibc

/// Tells when a display appears or goes: inotify on the directories that
/// hold the display sockets (XDG_RUNTIME_DIR for `wayland-N`,
/// /tmp/.X11-unix for `XN`). An event, not polling.
///
/// Bounded however fast the files there churn (/tmp/.X11-unix is writable
/// by every user): only `X<digits>` and `wayland-<digits>` names count;
/// after a wake-up that read events the watch pauses `pause` (the kernel
/// queues what comes meanwhile, and an overflow counts as a change), so
/// `changed` is called at most once per pause, and the first change of a
/// quiet directory at once. A directory missing at the start is watched
/// for in its parent and watched once it appears (an X server started
/// after the service makes /tmp/.X11-unix), and again if it is removed.
public final class DisplaySocketWatch: @unchecked Sendable {
    private let fd: Int32
    private let loop: EventLoop
    private let changed: @Sendable () -> Void
    private var source: EventLoop.SourceToken?
    private var resume: Task<Void, Never>?
    /// The directories to watch, and their watch descriptors once watched.
    private var directories: [String: Int32?] = [:]
    /// The parents watched for missing directories: descriptor → those.
    private var parents: [Int32: Set<String>] = [:]

    static let pause: Duration = .milliseconds(250)
    private static let mask = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF)
    private static let parentMask = UInt32(IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)

    /// nil when inotify is not available, or none of the directories nor
    /// their parents can be watched.
    public init?(directories: [String], loop: EventLoop, changed: @escaping @Sendable () -> Void) {
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { return nil }
        self.fd = fd
        self.loop = loop
        self.changed = changed
        for directory in directories { self.directories[directory] = .some(nil) }
        for directory in directories { watch(directory) }
        guard self.directories.values.contains(where: { $0 != nil }) || !parents.isEmpty else {
            close(fd)
            return nil
        }
        listen()
    }

    deinit {
        resume?.cancel()
        if let source { loop.removeSource(source, fd: fd) }
        close(fd)
    }

    /// Whether `name` is a display socket's: `X<digits>` or `wayland-<digits>`.
    static func isDisplayName(_ name: Substring) -> Bool {
        let digits: Substring
        if name.hasPrefix("X") {
            digits = name.dropFirst()
        } else if name.hasPrefix("wayland-") {
            digits = name.dropFirst("wayland-".count)
        } else {
            return false
        }
        return !digits.isEmpty && digits.count <= 10 && digits.utf8.allSatisfy { (0x30...0x39).contains($0) }
    }

    /// Watches `directory`, or its parent for it while it is missing.
    private func watch(_ directory: String) {
        let wd = inotify_add_watch(fd, directory, Self.mask | UInt32(IN_ONLYDIR))
        if wd >= 0 {
            directories[directory] = wd
            return
        }
        directories[directory] = .some(nil)
        guard errno == ENOENT || errno == ENOTDIR, let slash = directory.lastIndex(of: "/") else { return }
        let parent = slash == directory.startIndex ? "/" : String(directory[..<slash])
        let pwd = inotify_add_watch(fd, parent, Self.parentMask)
        if pwd >= 0 { parents[pwd, default: []].insert(directory) }
    }

    private func listen() {
        source = loop.addSource(fd: fd, events: UInt32(EPOLLIN.rawValue)) { [self] _ in ready() }
    }

    private func ready() {
        let relevant = drain()
        if relevant { changed() }
        // Pause: what comes meanwhile waits in the kernel's queue.
        if let source { loop.removeSource(source, fd: fd) }
        source = nil
        let loop = self.loop
        resume = Task(executorPreference: loop) { [weak self] in
            do { try await loop.sleep(for: Self.pause) } catch { return }
            self?.listen()
        }
    }

    /// Reads the pending events; whether one was about a display socket (or
    /// a watched directory came or went, or events were lost).
    private func drain() -> Bool {
        var relevant = false
        var buffer = [UInt8](repeating: 0, count: 16384)
        var appeared: [String] = []
        var gone: [String] = []
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { break }
            var offset = 0
            let header = MemoryLayout<inotify_event>.size
            while offset + header <= n {
                let (wd, mask, length) = buffer.withUnsafeBytes {
                    (
                        $0.loadUnaligned(fromByteOffset: offset, as: Int32.self),
                        $0.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self),
                        Int($0.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
                    )
                }
                let nameBytes = buffer[(offset + header)..<min(offset + header + length, n)]
                let name = Substring(String(decoding: nameBytes.prefix(while: { $0 != 0 }), as: UTF8.self))
                offset += header + length
                if mask & UInt32(IN_Q_OVERFLOW) != 0 {
                    relevant = true
                } else if let missing = parents[wd] {
                    appeared += missing.filter { $0.hasSuffix("/" + name) }
                } else if mask & UInt32(IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED) != 0 {
                    if let directory = directories.first(where: { $0.value == wd })?.key { gone.append(directory) }
                } else if Self.isDisplayName(name) {
                    relevant = true
                }
            }
        }
        for directory in Set(gone) {
            if case let wd?? = directories[directory] { inotify_rm_watch(fd, wd) }
            directories[directory] = .some(nil)
            watch(directory)
            relevant = true
        }
        for directory in Set(appeared) {
            for (pwd, missing) in parents where missing.contains(directory) {
                parents[pwd]?.remove(directory)
                if parents[pwd]?.isEmpty == true {
                    parents[pwd] = nil
                    inotify_rm_watch(fd, pwd)
                }
            }
            watch(directory)
            relevant = true
        }
        return relevant
    }
}
