import ArgumentParser
import DBus
import GuidedAccessClient
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

// MARK: - browser

struct BrowserLauncher: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "browser",
        abstract: "Run the kiosk browser with its DevTools on a pipe that only the service gets (no TCP port).",
        discussion: """
            Runs COMMAND (Chromium or another Chromium-based browser) with --remote-debugging-pipe: \
            the browser's DevTools on file descriptors 3 and 4, which no other process can reach. \
            guidedaccessctl stays the browser's parent, keeps the pipe and relays it to the service \
            (AttachBrowser), which then shows the session's features in the browser's pages. When the \
            service restarts, the browser stays open and is attached again as soon as the service is \
            back; what the old attachment set up in the pages is replaced, not doubled. Without a \
            service, or refused, the browser runs without the service's features (said once on \
            stderr). SIGTERM, SIGINT and SIGHUP are passed to the browser; guidedaccessctl exits with \
            the browser's exit status (128+N when signal N ended it).

            Example (in the kiosk user's session):
              guidedaccessctl browser -- chromium --kiosk https://kiosk.example/
            """)

    @OptionGroup var global: GlobalOptions

    @ArgumentParser.Argument(
        parsing: .captureForPassthrough,
        help: ArgumentHelp("The browser and its arguments.", valueName: "COMMAND"))
    var command: [String] = []

    func validate() throws {
        // `browser --help` asks for this help (a browser named --help is not one).
        if command.first == "--help" || command.first == "-h" { throw CleanExit.helpRequest(self) }
        if browserArguments.isEmpty { throw ValidationError("expected the browser to run: guidedaccessctl browser [--] COMMAND [ARG...]") }
    }

    /// The command as given, without a leading `--`.
    var browserArguments: [String] { command.first == "--" ? Array(command.dropFirst()) : command }

    func run() async throws {
        let relay: PipeRelay
        do {
            relay = try PipeRelay.launch(browserArguments)
        } catch {
            throw fail("cannot run \(browserArguments[0]): \(error.description)", .generic)
        }
        let bus = global.bus
        let attaching = Task { await Self.keepAttached(relay, bus: bus) }
        let status = await relay.exitStatus()
        attaching.cancel()
        Glibc.exit(status)
    }

    /// Attaches the browser to the service, and again each time the
    /// service went, until the browser exits. Says each refusal once.
    static func keepAttached(_ relay: PipeRelay, bus: Bus) async {
        var said: String?
        var delay: Duration = .milliseconds(100)
        var attachedBefore = false
        /// Whether to wait `delay` before the next attempt (the first, and
        /// the first after a service that held the browser a while, go at once).
        var wait = false
        // The service coming onto the bus ends a wait at once.
        let appeared = Alarm()
        let watch = Task { await watchForService(bus, appeared) }
        defer { watch.cancel() }
        // One connection for every attempt while the bus keeps it; a new
        // one once it dropped it.
        var client: GuidedAccessClient?
        while !Task.isCancelled {
            if wait {
                await appeared.wait(atMost: delay)
                delay = min(delay * 2, .seconds(5))
            }
            var pair: [Int32] = [-1, -1]
            guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
                printToStderr("guidedaccessctl browser: socketpair: \(String(cString: strerror(errno)))")
                return
            }
            // Relayed before the call: the service asks the browser its
            // version before it answers. A failed call closes the service's
            // end, which ends the relay's attachment.
            guard let ended = relay.attach(pair[0]) else {  // the browser has exited
                close(pair[1])
                return
            }
            let attached: Result<Void, GuidedAccessError>
            do throws(GuidedAccessError) {
                if let old = client, await !old.connection.isConnected { client = nil }
                let current: GuidedAccessClient
                if let client {
                    current = client
                } else {
                    current = try await GuidedAccessClient.connect(bus: bus)
                    client = current
                }
                // The same connection attaching again replaces its earlier attachment.
                try await current.attachBrowser(socket: pair[1])
                attached = .success(())
            } catch {
                attached = .failure(error)
            }
            close(pair[1])  // the message carried a copy
            switch attached {
            case .success:
                printToStderr(
                    "guidedaccessctl browser: \(attachedBefore ? "attached again" : "attached"): the service shows the session's features in the browser's pages")
                attachedBefore = true
                said = nil
                let since = ContinuousClock.now
                await ended.wait()
                // A service that let go soon (a browser it finds too slow,
                // a service that crashes as it attaches) is tried ever more
                // slowly; one that held it a while at once, and as a first.
                if ContinuousClock.now - since >= .seconds(10) {
                    delay = .milliseconds(100)
                    wait = false
                } else {
                    wait = true
                }
                guard !relay.browserExited else { return }
                printToStderr("guidedaccessctl browser: the service let go of the browser; attaching again when it is back")
            case .failure(let error):
                relay.letGo(ended)
                await ended.wait()
                guard !relay.browserExited else { return }
                let reason = error.message
                if reason != said {
                    said = reason
                    printToStderr(
                        "guidedaccessctl browser: not attached (\(error.dbusErrorName)): \(reason); the browser runs without the service's features until it is")
                }
                // No service yet: look again, ever more slowly up to every
                // 5 s. A refusal (which the configuration may lift, and
                // each of which the service audits): every minute.
                wait = true
                if case .notAuthorized = error { delay = .seconds(60) }
                if case .interactiveAuthorizationRequired = error { delay = .seconds(60) }
            }
        }
    }
}

/// Bytes waiting for a non-blocking descriptor, written as it takes them.
struct Outbox {
    private var bytes: [UInt8] = []
    private var head = 0

    var waiting: Int { bytes.count - head }

    mutating func append<S: Sequence<UInt8>>(_ more: S) { bytes.append(contentsOf: more) }

    mutating func clear() {
        bytes = []
        head = 0
    }

    /// Writes what `write(pointer, count)` takes now; false when it failed
    /// (anything but EAGAIN and EINTR).
    mutating func writeSome(_ write: (UnsafeRawPointer, Int) -> Int) -> Bool {
        let n = bytes.withUnsafeBytes { write($0.baseAddress! + head, $0.count - head) }
        guard n > 0 else { return n == 0 || errno == EAGAIN || errno == EINTR }
        head += n
        if head == bytes.count {
            bytes.removeAll(keepingCapacity: bytes.capacity <= 1 << 20)
            head = 0
        }
        return true
    }
}

/// Pokes `appeared` each time the service's name gets an owner, for as
/// long as the task runs (nothing when there is no bus to watch).
func watchForService(_ bus: Bus, _ appeared: Alarm) async {
    guard let connection = try? await Connection.connect(to: bus),
        let changes = try? await connection.signals(matching: .nameOwnerChanged(for: GuidedAccessBus.name))
    else { return }
    for await change in changes {
        if let arguments = try? change.arguments(), arguments.count == 3, case .string(let owner) = arguments[2],
            !owner.isEmpty
        {
            appeared.poke()
        }
    }
    _ = connection
}

/// A wait that ends early when poked (a poke with no one waiting ends the next wait).
final class Alarm: Sendable {
    private let state = Mutex<(poked: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

    func poke() {
        state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter.take() { return waiter }
            state.poked = true
            return nil
        }?.resume()
    }

    func wait(atMost duration: Duration) async {
        let timer = Task { [self] in
            try? await Task.sleep(for: duration)
            poke()
        }
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.poked {
                    state.poked = false
                    return true
                }
                state.waiter = continuation
                return false
            }
            if now { continuation.resume() }
        }
        timer.cancel()
    }
}

/// The browser's DevTools pipe, kept by the launcher and relayed to the
/// service's socket while one is attached.
///
/// Chromium reads commands on its fd 3 and writes replies and events on
/// its fd 4, each message NUL-terminated, and exits when the pipe closes:
/// so the launcher, not the service, holds it, and a service that goes
/// (crash, restart) does not take the browser with it. One thread runs a
/// poll loop over the browser's pipe, the service's socket and a wake-up
/// pipe (signals, a new attachment); every descriptor is non-blocking and
/// what waits is bounded:
/// - browser → service: passed on as it comes, starting at a message's
///   beginning, and read only while less than `backlogLimit` waits for
///   the service (a service slower than the browser's stream slows the
///   browser's writes, as TCP does on a WebSocket); read and dropped while
///   nothing is attached.
/// - service → browser: only whole messages go to the browser, so a
///   service that dies mid-message leaves none cut in the pipe; read from
///   the service only while less than `backlogLimit` waits for the browser.
/// - when an attachment the service spoke on ends, the launcher turns auto-attach off in the
///   browser, which detaches the pages the service had attached (their
///   document scripts and emulation go with them); the next service finds
///   and removes the style the pages still show.
final class PipeRelay: Sendable {
    private let pid: pid_t
    /// The browser's fd 3 (it reads) and fd 4 (it writes), our ends.
    private let toBrowser: Int32
    private let fromBrowser: Int32
    private let state = Mutex(State())

    struct State {
        var pendingAttachment: Int32?
        var ended: Ended?
        /// The attachment to let go of (its AttachBrowser failed).
        var letGo: Ended?
        var exitStatus: Int32?
        var exitWaiters: [CheckedContinuation<Int32, Never>] = []
    }

    /// Bytes waiting for the service (or for the browser) past which the
    /// launcher stops reading the other side until they have gone.
    static let backlogLimit = 1 << 20
    /// The longest message taken from the service (Chromium's own limit is larger; the service's are small).
    static let messageLimit = 16 << 20
    /// Ids of the launcher's own commands: above the service's (`DevToolsClient.pipeIDCeiling`).
    static let firstOwnID = (1 << 30) + 1

    /// The write end of the pipe that wakes the poll loop (from signal handlers too).
    nonisolated(unsafe) static var wakeWrite: Int32 = -1
    nonisolated(unsafe) static var wakeRead: Int32 = -1
    /// Signals caught, as a bit set, for the loop to pass to the browser.
    static let caught = Atomic<UInt64>(0)

    struct LaunchError: Error, CustomStringConvertible {
        let description: String
    }

    private init(pid: pid_t, toBrowser: Int32, fromBrowser: Int32) {
        self.pid = pid
        self.toBrowser = toBrowser
        self.fromBrowser = fromBrowser
    }

    /// Starts the browser with `--remote-debugging-pipe` and the relay's thread.
    static func launch(_ arguments: [String]) throws(LaunchError) -> PipeRelay {
        func pipeAbove(_ minimum: Int32) throws(LaunchError) -> (read: Int32, write: Int32) {
            var fds: [Int32] = [-1, -1]
            // (No other process is spawned meanwhile: the copies made below are close-on-exec.)
            guard pipe(&fds) == 0 else { throw LaunchError(description: "pipe: \(String(cString: strerror(errno)))") }
            // Above 4, so that the child's dup2 onto 3 and 4 never finds one already there.
            let read = fcntl(fds[0], F_DUPFD_CLOEXEC, minimum), write = fcntl(fds[1], F_DUPFD_CLOEXEC, minimum)
            close(fds[0])
            close(fds[1])
            guard read >= 0, write >= 0 else { throw LaunchError(description: "fcntl: \(String(cString: strerror(errno)))") }
            return (read, write)
        }
        let commands = try pipeAbove(10), replies = try pipeAbove(10)
        var wake: [Int32] = [-1, -1]
        guard pipe(&wake) == 0 else {
            throw LaunchError(description: "pipe: \(String(cString: strerror(errno)))")
        }
        for fd in wake {
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        }
        wakeRead = wake[0]
        wakeWrite = wake[1]

        // Made before a handler can touch it (a static is made on first use).
        _ = caught.load(ordering: .relaxed)
        for signal in [SIGTERM, SIGINT, SIGHUP, SIGCHLD] {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { number in
                let saved = errno
                PipeRelay.caught.bitwiseOr(1 << UInt64(number), ordering: .relaxed)
                var byte: UInt8 = 1
                _ = write(PipeRelay.wakeWrite, &byte, 1)
                errno = saved
            }
            action.sa_flags = SA_RESTART
            sigemptyset(&action.sa_mask)
            sigaction(signal, &action, nil)
        }
        // A service socket closed under a write is an error to handle, not a signal.
        signal(SIGPIPE, SIG_IGN)

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, commands.read, 3)
        posix_spawn_file_actions_adddup2(&actions, replies.write, 4)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGTERM, SIGINT, SIGHUP, SIGCHLD, SIGPIPE] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        // A process group of its own: Ctrl-C on a terminal reaches the
        // launcher, which passes it on once (Chromium takes a second
        // signal as "exit now", without its clean shutdown).
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(
            &attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP))

        let argv = [arguments[0], "--remote-debugging-pipe"] + arguments.dropFirst()
        var cArguments = argv.map { strdup($0) } + [nil]
        defer { for argument in cArguments { free(argument) } }
        var pid: pid_t = 0
        let result = posix_spawnp(&pid, arguments[0], &actions, &attributes, &cArguments, environ)
        close(commands.read)
        close(replies.write)
        guard result == 0 else {
            close(commands.write)
            close(replies.read)
            throw LaunchError(description: String(cString: strerror(result)))
        }
        for fd in [commands.write, replies.read] { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        let relay = PipeRelay(pid: pid, toBrowser: commands.write, fromBrowser: replies.read)
        relay.startThread()
        return relay
    }

    /// Whether the browser has exited.
    var browserExited: Bool { state.withLock { $0.exitStatus != nil } }

    /// The browser's exit status (128+N for signal N), once it has exited.
    func exitStatus() async -> Int32 {
        await withCheckedContinuation { continuation in
            let done: Int32? = state.withLock { state in
                if let status = state.exitStatus { return status }
                state.exitWaiters.append(continuation)
                return nil
            }
            if let done { continuation.resume(returning: done) }
        }
    }

    /// Relays the pipe to `socket` (the launcher's end; the service has the
    /// other) from now on; what tells when that attachment ended. Nil when
    /// the browser has exited (the socket is closed).
    func attach(_ socket: Int32) -> Ended? {
        _ = fcntl(socket, F_SETFL, fcntl(socket, F_GETFL) | O_NONBLOCK)
        let ended = Ended()
        let taken = state.withLock { state -> Bool in
            guard state.exitStatus == nil else { return false }
            if let old = state.pendingAttachment { close(old) }
            state.pendingAttachment = socket
            state.ended = ended
            return true
        }
        guard taken else {
            close(socket)
            return nil
        }
        Self.wake()
        return ended
    }

    /// Lets go of the attachment `ended` tells of, if it is still relayed
    /// (its AttachBrowser failed: the service may still hold its socket).
    func letGo(_ ended: Ended) {
        state.withLock { $0.letGo = ended }
        Self.wake()
    }

    /// Resumed once, when an attachment's socket closed (or the browser exited).
    final class Ended: Sendable {
        private let state = Mutex<(done: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

        func wait() async {
            await withCheckedContinuation { continuation in
                let done = state.withLock { state -> Bool in
                    if state.done { return true }
                    state.waiter = continuation
                    return false
                }
                if done { continuation.resume() }
            }
        }

        func resume() {
            state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.done = true
                return state.waiter.take()
            }?.resume()
        }
    }

    private static func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    private func startThread() {
        var thread = pthread_t()
        let context = Unmanaged.passRetained(self).toOpaque()
        pthread_create(&thread, nil, { context in
            let relay = Unmanaged<PipeRelay>.fromOpaque(context!).takeRetainedValue()
            relay.loop()
            return nil
        }, context)
        pthread_detach(thread)
    }

    // MARK: The loop (its thread only)

    private func loop() {
        var service: Int32 = -1
        var ended: Ended?
        /// Browser → service bytes waiting.
        var toService = Outbox()
        /// Whether the browser's stream is between messages (a new
        /// attachment starts there).
        var browserAtBoundary = true
        /// Skipping the rest of a message begun before the attachment.
        var skippingToBoundary = false
        /// Whether the service sent anything in this attachment (then,
        /// when it ends, what it set up in the browser is let go of).
        var serviceSpoke = false
        /// Service → browser: whole messages waiting, and the message being read.
        var toBrowserQueue = Outbox()
        var partial: [UInt8] = []
        var nextOwnID = Self.firstOwnID
        var buffer = [UInt8](repeating: 0, count: 65536)
        /// The browser closed its end of the pipe (it is exiting).
        var browserClosed = false
        /// The browser closed the end it reads commands from.
        var browserDeaf = false

        func detach(_ why: String?) {
            guard service >= 0 else { return }
            close(service)
            service = -1
            toService.clear()
            partial = []
            if let why { printToStderr("guidedaccessctl browser: \(why)") }
            ended?.resume()
            ended = nil
            guard serviceSpoke else { return }
            serviceSpoke = false
            // The pages the service attached go with auto-attach (and their
            // document scripts and emulation with them).
            let command =
                "{\"id\":\(nextOwnID),\"method\":\"Target.setAutoAttach\",\"params\":{\"autoAttach\":false,\"waitForDebuggerOnStart\":false,\"flatten\":true}}"
            nextOwnID += 1
            toBrowserQueue.append(Array(command.utf8) + [0])
        }

        while true {
            // Signals and attachments.
            while read(Self.wakeRead, &buffer, buffer.count) > 0 {}
            let signals = Self.caught.exchange(0, ordering: .relaxed)
            for number in [SIGTERM, SIGINT, SIGHUP] where signals & (1 << UInt64(number)) != 0 {
                kill(pid, number)
            }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
                if service >= 0 { close(service) }
                let (waiters, pendingSocket, endedNow) = state.withLock { state in
                    state.exitStatus = code
                    let waiters = state.exitWaiters
                    state.exitWaiters = []
                    let pending = state.pendingAttachment
                    state.pendingAttachment = nil
                    return (waiters, pending, state.ended.take())
                }
                if let pendingSocket { close(pendingSocket) }
                ended?.resume()
                endedNow?.resume()
                for waiter in waiters { waiter.resume(returning: code) }
                return
            }
            if let stale = state.withLock({ $0.letGo.take() }) {
                if stale === ended {
                    detach(nil)
                } else if state.withLock({ $0.ended === stale && $0.pendingAttachment != nil }) {
                    // Not taken up yet: dropped before it is.
                    if let socket = state.withLock({ $0.pendingAttachment.take() }) { close(socket) }
                    stale.resume()
                }
            }
            if let (socket, newEnded) = state.withLock({ state -> (Int32, Ended?)? in
                guard let socket = state.pendingAttachment else { return nil }
                state.pendingAttachment = nil
                return (socket, state.ended)
            }) {
                detach(nil)
                service = socket
                ended = newEnded
                skippingToBoundary = !browserAtBoundary
            }

            var fds = [
                pollfd(fd: Self.wakeRead, events: Int16(POLLIN), revents: 0),
                // The browser's stream is read only as fast as the service
                // takes it (as TCP would make a browser's WebSocket wait);
                // with no service attached it is read and dropped.
                pollfd(
                    fd: browserClosed || (service >= 0 && toService.waiting >= Self.backlogLimit)
                        ? -1 : fromBrowser,
                    events: Int16(POLLIN), revents: 0),
                // Not polled once it failed: POLLERR is reported whatever is asked.
                pollfd(
                    fd: browserDeaf ? -1 : toBrowser, events: toBrowserQueue.waiting > 0 ? Int16(POLLOUT) : 0,
                    revents: 0),
                // The service's commands are read only while the browser
                // takes them: a browser that stops reading holds the service up.
                pollfd(
                    fd: service,
                    events: (toBrowserQueue.waiting < Self.backlogLimit ? Int16(POLLIN) : 0)
                        | (toService.waiting > 0 ? Int16(POLLOUT) : 0), revents: 0),
            ]
            if poll(&fds, nfds_t(fds.count), -1) < 0 {
                // EINTR: a signal, handled at the top. Anything else (no
                // memory) passes; the loop must go on to see the browser exit.
                if errno != EINTR { usleep(100_000) }
                continue
            }

            // The browser's replies and events.
            if fds[1].revents != 0 {
                let n = read(fromBrowser, &buffer, buffer.count)
                if n > 0 {
                    var start = 0
                    if skippingToBoundary {
                        if let nul = buffer[..<n].firstIndex(of: 0) {
                            skippingToBoundary = false
                            start = nul + 1
                        } else {
                            start = n
                        }
                    }
                    browserAtBoundary = buffer[n - 1] == 0
                    if service >= 0, start < n { toService.append(buffer[start..<n]) }
                } else if n == 0 {
                    // The browser closed its end: it is exiting; waitpid tells.
                    browserClosed = true
                }
            }
            if fds[3].revents & Int16(POLLOUT) != 0, service >= 0,
                !toService.writeSome({ send(service, $0, $1, Int32(MSG_NOSIGNAL)) })
            {
                detach(nil)
            }
            // The service's commands: whole messages only.
            if service >= 0, fds[3].revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 {
                let n = read(service, &buffer, buffer.count)
                if n > 0 {
                    var start = 0
                    while let nul = buffer[start..<n].firstIndex(of: 0) {
                        serviceSpoke = true
                        toBrowserQueue.append(partial)
                        toBrowserQueue.append(buffer[start...nul])
                        partial = []
                        start = nul + 1
                    }
                    partial += buffer[start..<n]
                    if partial.count > Self.messageLimit {
                        detach("the service sent a DevTools message over \(Self.messageLimit >> 20) MiB; letting go of it")
                    }
                } else if n == 0 || (errno != EAGAIN && errno != EINTR) {
                    detach(nil)
                }
            }
            if fds[2].revents & Int16(POLLERR | POLLHUP) != 0 {
                browserDeaf = true
            } else if fds[2].revents & Int16(POLLOUT) != 0, toBrowserQueue.waiting > 0,
                !toBrowserQueue.writeSome({ write(toBrowser, $0, $1) })
            {
                browserDeaf = true
            }
            if browserDeaf {
                toBrowserQueue.clear()
            }
        }
    }
}
