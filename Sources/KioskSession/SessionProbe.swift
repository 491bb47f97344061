import CProcess
import Glibc
import GuidedAccessCore

/// The kiosk's graphical session as the service finds it: its displays and
/// the compositor behind them.
public struct SessionDisplay: Hashable, Sendable, CustomStringConvertible {
    /// `WAYLAND_DISPLAY` as a program gets it (a name in XDG_RUNTIME_DIR, or a path).
    public var waylandDisplay: String?
    /// The process serving the Wayland socket, by its name (`sway`).
    public var compositor: String?
    public var compositorPID: Int32?
    /// `DISPLAY` (`:0`).
    public var x11Display: String?
    /// `XAUTHORITY` for that display, where it needs one.
    public var xauthority: String?

    public init() {}

    public var description: String {
        var parts: [String] = []
        if let waylandDisplay { parts.append("WAYLAND_DISPLAY=\(waylandDisplay)") }
        if let compositor { parts.append("compositor \(compositor)") }
        if let x11Display { parts.append("DISPLAY=\(x11Display)") }
        if let xauthority { parts.append("XAUTHORITY=\(xauthority)") }
        return parts.isEmpty ? "no display" : parts.joined(separator: ", ")
    }
}

/// Reads what `Desktop.detect` and the screen reader need from the
/// service's environment, the sockets of the session's displays and the
/// installed files. Nothing here is trusted for security: it only decides
/// what the service offers.
public struct SessionProbe: Sendable {
    public let environment: [String: String]

    public init(environment: [String: String]) {
        self.environment = environment
    }

    /// This process's whole environment, as `environ` has it: in user mode
    /// (and for the session agent, and guidedaccessctl) the session's.
    public static func processEnvironment() -> [String: String] {
        var result: [String: String] = [:]
        var entry = environ
        while let pointer = entry.pointee {
            let text = String(cString: pointer)
            if let equals = text.firstIndex(of: "=") {
                result[String(text[..<equals])] = String(text[text.index(after: equals)...])
            }
            entry += 1
        }
        return result
    }

    public var runtimeDirectory: String? { environment["XDG_RUNTIME_DIR"] }
    public static let x11SocketDirectory = "/tmp/.X11-unix"

    // MARK: Displays

    /// The session's displays: from `WAYLAND_DISPLAY` and `DISPLAY`, else
    /// from the sockets there are — the first `wayland-N` in
    /// XDG_RUNTIME_DIR that answers, and an X socket of that compositor's
    /// Xwayland (whose `-auth` file, if any, is the XAUTHORITY); without a
    /// Wayland display, the user's X server (`x11Server`). A service
    /// started by systemd or D-Bus activation has neither variable unless
    /// the session imported them.
    public func display() -> SessionDisplay {
        var display = SessionDisplay()
        if let name = environment["WAYLAND_DISPLAY"] {
            display.waylandDisplay = name
            display.compositorPID = Self.peer(ofSocket: waylandSocketPath(name))
        } else if let runtimeDirectory {
            for name in Self.entries(of: runtimeDirectory).filter(Self.isWaylandSocketName).sorted() {
                if let pid = Self.peer(ofSocket: runtimeDirectory + "/" + name) {
                    display.waylandDisplay = name
                    display.compositorPID = pid
                    break
                }
            }
        }
        display.compositor = display.compositorPID.flatMap(ProcessTable.name(of:))
        if let x = environment["DISPLAY"] {
            display.x11Display = x
            display.xauthority = environment["XAUTHORITY"]
        } else if let compositorPID = display.compositorPID {
            // The compositor's Xwayland says its display and -auth file on
            // its command line (mutter); one started on demand (wlroots)
            // does not run yet, but the compositor holds its socket.
            let xwayland = ProcessTable.children(of: compositorPID).first { ProcessTable.name(of: $0) == "Xwayland" }
            if let xwayland {
                let arguments = ProcessTable.arguments(of: xwayland)
                display.x11Display = arguments.dropFirst().first { $0.hasPrefix(":") }
                if let i = arguments.firstIndex(of: "-auth"), i + 1 < arguments.count {
                    display.xauthority = arguments[i + 1]
                }
            } else {
                display.x11Display = Self.x11DisplayHeld(by: compositorPID)
            }
        } else if display.waylandDisplay == nil, let server = Self.x11Server(for: getuid()) {
            // A bare X session (Xorg or Xvfb and a window manager) whose
            // variables the service was not given.
            display.x11Display = server.display
            display.xauthority = xauthority(ofServer: server.pid)
        }
        return display
    }

    /// The X server of the user `uid`'s session, found by its socket in
    /// /tmp/.X11-unix: the lowest-numbered display whose server runs as
    /// `uid` (rootless Xorg, Xvfb, startx), else as root (Xorg a display
    /// manager started). Sockets that do not answer are left out.
    static func x11Server(for uid: uid_t, in directory: String = x11SocketDirectory) -> (display: String, pid: Int32)? {
        var own: [(Int, Int32)] = [], root: [(Int, Int32)] = []
        for name in entries(of: directory) {
            guard name.hasPrefix("X"), let number = Int(name.dropFirst()), number >= 0,
                let fd = UnixSocket.connect(directory + "/" + name)
            else { continue }
            let pid = ga_socket_peer_pid(fd), owner = ga_socket_peer_uid(fd)
            close(fd)
            guard pid > 0 else { continue }
            if owner == uid { own.append((number, pid)) } else if owner == 0 { root.append((number, pid)) }
        }
        guard let (number, pid) = own.min(by: { $0.0 < $1.0 }) ?? root.min(by: { $0.0 < $1.0 }) else { return nil }
        return (":\(number)", pid)
    }

    /// Whether a display socket appeared in the last `seconds` that does
    /// not answer yet: a server makes its socket (which the watch sees)
    /// before it listens, so detection right then passes it over.
    public func newSocketNotListening(within seconds: Int = 5) -> Bool {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var candidates = Self.entries(of: Self.x11SocketDirectory).filter { DisplaySocketWatch.isDisplayName(Substring($0)) && $0.hasPrefix("X") }
            .map { Self.x11SocketDirectory + "/" + $0 }
        if let runtimeDirectory {
            candidates += Self.entries(of: runtimeDirectory).filter(Self.isWaylandSocketName).map { runtimeDirectory + "/" + $0 }
        }
        // Asked of the kernel's table, never by connecting: a connection to
        // a compositor's X socket would start its Xwayland.
        var listening: Set<String>?
        for path in candidates {
            var info = stat()
            guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK, now.tv_sec - info.st_ctim.tv_sec <= seconds
            else { continue }
            if listening == nil { listening = Self.listeningSocketPaths() }
            if listening?.contains(path) == false { return true }
        }
        return false
    }

    /// The paths of the unix sockets that listen (`/proc/net/unix`: Flags
    /// has __SO_ACCEPTCON, 0x10000).
    static func listeningSocketPaths() -> Set<String> {
        guard let table = (try? FileContents.read("/proc/net/unix")) ?? nil else { return [] }
        var paths: Set<String> = []
        // Num RefCount Protocol Flags Type St Inode Path
        for line in String(decoding: table, as: UTF8.self).split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 8, let flags = UInt32(fields[3], radix: 16), flags & 0x10000 != 0 else { continue }
            paths.insert(String(fields[7]))
        }
        return paths
    }

    /// The authority file for the X server `pid`: its `-auth` file where
    /// the service may read it, else the one a display manager or `startx`
    /// writes for the user (gdm's in XDG_RUNTIME_DIR, ~/.Xauthority); nil:
    /// none (a server without access control, as Xvfb without `-auth`).
    func xauthority(ofServer pid: Int32) -> String? {
        let arguments = ProcessTable.arguments(of: pid)
        if let i = arguments.firstIndex(of: "-auth"), i + 1 < arguments.count, access(arguments[i + 1], R_OK) == 0 {
            return arguments[i + 1]
        }
        let candidates = [runtimeDirectory.map { $0 + "/gdm/Xauthority" }, environment["HOME"].map { $0 + "/.Xauthority" }]
        return candidates.compactMap { $0 }.first { access($0, R_OK) == 0 }
    }

    private func waylandSocketPath(_ name: String) -> String {
        name.hasPrefix("/") ? name : (runtimeDirectory ?? "") + "/" + name
    }

    static func isWaylandSocketName(_ name: String) -> Bool {
        name.hasPrefix("wayland-") && !name.hasSuffix(".lock")
    }

    /// The evidence for `Desktop.detect`.
    func evidence(busNames: Set<String>, display: SessionDisplay) -> DesktopEvidence {
        DesktopEvidence(
            busNames: busNames, waylandDisplay: display.waylandDisplay, waylandCompositor: display.compositor,
            currentDesktop: environment["XDG_CURRENT_DESKTOP"], x11Display: display.x11Display)
    }

    // MARK: Installed programs

    /// The programs installed, for `ProgramKind.unavailableReason`.
    public var installation: ProgramInstallation {
        ProgramInstallation(executable: { [self] in executable($0) }, speechOutputModules: Self.speechOutputModules())
    }

    /// `name` on PATH (absolute path), or nil.
    public func executable(_ name: String) -> String? {
        let path = environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        for directory in path.split(separator: ":") where directory.hasPrefix("/") {
            let candidate = directory + "/" + name
            var info = stat()
            if stat(candidate, &info) == 0, info.st_mode & S_IFMT == S_IFREG, access(candidate, X_OK) == 0 {
                return candidate
            }
        }
        return nil
    }

    /// speech-dispatcher's output modules, but its dummy one (which only
    /// plays a recording saying speech is not available).
    static func speechOutputModules() -> [String] {
        var found: [String] = []
        for directory in ["/usr/lib/speech-dispatcher-modules", "/usr/libexec/speech-dispatcher-modules"]
            + entries(of: "/usr/lib").map({ "/usr/lib/\($0)/speech-dispatcher-modules" })
        {
            found += entries(of: directory).filter { $0.hasPrefix("sd_") && $0 != "sd_dummy" }
        }
        return found.sorted()
    }

    /// System mode: whether the installed desktop starts a screen reader
    /// from `screen-reader-enabled` by itself — Orca's autostart entry, whose
    /// condition is that key (gnome-session, GNOME ≤ 48), or
    /// `orca.service`, which gnome-settings-daemon starts (GNOME ≥ 49).
    public static func desktopStartsScreenReader() -> Bool {
        let entries: [String] = [
            "/etc/xdg/autostart/orca-autostart.desktop", "/usr/lib/systemd/user/orca.service",
            "/etc/systemd/user/orca.service",
        ]
        return entries.contains { access($0, F_OK) == 0 }
    }

    // MARK: Sockets and directories

    /// The pid serving a unix stream socket, asked of the kernel by
    /// connecting (SO_PEERCRED); nil when nothing listens there.
    static func peer(ofSocket path: String) -> Int32? {
        guard let fd = UnixSocket.connect(path) else { return nil }
        defer { close(fd) }
        let pid = ga_socket_peer_pid(fd)
        return pid > 0 ? pid : nil
    }

    /// The X display whose listening socket `pid` holds (a compositor that
    /// starts Xwayland on demand), found in /proc — never by connecting,
    /// which would start that Xwayland.
    static func x11DisplayHeld(by pid: Int32) -> String? {
        guard let table = try? FileContents.read("/proc/net/unix") else { return nil }
        // Num RefCount Protocol Flags Type St Inode Path; St 01 = listening.
        var displays: [UInt64: String] = [:]
        for line in String(decoding: table, as: UTF8.self).split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 8, fields[5] == "01", let inode = UInt64(fields[6]) else { continue }
            var path = fields[7]
            if path.hasPrefix("@") { path = path.dropFirst() }
            guard path.hasPrefix(x11SocketDirectory + "/X") else { continue }
            let number = path.dropFirst(x11SocketDirectory.count + 2)
            if !number.isEmpty, number.allSatisfy(\.isNumber) { displays[inode] = ":" + number }
        }
        guard !displays.isEmpty else { return nil }
        var held: [String] = []
        for fd in entries(of: "/proc/\(pid)/fd") {
            var buffer = [CChar](repeating: 0, count: 64)
            let n = readlink("/proc/\(pid)/fd/\(fd)", &buffer, buffer.count - 1)
            guard n > 0 else { continue }
            let target = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            guard target.hasPrefix("socket:["), let inode = UInt64(target.dropFirst(8).dropLast()),
                let display = displays[inode]
            else { continue }
            held.append(display)
        }
        return held.min { $0.count != $1.count ? $0.count < $1.count : $0 < $1 }
    }

    /// The names in a directory (none when it cannot be read).
    public static func entries(of directory: String) -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }
}

enum UnixSocket {
    /// A non-blocking, close-on-exec stream socket connected to `path`; nil
    /// when nothing listens there.
    static func connect(_ path: String) -> Int32? {
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
        let fd = socket(AF_UNIX, type, 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(fd)
            return nil
        }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard connected == 0 else {
            close(fd)
            return nil
        }
        return fd
    }
}
