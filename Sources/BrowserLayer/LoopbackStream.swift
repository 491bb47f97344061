import CLinux
import DBus
import Glibc
import GuidedAccessCore

/// What went wrong with the browser: not listening, too slow, or garbage.
public struct DevToolsFailure: Error, Hashable, Sendable, CustomStringConvertible {
    public let description: String
    /// A command that got no answer in time (the connection may be fine).
    public let isTimeout: Bool
    init(_ description: String, isTimeout: Bool = false) {
        self.description = description
        self.isTimeout = isTimeout
    }
}

/// A non-blocking connection to the kiosk browser's DevTools — a TCP
/// connection to its loopback port, or the Unix socket the launcher
/// (`guidedaccessctl browser`) relays its DevTools pipe over — driven by
/// the service's own loop: a read or write that would block
/// waits for epoll, not a thread. The descriptor is watched only while
/// something waits on it, so an idle connection costs no wake-up, and a
/// peer that hangs up cannot make epoll report it over and over.
///
/// Loop thread only: used from actors on the loop (`DevToolsClient`,
/// `BrowserLayer`), its waits `nonisolated(nonsending)` so that they stay
/// on the caller's executor, and its epoll handler runs on the same
/// thread, never at the same time.
final class LoopbackStream: @unchecked Sendable {
    private let loop: EventLoop
    private var fd: Int32 = -1
    private var token: EventLoop.SourceToken?
    private var readWaiter: CheckedContinuation<Void, Error>?
    private var writeWaiter: CheckedContinuation<Void, Error>?
    private var closed = false
    /// Reads since the last wait for epoll: a peer that always has more to
    /// send must not keep the loop's thread (`read`).
    private var readsWithoutWait = 0
    /// Reads of a full buffer allowed before the stream waits for epoll
    /// once, so that whatever else is ready runs first.
    static let readsPerWakeUp = 2

    init(loop: EventLoop) { self.loop = loop }

    /// A stream over `fd`, a connected socket handed to the service (the
    /// launcher's end of the browser's pipe), which it now owns.
    init(loop: EventLoop, adopting fd: Int32) {
        self.loop = loop
        self.fd = fd
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
    }

    deinit { close() }

    /// Connects to `endpoint`; throws when nothing listens there.
    nonisolated(nonsending) func connect(to endpoint: DevToolsEndpoint) async throws(DevToolsFailure) {
        let family: Int32
        switch endpoint.address {
        case .ipv4: family = AF_INET
        case .ipv6Loopback: family = AF_INET6
        }
        fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw DevToolsFailure("socket: \(Self.errorText(errno))") }
        var one: Int32 = 1
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let result: Int32
        switch endpoint.address {
        case .ipv4(let a, let b, let c, let d):
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = endpoint.port.bigEndian
            address.sin_addr.s_addr = (UInt32(a) << 24 | UInt32(b) << 16 | UInt32(c) << 8 | UInt32(d)).bigEndian
            result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        case .ipv6Loopback:
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = endpoint.port.bigEndian
            address.sin6_addr = in6addr_loopback
            result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size))
                }
            }
        }
        if result != 0 {
            guard errno == EINPROGRESS else { throw DevToolsFailure("connect: \(Self.errorText(errno))") }
            try await wait(readable: false)
            var error: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            _ = getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
            guard error == 0 else { throw DevToolsFailure("connect: \(Self.errorText(error))") }
        }
    }

    /// The user owning the socket at the other end of this connection, as
    /// the kernel's socket tables (`/proc/net/tcp`, `tcp6`) say: the peer's
    /// own words are not asked. The connection's far end is the socket whose
    /// local address is `endpoint` and whose remote address is ours; a
    /// socket still in the listener's accept queue has the listener's owner.
    /// Looked for a few times (the far end is made as the handshake's last
    /// packet arrives); nil when it cannot be found.
    nonisolated(nonsending) func peerOwner(_ endpoint: DevToolsEndpoint) async -> UInt32? {
        var address = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { return nil }
        let ours: (address: String, port: UInt16)
        let table: String
        switch endpoint.address {
        case .ipv4:
            table = "/proc/net/tcp"
            ours = withUnsafeBytes(of: &address) { raw in
                let a = raw.load(as: sockaddr_in.self)
                return (Self.tableHex(withUnsafeBytes(of: a.sin_addr) { Array($0) }), UInt16(bigEndian: a.sin_port))
            }
        case .ipv6Loopback:
            table = "/proc/net/tcp6"
            ours = withUnsafeBytes(of: &address) { raw in
                let a = raw.load(as: sockaddr_in6.self)
                return (Self.tableHex(withUnsafeBytes(of: a.sin6_addr) { Array($0) }), UInt16(bigEndian: a.sin6_port))
            }
        }
        let theirs: [UInt8]
        switch endpoint.address {
        case .ipv4(let a, let b, let c, let d): theirs = [a, b, c, d]
        case .ipv6Loopback: theirs = withUnsafeBytes(of: in6addr_loopback) { Array($0) }
        }
        let local = Self.tableHex(theirs) + ":" + Self.hex(endpoint.port, width: 4)
        let remote = ours.address + ":" + Self.hex(ours.port, width: 4)
        for _ in 0..<20 {
            if let owner = Self.owner(in: table, local: local, remote: remote) { return owner }
            do { try await loop.sleep(for: .milliseconds(5)) } catch { return nil }
        }
        return nil
    }

    /// The uid of the socket in `table` with these addresses (as the table
    /// writes them: `ADDRESS:PORT` in upper-case hexadecimal). The table may
    /// be long (any local user can fill it with connections in TIME_WAIT):
    /// searched as bytes, with only the matching line made a String.
    static func owner(in table: String, local: String, remote: String) -> UInt32? {
        guard let bytes = (try? FileContents.read(table)) ?? nil else { return nil }
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid …
        let needle = Array(" \(local) \(remote) ".utf8)
        return bytes.withUnsafeBytes { raw -> UInt32? in
            guard let base = raw.baseAddress, raw.count >= needle.count else { return nil }
            // memchr for the first byte, memcmp for the rest (memmem is not in Glibc's module).
            var at = 0
            var found: Int?
            while found == nil, at <= raw.count - needle.count,
                let hit = memchr(base + at, Int32(needle[0]), raw.count - needle.count + 1 - at)
            {
                let offset = base.distance(to: UnsafeRawPointer(hit))
                if memcmp(hit, needle, needle.count) == 0 { found = offset }
                at = offset + 1
            }
            guard let found else { return nil }
            let start = found + needle.count
            var end = start
            while end < raw.count, raw[end] != UInt8(ascii: "\n") { end += 1 }
            let rest = String(decoding: raw[start..<end], as: UTF8.self).split(separator: " ")
            // st tx:rx tr:when retrnsmt uid
            return rest.count > 4 ? UInt32(rest[4]) : nil
        }
    }

    /// An address as /proc/net/tcp writes it: each 32-bit word of the
    /// address in memory order, printed as the host's (little-endian) number.
    static func tableHex(_ bytes: [UInt8]) -> String {
        stride(from: 0, to: bytes.count, by: 4).map { i in
            hex(UInt32(bytes[i]) | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2]) << 16 | UInt32(bytes[i + 3]) << 24, width: 8)
        }.joined()
    }

    static func hex<T: BinaryInteger>(_ value: T, width: Int) -> String {
        let digits = String(value, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, width - digits.count)) + digits
    }

    /// Reads into `buffer` as soon as something is there; how much. Throws
    /// at the end of the stream. Every `readsPerWakeUp` reads that found
    /// data without waiting, it goes back to the loop once (waits for
    /// epoll): the work a peer's stream costs per wake-up is bounded, and
    /// D-Bus callers are answered however fast the peer sends.
    nonisolated(nonsending) func read(into buffer: inout [UInt8]) async throws(DevToolsFailure) -> Int {
        if readsWithoutWait >= Self.readsPerWakeUp {
            readsWithoutWait = 0
            try await wait(readable: true)
        }
        while true {
            guard !closed else { throw DevToolsFailure("the connection was closed") }
            // MSG_DONTWAIT, not only the descriptor's O_NONBLOCK: a socket
            // handed over shares its flags with the peer's copy, which may
            // clear them.
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n > 0 {
                readsWithoutWait += 1
                return n
            }
            if n == 0 { throw DevToolsFailure("the browser closed the connection") }
            switch errno {
            case EINTR: continue
            case EAGAIN:
                readsWithoutWait = 0
                try await wait(readable: true)
            default: throw DevToolsFailure("read: \(Self.errorText(errno))")
            }
        }
    }

    /// Writes all of `bytes`, waiting for room as needed.
    nonisolated(nonsending) func write(_ bytes: [UInt8]) async throws(DevToolsFailure) {
        var offset = 0
        while offset < bytes.count {
            guard !closed else { throw DevToolsFailure("the connection was closed") }
            let n = bytes.withUnsafeBytes {
                send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
            }
            if n > 0 {
                offset += n
                continue
            }
            switch errno {
            case EINTR: continue
            case EAGAIN: try await wait(readable: false)
            default: throw DevToolsFailure("write: \(Self.errorText(errno))")
            }
        }
    }

    /// Closes the descriptor; whatever waits on it fails.
    func close() {
        guard !closed else { return }
        closed = true
        if let token { loop.removeSource(token, fd: fd) }
        token = nil
        UnixFD.close(fd)
        let waiters = [readWaiter, writeWaiter]
        readWaiter = nil
        writeWaiter = nil
        for waiter in waiters { waiter?.resume(throwing: DevToolsFailure("the connection was closed")) }
    }

    private nonisolated(nonsending) func wait(readable: Bool) async throws(DevToolsFailure) {
        guard !closed else { throw DevToolsFailure("the connection was closed") }
        do {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, Error>) in
                if readable { readWaiter = continuation } else { writeWaiter = continuation }
                rearm()
            }
        } catch let failure as DevToolsFailure {
            throw failure
        } catch {
            throw DevToolsFailure("\(error)")
        }
    }

    /// Watches for what the waiters need; nothing when nobody waits.
    private func rearm() {
        let events = (readWaiter != nil ? EPOLLIN.rawValue : 0) | (writeWaiter != nil ? EPOLLOUT.rawValue : 0)
        if events == 0 {
            if let token { loop.removeSource(token, fd: fd) }
            token = nil
        } else if let token {
            loop.updateSource(token, fd: fd, events: events)
        } else {
            token = loop.addSource(fd: fd, events: events) { [self] events in ready(events) }
        }
    }

    private func ready(_ events: UInt32) {
        let failed = events & (EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0
        let reader = events & EPOLLIN.rawValue != 0 || failed ? readWaiter : nil
        let writer = events & EPOLLOUT.rawValue != 0 || failed ? writeWaiter : nil
        if reader != nil { readWaiter = nil }
        if writer != nil { writeWaiter = nil }
        rearm()
        reader?.resume()
        writer?.resume()
    }

    static func errorText(_ code: Int32) -> String { String(cString: strerror(code)) }
}
