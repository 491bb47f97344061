import CLinux
import DBus
import Glibc
import GuidedAccessCore
import Synchronization

/// The owner of an X selection: who holds `_NET_WM_CM_S0` (the compositor
/// of screen 0) or `_XSETTINGS_S0` (the settings manager).
public struct X11SelectionOwner: Hashable, Sendable, CustomStringConvertible {
    /// The window that holds the selection.
    public var window: UInt32
    /// Its `_NET_WM_PID`, when it says one.
    public var pid: Int32?
    /// The process's name (`/proc/PID/comm`), else the window's `WM_NAME`.
    public var name: String?

    public var description: String {
        switch (name, pid) {
        case let (name?, pid?): return "\(name) (pid \(pid))"
        case let (name?, nil): return "\(name) (window 0x\(String(window, radix: 16)))"
        case let (nil, pid?): return "pid \(pid)"
        case (nil, nil): return "window 0x\(String(window, radix: 16))"
        }
    }
}

/// What the service asks of an X server: who owns the compositor's and the
/// settings manager's selections (never a second one of either), and
/// whether it has GLX (picom's
/// shaders). A few requests on the X server's socket, on the event loop,
/// within a bound: an X server that does not answer holds up nothing.
public struct X11DisplayFacts: Hashable, Sendable {
    public var compositor: X11SelectionOwner?
    /// The XSETTINGS manager of screen 0 (`_XSETTINGS_S0`).
    public var settingsManager: X11SelectionOwner?
    public var hasGLX: Bool
}

public struct X11Error: Error, Hashable, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

public enum X11Display {
    /// The facts of `display` (`:0`, a local display), asking with the
    /// cookie `xauthority` holds for it, if any.
    public static func facts(
        of display: String, xauthority: String?, loop: EventLoop, within bound: Duration = .seconds(1),
        socketDirectory: String = SessionProbe.x11SocketDirectory
    ) async throws(X11Error) -> X11DisplayFacts {
        let connection = try connect(display, xauthority: xauthority, loop: loop, within: bound, socketDirectory)
        defer { connection.close() }
        return try await connection.facts()
    }

    /// A sample of what the screen shows: the pixels of an 8 × 8 grid over
    /// the root window (as composited). Two samples differ when a filter
    /// came on or went, wherever the screen has colour or light to change.
    public static func sample(
        of display: String, xauthority: String?, loop: EventLoop, within bound: Duration = .seconds(1)
    ) async throws(X11Error) -> [UInt8] {
        let connection = try connect(display, xauthority: xauthority, loop: loop, within: bound, SessionProbe.x11SocketDirectory)
        defer { connection.close() }
        return try await connection.sample()
    }

    private static func connect(
        _ display: String, xauthority: String?, loop: EventLoop, within bound: Duration, _ socketDirectory: String
    ) throws(X11Error) -> X11Connection {
        guard let number = displayNumber(display) else { throw X11Error("'\(display)' is not a local X display") }
        let cookie = xauthority.flatMap { try? FileContents.read($0) }.flatMap { Xauthority.cookie(in: $0, display: number) }
        guard let fd = UnixSocket.connect(socketDirectory + "/X\(number)") else {
            throw X11Error("nothing listens on the socket of display \(display)")
        }
        return X11Connection(fd: fd, loop: loop, deadline: Self.now() + bound, cookie: cookie)
    }

    /// `:0`, `:0.0`, `unix:0` → 0; nil for a display on another host.
    static func displayNumber(_ display: String) -> Int? {
        var rest = Substring(display)
        if rest.hasPrefix("unix:") { rest = rest.dropFirst(4) }
        guard rest.hasPrefix(":") else { return nil }
        let digits = rest.dropFirst().prefix { $0 != "." }
        guard !digits.isEmpty, digits.allSatisfy(\.isASCII), let number = Int(digits), number >= 0 else { return nil }
        return number
    }

    static func now() -> Duration {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return .seconds(time.tv_sec) + .nanoseconds(time.tv_nsec)
    }
}

/// An authority file's MIT-MAGIC-COOKIE-1 for a display of this machine.
enum Xauthority {
    /// The file is a sequence of entries: family (u16), address, number,
    /// name and data (each a big-endian u16 length and bytes). An entry for
    /// a local connection (family 256, 65535 for any) and the display's
    /// number (or none) with this host's name first, else any such entry.
    static func cookie(in bytes: [UInt8], display: Int) -> [UInt8]? {
        var host = [CChar](repeating: 0, count: 256)
        let hostname = gethostname(&host, host.count - 1) == 0
            ? Array(host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }) : []
        var i = 0
        func field() -> [UInt8]? {
            guard i + 2 <= bytes.count else { return nil }
            let length = Int(bytes[i]) << 8 | Int(bytes[i + 1])
            guard i + 2 + length <= bytes.count else { return nil }
            defer { i += 2 + length }
            return Array(bytes[(i + 2)..<(i + 2 + length)])
        }
        var fallback: [UInt8]?
        while i + 2 <= bytes.count {
            let family = Int(bytes[i]) << 8 | Int(bytes[i + 1])
            i += 2
            guard let address = field(), let number = field(), let name = field(), let data = field() else { return fallback }
            guard family == 256 || family == 65535, number.isEmpty || number == Array(String(display).utf8),
                name == Array("MIT-MAGIC-COOKIE-1".utf8), data.count == 16
            else { continue }
            if family == 65535 || address == hostname { return data }
            if fallback == nil { fallback = data }
        }
        return fallback
    }
}

/// One short conversation with an X server, all on the loop: the setup,
/// then rounds of requests each of which has exactly one reply or error.
private final class X11Connection: @unchecked Sendable {
    private let fd: Int32
    private let loop: EventLoop
    private let deadline: Duration
    private let cookie: [UInt8]?
    private var input: [UInt8] = []

    init(fd: Int32, loop: EventLoop, deadline: Duration, cookie: [UInt8]?) {
        self.fd = fd
        self.loop = loop
        self.deadline = deadline
        self.cookie = cookie
    }

    func close() { Glibc.close(fd) }

    /// The setup request (little-endian), to go with the first round.
    private var setup: [UInt8] {
        var setup: [UInt8] = [0x6c, 0]
        setup += Self.u16(11) + Self.u16(0)
        let name = cookie == nil ? [] : Array("MIT-MAGIC-COOKIE-1".utf8)
        setup += Self.u16(name.count) + Self.u16(cookie?.count ?? 0) + [0, 0]
        return setup + Self.padded(name) + Self.padded(cookie ?? [])
    }

    func facts() async throws(X11Error) -> X11DisplayFacts {
        let names = ["_NET_WM_CM_S0", "_XSETTINGS_S0", "_NET_WM_PID"]
        try send(setup + names.flatMap { Self.internAtom($0) } + Self.queryExtension("GLX"))
        _ = try await readSetup()
        let first = try await replies(names.count + 1)
        let atoms = first.prefix(names.count).map { $0.map { Self.u32($0, at: 8) } ?? 0 }
        var facts = X11DisplayFacts(compositor: nil, settingsManager: nil, hasGLX: first[names.count].map { $0[8] != 0 } ?? false)
        // An atom nobody made yet: no owner ever (GetSelectionOwner answers 0).
        let selections = [atoms[0], atoms[1]]
        try send(selections.flatMap { Self.request(23, 0, Self.u32($0)) })
        let owners = try await replies(2).map { $0.map { Self.u32($0, at: 8) } ?? 0 }
        facts.compositor = try await owner(owners[0], pidAtom: atoms[2])
        facts.settingsManager = try await owner(owners[1], pidAtom: atoms[2])
        return facts
    }

    /// Who `window` is: its _NET_WM_PID (CARDINAL) and WM_NAME (atom 39, any type).
    private func owner(_ window: UInt32, pidAtom: UInt32) async throws(X11Error) -> X11SelectionOwner? {
        guard window != 0 else { return nil }
        try send(
            Self.request(20, 0, Self.u32(window) + Self.u32(pidAtom) + Self.u32(6) + Self.u32(0) + Self.u32(1))
                + Self.request(20, 0, Self.u32(window) + Self.u32(39) + Self.u32(0) + Self.u32(0) + Self.u32(64)))
        let properties = try await replies(2)
        var owner = X11SelectionOwner(window: window)
        if pidAtom != 0, let reply = properties[0], reply[1] == 32, Self.u32(reply, at: 16) == 1, reply.count >= 36 {
            let pid = Int32(bitPattern: Self.u32(reply, at: 32))
            if pid > 0 { owner.pid = pid }
        }
        owner.name = owner.pid.flatMap(ProcessTable.name(of:))
        if owner.name == nil, let reply = properties[1], reply[1] == 8 {
            let length = min(Int(Self.u32(reply, at: 16)), reply.count - 32)
            // A window's name is anyone's text: printable ASCII of it, for a reason and a log line.
            let text = String(decoding: reply[32..<(32 + max(length, 0))].filter { $0 >= 0x20 && $0 < 0x7f }, as: UTF8.self)
            if !text.isEmpty { owner.name = text }
        }
        return owner
    }

    func sample() async throws(X11Error) -> [UInt8] {
        try send(setup)
        let screen = try await readSetup()
        var requests: [UInt8] = []
        for row in 0..<8 {
            for column in 0..<8 {
                // GetImage, ZPixmap, one pixel, every plane.
                let x = (2 * column + 1) * screen.width / 16, y = (2 * row + 1) * screen.height / 16
                requests += Self.request(
                    73, 2, Self.u32(screen.root) + Self.u16(x) + Self.u16(y) + Self.u16(1) + Self.u16(1) + Self.u32(~0))
            }
        }
        try send(requests)
        return try await replies(64).flatMap { $0.map { Array($0.dropFirst(32)) } ?? [] }
    }

    // MARK: Reading

    /// The setup reply; the first screen's root window and size.
    private func readSetup() async throws(X11Error) -> (root: UInt32, width: Int, height: Int) {
        let head = try await read(8)
        let total = 8 + 4 * (Int(head[6]) | Int(head[7]) << 8)
        let message = try await read(total)
        input.removeFirst(total)
        switch head[0] {
        case 1:
            // 32 bytes of fixed fields, the vendor (padded), the formats
            // (8 bytes each), then the screens: root, …, width, height.
            guard message.count >= 40 else { throw X11Error("a setup reply of \(message.count) bytes") }
            let vendor = Int(message[24]) | Int(message[25]) << 8, formats = Int(message[29])
            let screen = 40 + (vendor + 3) / 4 * 4 + 8 * formats
            guard message.count >= screen + 24 else { throw X11Error("a setup reply without a screen") }
            let width = Int(message[screen + 20]) | Int(message[screen + 21]) << 8
            let height = Int(message[screen + 22]) | Int(message[screen + 23]) << 8
            return (Self.u32(message, at: screen), width, height)
        case 0:
            let reason = String(decoding: message.dropFirst(8).prefix(Int(head[1])), as: UTF8.self)
            throw X11Error("the X server refused the connection: \(reason.isEmpty ? "no reason given" : reason)")
        default: throw X11Error("the X server asks for more authentication than a cookie")
        }
    }

    /// The next `count` replies, in order; nil for a request that failed.
    private func replies(_ count: Int) async throws(X11Error) -> [[UInt8]?] {
        var answers: [[UInt8]?] = []
        while answers.count < count {
            let head = try await read(32)
            switch head[0] {
            case 0:
                input.removeFirst(32)
                answers.append(nil)
            case 1:
                let total = 32 + 4 * Int(Self.u32(head, at: 4))
                guard total <= 1 << 20 else { throw X11Error("a reply of \(total) bytes") }
                let reply = try await read(total)
                input.removeFirst(total)
                answers.append(Array(reply.prefix(total)))
            default:
                input.removeFirst(32)  // an event: none is selected, but skip it
            }
        }
        return answers
    }

    /// At least `count` bytes in `input` (returned from its start).
    private func read(_ count: Int) async throws(X11Error) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while input.count < count {
            let n = Glibc.read(fd, &buffer, buffer.count)
            if n > 0 {
                input += buffer[0..<n]
            } else if n == 0 || errno == ECONNRESET {
                throw X11Error("the X server closed the connection")
            } else if errno == EAGAIN || errno == EINTR {
                try await readable()
            } else {
                throw X11Error("reading from the X server failed: errno \(errno)")
            }
        }
        return Array(input.prefix(count))
    }

    private func readable() async throws(X11Error) {
        let left = deadline - X11Display.now()
        guard left > .zero else { throw X11Error("the X server did not answer in time") }
        let wait = FDWait()
        let loop = self.loop, fd = self.fd
        let token = loop.addSource(fd: fd, events: EPOLLIN.rawValue) { _ in wait.finish(true) }
        let timer = Task(executorPreference: loop) {
            guard (try? await loop.sleep(for: left)) != nil else { return }
            wait.finish(false)
        }
        let ready = await withCheckedContinuation { wait.start($0) }
        loop.removeSource(token, fd: fd)
        timer.cancel()
        guard ready else { throw X11Error("the X server did not answer in time") }
    }

    private func send(_ bytes: [UInt8]) throws(X11Error) {
        // A few hundred bytes into an empty socket: all of it or an error.
        // MSG_NOSIGNAL: a server that hung up is an error here, not a SIGPIPE that ends the process.
        let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if n < 0, errno == EPIPE || errno == ECONNRESET { throw X11Error("the X server closed the connection") }
        guard n == bytes.count else { throw X11Error("writing to the X server failed") }
    }

    // MARK: Encoding

    static func u16(_ value: Int) -> [UInt8] { [UInt8(value & 0xff), UInt8(value >> 8 & 0xff)] }
    static func u32(_ value: UInt32) -> [UInt8] { (0..<4).map { UInt8(value >> (8 * $0) & 0xff) } }
    static func u32(_ bytes: [UInt8], at offset: Int) -> UInt32 {
        (0..<4).reduce(0) { $0 | UInt32(bytes[offset + $1]) << (8 * $1) }
    }
    static func padded(_ bytes: [UInt8]) -> [UInt8] { bytes + [UInt8](repeating: 0, count: (4 - bytes.count % 4) % 4) }

    /// A request: opcode, its data byte, its length in words, the rest.
    static func request(_ opcode: UInt8, _ data: UInt8, _ body: [UInt8]) -> [UInt8] {
        [opcode, data] + u16((4 + body.count) / 4) + body
    }

    /// InternAtom, only if it exists (an atom nobody made: no owner).
    static func internAtom(_ name: String) -> [UInt8] {
        let bytes = Array(name.utf8)
        return request(16, 1, u16(bytes.count) + [0, 0] + padded(bytes))
    }

    static func queryExtension(_ name: String) -> [UInt8] {
        let bytes = Array(name.utf8)
        return request(98, 0, u16(bytes.count) + [0, 0] + padded(bytes))
    }
}

/// One wait for a descriptor or a deadline, resumed once: the descriptor's
/// handler and the timer run on the loop, the waiter on whatever executor
/// called (the service's is the loop; a test's is not), so its state is
/// behind a lock.
private final class FDWait: Sendable {
    private struct State {
        var continuation: CheckedContinuation<Bool, Never>?
        var outcome: Bool?
    }
    private let state = Mutex(State())

    /// Keeps `continuation`, or resumes it at once if the wait is over already.
    func start(_ continuation: CheckedContinuation<Bool, Never>) {
        let outcome = state.withLock { s -> Bool? in
            if s.outcome == nil { s.continuation = continuation }
            return s.outcome
        }
        if let outcome { continuation.resume(returning: outcome) }
    }

    func finish(_ ready: Bool) {
        let continuation = state.withLock { s -> CheckedContinuation<Bool, Never>? in
            guard s.outcome == nil else { return nil }
            s.outcome = ready
            defer { s.continuation = nil }
            return s.continuation
        }
        continuation?.resume(returning: ready)
    }
}
