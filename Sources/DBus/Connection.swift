import CDBus
import Logging
import Synchronization

/// Which bus to connect to.
public enum Bus: Sendable, CustomStringConvertible {
    case session
    case system
    /// An explicit address, e.g. `unix:path=/run/test/bus`.
    case address(String)

    public var description: String {
        switch self {
        case .session: return "session bus"
        case .system: return "system bus"
        case .address(let a): return "bus at \(a)"
        }
    }
}

/// A private connection to a message bus, owned by one actor whose executor
/// is the connection's event loop: every libdbus call and every piece of
/// connection state lives on that one serial executor.
///
/// Incoming method calls are routed to exported objects; each runs as a task
/// on this executor, so a handler may await calls to other services while
/// further calls are served. (A `Properties.Get` of a value the connection
/// holds is answered at once, with no task: see `route`.)
public actor Connection {
    public nonisolated let loop: EventLoop
    /// Our unique name on the bus (":1.42").
    public nonisolated let uniqueName: String
    public nonisolated let bus: Bus
    /// The loop was started for this connection alone and stops with it.
    nonisolated let ownsLoop: Bool
    nonisolated let handle: UnsafeHandle
    nonisolated let integration: MainLoopIntegration
    /// What the message filter holds: this connection, weakly (see `deinit`).
    nonisolated let filterTarget = FilterTarget()
    let logger: Logger

    /// By the path's text: an incoming call's path, which libdbus has
    /// validated, finds its object without being checked again.
    var objects: [String: ExportedObject] = [:]
    /// Per sender, its calls handled now, and those waiting for one of them
    /// to end (`route`): a sender flooding calls has at most
    /// `callsPerSender` tasks on the loop, so every other sender's call is
    /// read and started among them, not behind the whole flood.
    var senderCalls: [String: SenderCalls] = [:]
    static let callsPerSender = 16
    /// Calls of one sender that may wait: past them a call is answered
    /// `LimitsExceeded` at once, its message released (libdbus stops reading
    /// the socket once the messages it holds pass its limit, and every
    /// other sender would wait). The system bus lets a connection have 128
    /// calls awaiting replies; a session bus 50,000: 4,096 waiting messages
    /// are a few MiB, and more than a kiosk app pipelines.
    static let waitingPerSender = 4096

    struct SenderCalls {
        var running = 0
        /// From `head` on, in the order they came.
        var waiting: [Message] = []
        var head = 0
        var isWaiting: Bool { head < waiting.count }

        mutating func next() -> Message? {
            guard head < waiting.count else { return nil }
            let message = waiting[head]
            head += 1
            if head == waiting.count {
                waiting.removeAll()
                head = 0
            }
            return message
        }
    }
    var subscriptions: [UInt64: Subscription] = [:]
    var nextSubscriptionID: UInt64 = 1
    var disconnectWaiters: [CheckedContinuation<Void, Never>] = []
    public private(set) var isConnected = true
    var filterInstalled = false
    let propertyFlushes = SerialSection()

    struct Subscription {
        let rule: MatchRule
        let handler: @Sendable (Message) -> Void
    }

    public nonisolated var unownedExecutor: UnownedSerialExecutor {
        loop.asUnownedSerialExecutor()
    }

    var raw: OpaquePointer { handle.pointer }

    /// Connects and registers with the bus (`Hello`). The connection runs on
    /// `loop`, or on a new loop thread of its own.
    public static func connect(
        to bus: Bus, loop: EventLoop? = nil, logger: Logger = Logger(label: "dbus")
    ) async throws(DBusError) -> Connection {
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        let raw: OpaquePointer?
        switch bus {
        case .session: raw = dbus_bus_get_private(DBUS_BUS_SESSION, &error)
        case .system: raw = dbus_bus_get_private(DBUS_BUS_SYSTEM, &error)
        case .address(let address):
            raw = dbus_connection_open_private(address, &error)
            if let raw, dbus_bus_register(raw, &error) == 0 {
                dbus_connection_close(raw)
                dbus_connection_unref(raw)
                throw DBusError(from: error, default: "cannot register with the \(bus)")
            }
        }
        guard let raw else { throw DBusError(from: error, default: "cannot connect to the \(bus)") }
        // We handle Disconnected ourselves and exit cleanly.
        dbus_connection_set_exit_on_disconnect(raw, 0)
        let name = dbus_bus_get_unique_name(raw).map { String(cString: $0) } ?? ""
        let connection = Connection(
            handle: UnsafeHandle(pointer: raw), bus: bus, uniqueName: name, loop: loop ?? EventLoop.spawn(),
            ownsLoop: loop == nil, logger: logger)
        await connection.start()
        return connection
    }

    private init(handle: UnsafeHandle, bus: Bus, uniqueName: String, loop: EventLoop, ownsLoop: Bool, logger: Logger) {
        self.handle = handle
        self.ownsLoop = ownsLoop
        self.bus = bus
        self.uniqueName = uniqueName
        self.loop = loop
        self.logger = logger
        self.integration = MainLoopIntegration(loop: loop, connection: handle.pointer)
    }

    private static let filterFunction: DBusHandleMessageFunction = { _, message, data in
        let message = Message(retaining: message!)
        // Descriptors a message carries are closed by libdbus when it is
        // freed, on this thread, whatever the message is: none may linger.
        if dbus_message_contains_unix_fds(message.raw) != 0 { message.defuseDescriptors() }
        // A strong reference for the call, or none at all: the last
        // reference to a connection may go on any thread while its loop
        // dispatches (its Disconnected, say), and one whose deinit has begun
        // handles nothing more (its teardown follows on the loop).
        guard let connection = Unmanaged<FilterTarget>.fromOpaque(data!).takeUnretainedValue().connection else {
            return DBUS_HANDLER_RESULT_HANDLED
        }
        // Filters run inside dbus_connection_dispatch, which only the loop
        // thread calls: we are on this actor's executor.
        return connection.assumeIsolated { $0.filter(message) }
    }

    private func start() {
        filterTarget.connection = self
        // libdbus holds the target until the filter is removed (in the
        // teardown) or the connection is freed.
        let context = Unmanaged.passRetained(filterTarget).toOpaque()
        dbus_connection_add_filter(
            raw, Connection.filterFunction, context, { Unmanaged<FilterTarget>.fromOpaque($0!).release() })
        filterInstalled = true
        integration.install()
    }

    /// Runs wherever the last reference went: on another thread while the
    /// loop is inside `dbus_connection_dispatch` for this connection (its
    /// Disconnected, say), or on the loop inside our own filter. So nothing
    /// here touches libdbus: removing a filter, or the watch and
    /// dispatch-status functions, is not safe against a dispatch on another
    /// thread (libdbus frees their data at once, while the dispatcher calls
    /// them with the function and data it read before). The teardown is the
    /// loop's own, as a work item after the one at hand, and takes only what
    /// outlives us. (A shared loop its owner stopped before we went never
    /// runs it: the connection then stays open until the process exits.)
    deinit {
        let handle = handle, integration = integration, loop = loop, ownsLoop = ownsLoop
        let target = filterInstalled ? filterTarget : nil
        loop.execute {
            if let target {
                let filter = Unmanaged.passUnretained(target).toOpaque()
                dbus_connection_remove_filter(handle.pointer, Connection.filterFunction, filter)
                integration.uninstall()
            }
            dbus_connection_close(handle.pointer)
            dbus_connection_unref(handle.pointer)
            // A loop thread of our own would otherwise outlive us (and keep a
            // process whose main thread has exited alive).
            if ownsLoop { loop.stop() }
        }
    }

    /// Closes the connection; `Disconnected` handling then runs as if the
    /// bus had gone.
    public func close() {
        guard isConnected else { return }
        // Replies already queued (e.g. to the call that asked us to quit)
        // are written before the connection goes.
        dbus_connection_flush(raw)
        dbus_connection_close(raw)
    }

    /// Returns when the connection has been closed or the bus has gone.
    public func waitUntilDisconnected() async {
        guard isConnected else { return }
        await withCheckedContinuation { continuation in
            // Checked again: the body may run after other jobs of this actor.
            if isConnected {
                disconnectWaiters.append(continuation)
            } else {
                continuation.resume()
            }
        }
    }

    // MARK: Incoming messages

    private func filter(_ message: Message) -> DBusHandlerResult {
        switch message.kind {
        case .signal:
            if message.isSignal("org.freedesktop.DBus.Local", "Disconnected") {
                disconnected()
                return DBUS_HANDLER_RESULT_HANDLED
            }
            for subscription in subscriptions.values where subscription.rule.matches(message) {
                subscription.handler(message)
            }
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        case .methodCall:
            route(message)
            return DBUS_HANDLER_RESULT_HANDLED
        default:
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        }
    }

    private func disconnected() {
        guard isConnected else { return }
        isConnected = false
        logger.notice("disconnected from the \(bus)")
        let waiters = disconnectWaiters
        disconnectWaiters = []
        for waiter in waiters { waiter.resume() }
    }

    // MARK: Sending

    /// Queues a message for sending.
    public func send(_ message: Message) throws(DBusError) {
        guard isConnected else { throw .disconnected("not connected to the \(bus)") }
        guard dbus_connection_send(raw, message.raw, nil) != 0 else { throw .noMemory() }
    }

    /// For `call`: wait until the reply comes (libdbus's DBUS_TIMEOUT_INFINITE).
    public static let noTimeout: Duration = .milliseconds(Int64(Int32.max))

    /// Sends a method call and waits for its reply. An error reply is thrown.
    public func call(_ message: Message, timeout: Duration = .seconds(25)) async throws(DBusError) -> Message {
        guard isConnected else { throw .disconnected("not connected to the \(bus)") }
        let ms = Int32(clamping: timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        var pending: OpaquePointer?
        guard dbus_connection_send_with_reply(raw, message.raw, &pending, max(ms, 1)) != 0 else {
            throw .noMemory()
        }
        guard let pending else { throw .disconnected("not connected to the \(bus)") }
        let box = PendingReply()
        let result: Result<Message, DBusError> = await withCheckedContinuation { continuation in
            box.set(continuation)
            let context = Unmanaged.passRetained(box).toOpaque()
            let ok = dbus_pending_call_set_notify(
                pending,
                { pending, data in
                    let box = Unmanaged<PendingReply>.fromOpaque(data!).takeUnretainedValue()
                    box.complete(with: dbus_pending_call_steal_reply(pending).map { Message(adopting: $0) })
                },
                context,
                { data in Unmanaged<PendingReply>.fromOpaque(data!).release() })
            if ok == 0 {
                Unmanaged<PendingReply>.fromOpaque(context).release()
                box.complete(with: nil)
            }
            // The body of withCheckedContinuation may run after other jobs of
            // this executor, so the reply may already have been dispatched
            // (libdbus does not call a notify function set after completion).
            if dbus_pending_call_get_completed(pending) != 0 {
                box.complete(with: dbus_pending_call_steal_reply(pending).map { Message(adopting: $0) })
            }
        }
        dbus_pending_call_unref(pending)
        let reply = try result.get()
        if reply.kind == .error {
            let args = try? reply.arguments()
            var text = ""
            if case .string(let s)? = args?.first { text = s }
            throw DBusError(name: reply.errorName ?? DBusError.failed("").name, message: text)
        }
        return reply
    }

    /// Calls a method and returns the reply's arguments.
    public func call(
        destination: String, path: ObjectPath, interface: String, member: String,
        _ arguments: [DBusValue] = [], timeout: Duration = .seconds(25),
        allowInteractiveAuthorization: Bool = false
    ) async throws(DBusError) -> [DBusValue] {
        let message = try Message.methodCall(destination: destination, path: path, interface: interface, member: member)
        try message.append(arguments)
        message.allowInteractiveAuthorization = allowInteractiveAuthorization
        return try await call(message, timeout: timeout).arguments()
    }

    /// `org.freedesktop.DBus.Properties.Get` of another peer's property:
    /// its value, or nil when the call fails or takes longer than `timeout`.
    public func property(
        _ name: String, of interface: String, at path: ObjectPath, on destination: String, timeout: Duration
    ) async -> DBusValue? {
        let reply = try? await call(
            destination: destination, path: path, interface: "org.freedesktop.DBus.Properties", member: "Get",
            [.string(interface), .string(name)], timeout: timeout)
        guard case .variant(let value)? = reply?.first else { return nil }
        return value
    }

    /// Emits a signal from `path` (to `destination` only, when given). The
    /// object at `path` must declare it with this signature (see `export`).
    public func emit(
        _ signal: String, interface: String, path: ObjectPath, _ arguments: [DBusValue] = [], destination: String? = nil
    ) throws(DBusError) {
        guard let object = objects[path.rawValue], let declaration = object.interface(interface)?.signal(signal) else {
            throw .invalidArgs("no signal \(interface).\(signal) is declared at \(path)")
        }
        let actual = arguments.map { $0.type.signature }.joined()
        guard actual == declaration.signature else {
            throw .invalidArgs("signal \(interface).\(signal) has type '\(declaration.signature)', got '\(actual)'")
        }
        let message = try Message.signal(path: path, interface: interface, member: signal, destination: destination)
        try message.append(arguments)
        try send(message)
    }
}

/// The message filter's user data: a weak reference, which a dispatch on
/// the loop turns into a strong one for the length of the call, or into
/// nil once the connection's deinit has begun (on whatever thread).
final class FilterTarget: @unchecked Sendable {
    /// Set once, in `start`, before libdbus can call the filter.
    weak var connection: Connection?
}

/// Holds the continuation of one call until libdbus reports its reply;
/// completes it exactly once, whoever gets there first.
private final class PendingReply: Sendable {
    private let continuation = Mutex<CheckedContinuation<Result<Message, DBusError>, Never>?>(nil)

    func set(_ c: CheckedContinuation<Result<Message, DBusError>, Never>) {
        continuation.withLock { $0 = c }
    }

    func complete(with reply: Message?) {
        guard let c = continuation.withLock({ c in defer { c = nil }; return c }) else { return }
        if let reply {
            c.resume(returning: .success(reply))
        } else {
            c.resume(returning: .failure(.disconnected("the call ended without a reply")))
        }
    }

    deinit {
        // libdbus freed the pending call without completing it (connection
        // torn down): never leave the caller waiting.
        continuation.withLock { $0 }?.resume(returning: .failure(.disconnected("the connection closed before the reply")))
    }
}
