import CLinux
import DBus
import Glibc

/// Tells when a display appears or goes: inotify on the directories that
/// hold the display sockets (XDG_RUNTIME_DIR for `wayland-N`,
/// /tmp/.X11-unix for `XN`). An event, not polling.
///
/// Bounded however fast the files there churn (/tmp/.X11-unix is writable
/// by every user): only `X<digits>` and `wayland-NAME` (not `.lock`) names
/// count, as `SessionProbe` finds displays; after a wake-up that came
/// within `pause` of the one before, the watch pauses `pause` (the kernel
/// queues what comes meanwhile, and an overflow counts as a change), so
/// under a churn `changed` is called at most twice per pause, while the
/// steps of a display coming (the Wayland socket, then Xwayland's X socket)
/// are each seen at once. A directory missing at the start is watched
/// for in its parent and watched once it appears (an X server started
/// after the service makes /tmp/.X11-unix), and again if it is removed.
public final class DisplaySocketWatch: @unchecked Sendable {
    private let fd: Int32
    private let loop: EventLoop
    private let changed: @Sendable () -> Void
    private var source: EventLoop.SourceToken?
    private var resume: Task<Void, Never>?
    private var lastWake: ContinuousClock.Instant?
    /// The directories to watch, and their watch descriptors once watched.
    private var directories: [String: Int32?] = [:]
    /// The parents watched for missing directories: descriptor → those.
    private var parents: [Int32: Set<String>] = [:]

    /// A quarter of a second (a test stretches it).
    private let pause: Duration
    private static let mask = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF)
    private static let parentMask = UInt32(IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)

    /// nil when inotify is not available, or none of the directories nor
    /// their parents can be watched.
    public init?(
        directories: [String], loop: EventLoop, pause: Duration = .milliseconds(250),
        changed: @escaping @Sendable () -> Void
    ) {
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { return nil }
        self.fd = fd
        self.loop = loop
        self.pause = pause
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

    /// Whether `name` is a display socket's: `X<digits>` (in /tmp/.X11-unix,
    /// which every user may write) or `wayland-NAME`, not `NAME.lock` (in the
    /// user's own runtime directory; a compositor may name its socket, as
    /// `SessionProbe` takes it).
    static func isDisplayName(_ name: Substring) -> Bool {
        Array(name.utf8).withUnsafeBufferPointer { isDisplayName($0) }
    }

    /// The same of an inotify event's name bytes (NUL-padded): read for
    /// every file made or removed in a directory every user may write, so
    /// in place, with no String made.
    static func isDisplayName(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        var end = 0
        while end < name.count, name[end] != 0 { end += 1 }
        var start = 1
        if end > 8, name[0] == UInt8(ascii: "w"), name[1] == UInt8(ascii: "a"), name[2] == UInt8(ascii: "y"),
            name[3] == UInt8(ascii: "l"), name[4] == UInt8(ascii: "a"), name[5] == UInt8(ascii: "n"),
            name[6] == UInt8(ascii: "d"), name[7] == UInt8(ascii: "-")
        {
            let lock = end >= 13 && name[end - 5] == UInt8(ascii: ".") && name[end - 4] == UInt8(ascii: "l")
                && name[end - 3] == UInt8(ascii: "o") && name[end - 2] == UInt8(ascii: "c") && name[end - 1] == UInt8(ascii: "k")
            return !lock
        }
        guard end > 1, name[0] == UInt8(ascii: "X"), end - start <= 10 else { return false }
        while start < end {
            guard name[start] >= UInt8(ascii: "0"), name[start] <= UInt8(ascii: "9") else { return false }
            start += 1
        }
        return true
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
        // Pause only when events come close together (a churn): a display
        // that comes in steps — Xwayland's X socket a few milliseconds after
        // the compositor's Wayland one — is seen at each step.
        let now = ContinuousClock.now
        defer { lastWake = now }
        guard let last = lastWake, now - last < pause else { return }
        // What comes meanwhile waits in the kernel's queue.
        if let source { loop.removeSource(source, fd: fd) }
        source = nil
        let loop = self.loop
        let pause = self.pause
        resume = Task(executorPreference: loop) { [weak self] in
            do { try await loop.sleep(for: pause) } catch { return }
            self?.listen()
        }
    }

    /// Reads the pending events; whether one was about a display socket (or
    /// a watched directory came or went, or events were lost). Once one
    /// was, the names of the rest are not looked at.
    private func drain() -> Bool {
        var relevant = false
        var buffer = [UInt8](repeating: 0, count: 16384)
        var appeared: [String] = []
        var gone: [String] = []
        let header = MemoryLayout<inotify_event>.size
        let selfEvents = UInt32(IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { break }
            buffer.withUnsafeBytes { raw in
                var offset = 0
                while offset + header <= n {
                    let wd = raw.loadUnaligned(fromByteOffset: offset, as: Int32.self)
                    let mask = raw.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self)
                    let length = Int(raw.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
                    let name = UnsafeBufferPointer(
                        rebasing: raw.bindMemory(to: UInt8.self)[(offset + header)..<min(offset + header + length, n)])
                    offset += header + length
                    if mask & UInt32(IN_Q_OVERFLOW) != 0 {
                        relevant = true
                    } else if !parents.isEmpty, let missing = parents[wd] {
                        // Any user's file in /tmp: compared as bytes.
                        var length = 0
                        while length < name.count, name[length] != 0 { length += 1 }
                        for directory in missing {
                            let last = directory.utf8.split(separator: UInt8(ascii: "/")).last ?? []
                            if last.count == length, last.elementsEqual(name.prefix(length)) { appeared.append(directory) }
                        }
                    } else if mask & selfEvents != 0 {
                        if let directory = directories.first(where: { $0.value == wd })?.key { gone.append(directory) }
                    } else if !relevant, Self.isDisplayName(name) {
                        relevant = true
                    }
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
