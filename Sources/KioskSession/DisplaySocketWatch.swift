import CLinux
import DBus
import Glibc

/// Tells when a display appears or goes: inotify on the directories that
/// hold the display sockets (XDG_RUNTIME_DIR for `wayland-N`,
/// /tmp/.X11-unix for `XN`). An event, not polling; other files coming and
/// going there wake the loop briefly and are ignored.
public final class DisplaySocketWatch: @unchecked Sendable {
    private let fd: Int32
    private let loop: EventLoop
    private var source: EventLoop.SourceToken?

    /// nil when inotify is not available; directories that do not exist
    /// are not watched.
    public init?(directories: [String], loop: EventLoop, changed: @escaping @Sendable () -> Void) {
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { return nil }
        let mask = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)
        let watched = directories.filter { inotify_add_watch(fd, $0, mask) >= 0 }
        guard !watched.isEmpty else {
            close(fd)
            return nil
        }
        self.fd = fd
        self.loop = loop
        source = loop.addSource(fd: fd, events: UInt32(EPOLLIN.rawValue)) { _ in
            if Self.drain(fd) { changed() }
        }
    }

    deinit {
        if let source { loop.removeSource(source, fd: fd) }
        close(fd)
    }

    /// Reads every pending event; whether one was about a display socket.
    private static func drain(_ fd: Int32) -> Bool {
        var relevant = false
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { return relevant }
            var offset = 0
            let header = MemoryLayout<inotify_event>.size
            while offset + header <= n {
                let length = buffer.withUnsafeBytes {
                    Int($0.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
                }
                let nameBytes = buffer[(offset + header)..<min(offset + header + length, n)]
                let name = String(decoding: nameBytes.prefix(while: { $0 != 0 }), as: UTF8.self)
                if SessionProbe.isWaylandSocketName(name) || name.hasPrefix("X") { relevant = true }
                offset += header + length
            }
        }
    }
}
