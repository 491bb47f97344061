import CLinux
import Glibc
import Synchronization

/// A single-threaded event loop over epoll that is also a Swift
/// `SerialExecutor` and `TaskExecutor`: the connection actor, the actors of
/// a service that share it, and the nonisolated code of tasks that prefer it
/// (method handlers) all run on its thread, in the order they were
/// enqueued, between waits for file descriptors. It never wakes without cause: it sleeps in `epoll_wait`
/// with no timeout until a descriptor is ready or work is enqueued.
public final class EventLoop: SerialExecutor, TaskExecutor, @unchecked Sendable {
    /// Identifies a registered descriptor.
    public struct SourceToken: Hashable, Sendable {
        let value: UInt64
    }

    private enum Work {
        case job(UnownedJob)
        case callback(@Sendable () -> Void)
    }

    private struct Shared {
        /// Queued work from `head` on (taken from the front without
        /// moving the rest).
        var work: [Work] = []
        var head = 0
        var handlers: [UInt64: @Sendable (UInt32) -> Void] = [:]
        var nextToken: UInt64 = 1
        /// The loop thread is in (or about to enter) epoll_wait.
        var sleeping = false
        var wakePending = false
        var stopping = false
    }

    private let epollFD: Int32
    private let wakeFD: Int32
    private let shared = Mutex(Shared())
    private let thread = Atomic<UInt>(0)
    private static let wakeToken: UInt64 = 0
    /// Jobs run between two looks at the descriptors.
    static let jobsPerPoll = 64

    public init() {
        epollFD = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakeFD = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        precondition(epollFD >= 0 && wakeFD >= 0, "cannot create epoll or eventfd descriptors: errno \(errno)")
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.u64 = EventLoop.wakeToken
        precondition(epoll_ctl(epollFD, EPOLL_CTL_ADD, wakeFD, &event) == 0)
    }

    deinit {
        close(wakeFD)
        close(epollFD)
    }

    /// Starts a loop on a thread of its own.
    public static func spawn() -> EventLoop {
        let loop = EventLoop()
        loop.start()
        return loop
    }

    /// Runs the loop on a new thread, which inherits the caller's signal mask.
    public func start() {
        let context = Unmanaged.passRetained(self).toOpaque()
        var tid = pthread_t()
        let result = pthread_create(
            &tid, nil,
            { raw in
                let loop = Unmanaged<EventLoop>.fromOpaque(raw!).takeRetainedValue()
                loop.run()
                return nil
            }, context)
        precondition(result == 0, "pthread_create failed: \(result)")
        pthread_detach(tid)
    }

    /// Whether the caller runs on the loop's thread.
    public var isCurrent: Bool {
        thread.load(ordering: .acquiring) == UInt(pthread_self())
    }

    /// Runs the loop on the calling thread until `stop()`.
    public func run() {
        thread.store(UInt(pthread_self()), ordering: .releasing)
        var events = [epoll_event](repeating: epoll_event(), count: 32)
        let executor = asUnownedSerialExecutor()
        let taskExecutor = asUnownedTaskExecutor()
        while true {
            // Run queued work until none is left (work may queue more, e.g. a
            // dispatch that starts a handler task), but poll for I/O after
            // `jobsPerPoll` jobs so descriptors are not starved: a backlog of
            // a thousand calls must not keep a caller's message unread.
            var idle = false
            var stopping = false
            var ran = 0
            while ran < Self.jobsPerPoll {
                let batch: [Work]? = shared.withLock { s in
                    if s.stopping { return nil }
                    let take = min(s.work.count - s.head, Self.jobsPerPoll - ran)
                    let w = Array(s.work[s.head..<(s.head + take)])
                    s.head += take
                    if s.head == s.work.count {
                        s.work.removeAll(keepingCapacity: true)
                        s.head = 0
                    } else if s.head >= 1024, s.head * 2 >= s.work.count {
                        // A backlog that never empties: what was taken goes (amortised).
                        s.work.removeFirst(s.head)
                        s.head = 0
                    }
                    return w
                }
                guard let batch else {
                    stopping = true
                    break
                }
                ran += batch.count
                for item in batch {
                    switch item {
                    case .job(let job): job.runSynchronously(isolatedTo: executor, taskExecutor: taskExecutor)
                    case .callback(let body): body()
                    }
                }
                idle = shared.withLock { s in
                    let idle = s.head == s.work.count && !s.stopping
                    s.sleeping = idle
                    return idle
                }
                if idle { break }
            }
            if stopping { break }
            let count = events.withUnsafeMutableBufferPointer {
                epoll_wait(epollFD, $0.baseAddress, Int32($0.count), idle ? -1 : 0)
            }
            if idle { shared.withLock { $0.sleeping = false } }
            if count < 0 {
                if errno == EINTR { continue }
                fatalError("epoll_wait failed: errno \(errno)")
            }
            for i in 0..<Int(count) {
                let token = events[i].data.u64
                if token == EventLoop.wakeToken {
                    var value: UInt64 = 0
                    _ = read(wakeFD, &value, 8)
                    shared.withLock { $0.wakePending = false }
                    continue
                }
                // A handler may have been removed by an earlier one in this batch.
                if let handler = shared.withLock({ $0.handlers[token] }) {
                    handler(events[i].events)
                }
            }
        }
        thread.store(0, ordering: .releasing)
    }

    /// Ends `run()` after the work at hand.
    public func stop() {
        shared.withLock { $0.stopping = true }
        wake(force: true)
    }

    // MARK: Work

    public func enqueue(_ job: consuming ExecutorJob) {
        enqueue(.job(UnownedJob(job)))
    }

    /// Runs `body` on the loop's thread, after what is already queued.
    public func execute(_ body: @escaping @Sendable () -> Void) {
        enqueue(.callback(body))
    }

    private func enqueue(_ item: Work) {
        let mustWake = shared.withLock { s in
            s.work.append(item)
            guard s.sleeping, !s.wakePending else { return false }
            s.wakePending = true
            return true
        }
        if mustWake { writeWake() }
    }

    /// Wakes the loop if it sleeps, so that it looks at its queues again.
    public func wake(force: Bool = false) {
        let mustWake = shared.withLock { s in
            guard force || s.sleeping, !s.wakePending else { return false }
            s.wakePending = true
            return true
        }
        if mustWake { writeWake() }
    }

    private func writeWake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
        UnownedTaskExecutor(ordinary: self)
    }

    public func checkIsolated() {
        precondition(isCurrent, "not on the event loop's thread")
    }

    public func isIsolatingCurrentContext() -> Bool? {
        isCurrent
    }

    // MARK: Descriptors

    /// Watches `fd` for `events` (EPOLLIN, EPOLLOUT; 0 for none). `handler`
    /// runs on the loop's thread with the events that occurred.
    public func addSource(
        fd: Int32, events: UInt32, handler: @escaping @Sendable (UInt32) -> Void
    ) -> SourceToken {
        let token = shared.withLock { s in
            let token = s.nextToken
            s.nextToken += 1
            s.handlers[token] = handler
            return token
        }
        var event = epoll_event()
        event.events = events
        event.data.u64 = token
        if epoll_ctl(epollFD, EPOLL_CTL_ADD, fd, &event) != 0 {
            shared.withLock { _ = $0.handlers.removeValue(forKey: token) }
            return SourceToken(value: 0)
        }
        return SourceToken(value: token)
    }

    /// Changes the events a source waits for.
    public func updateSource(_ token: SourceToken, fd: Int32, events: UInt32) {
        guard token.value != 0 else { return }
        var event = epoll_event()
        event.events = events
        event.data.u64 = token.value
        _ = epoll_ctl(epollFD, EPOLL_CTL_MOD, fd, &event)
    }

    /// Stops watching; call before closing the descriptor.
    public func removeSource(_ token: SourceToken, fd: Int32) {
        guard token.value != 0 else { return }
        _ = epoll_ctl(epollFD, EPOLL_CTL_DEL, fd, nil)
        shared.withLock { _ = $0.handlers.removeValue(forKey: token.value) }
    }
}

/// The write end of the pipe the signal handler writes signal numbers to.
/// Written once before the handler is installed; read only by the handler.
nonisolated(unsafe) private var signalPipeWriteFD: Int32 = -1

extension EventLoop {
    /// Delivers the given signals (SIGTERM, SIGINT, …) to `handler` on the
    /// loop's thread. The signal handler only writes the signal's number to a
    /// pipe the loop watches (async-signal-safe), so this works whatever
    /// thread the kernel picks and whatever the threads' signal masks are.
    /// One set of signals per process.
    public func handleSignals(_ signals: [Int32], handler: @escaping @Sendable (Int32) -> Void) {
        var fds: [Int32] = [0, 0]
        precondition(pipe(&fds) == 0, "pipe failed: errno \(errno)")
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        let readFD = fds[0]
        signalPipeWriteFD = fds[1]
        _ = addSource(fd: readFD, events: EPOLLIN.rawValue) { _ in
            var numbers = [UInt8](repeating: 0, count: 64)
            while true {
                let n = read(readFD, &numbers, numbers.count)
                guard n > 0 else { break }
                for number in numbers[0..<n] { handler(Int32(number)) }
            }
        }
        for signal in signals {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { signal in
                var byte = UInt8(truncatingIfNeeded: signal)
                _ = write(signalPipeWriteFD, &byte, 1)
            }
            action.sa_flags = SA_RESTART
            sigemptyset(&action.sa_mask)
            sigaction(signal, &action, nil)
        }
    }
}

extension EventLoop {
    /// Suspends the calling task for `duration` on a timerfd of this loop —
    /// not on the global executor's timers, whose thread pool keeps a
    /// periodic timer of its own once used. Throws `CancellationError` when
    /// the task is cancelled.
    public func sleep(for duration: Duration) async throws {
        let fd = timerfd_create(CLOCK_MONOTONIC, Int32(TFD_NONBLOCK | TFD_CLOEXEC))
        precondition(fd >= 0, "timerfd_create failed: errno \(errno)")
        var spec = itimerspec()
        let (seconds, attoseconds) = duration.components
        let nanoseconds = max(max(seconds, 0) * 1_000_000_000 + max(attoseconds, 0) / 1_000_000_000, 1)
        spec.it_value.tv_sec = Int(nanoseconds / 1_000_000_000)
        spec.it_value.tv_nsec = Int(nanoseconds % 1_000_000_000)
        let sleeper = Sleeper(fd: fd, loop: self)
        defer { sleeper.release() }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, Error>) in
                sleeper.start(continuation) {
                    let token = addSource(fd: fd, events: EPOLLIN.rawValue) { _ in sleeper.finish(nil) }
                    sleeper.registered(token)
                    _ = timerfd_settime(fd, 0, &spec, nil)
                }
            }
        } onCancel: {
            sleeper.finish(CancellationError())
        }
    }
}

/// The state of one `sleep`: resumed exactly once, by the timer or by
/// cancellation, whichever comes first; its descriptor closed once.
private final class Sleeper: Sendable {
    private struct State {
        var continuation: CheckedContinuation<Void, Error>?
        var finished = false
        var token: EventLoop.SourceToken?
        var closed = false
    }
    private let state = Mutex(State())
    private let fd: Int32
    private let loop: EventLoop

    init(fd: Int32, loop: EventLoop) {
        self.fd = fd
        self.loop = loop
    }

    /// Arms the timer unless cancellation came first.
    func start(_ continuation: CheckedContinuation<Void, Error>, arm: () -> Void) {
        let cancelled = state.withLock { s in
            if s.finished { return true }
            s.continuation = continuation
            return false
        }
        if cancelled {
            continuation.resume(throwing: CancellationError())
        } else {
            arm()
        }
    }

    func registered(_ token: EventLoop.SourceToken) {
        state.withLock { $0.token = token }
    }

    func finish(_ error: Error?) {
        let continuation = state.withLock { s -> CheckedContinuation<Void, Error>? in
            guard !s.finished else { return nil }
            s.finished = true
            defer { s.continuation = nil }
            return s.continuation
        }
        guard let continuation else { return }
        if let error { continuation.resume(throwing: error) } else { continuation.resume() }
    }

    /// Stops watching and closes the descriptor, once.
    func release() {
        let token: EventLoop.SourceToken?? = state.withLock { s in
            guard !s.closed else { return nil }
            s.closed = true
            return .some(s.token)
        }
        guard let token else { return }
        if let token { loop.removeSource(token, fd: fd) }
        close(fd)
    }
}
