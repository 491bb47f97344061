import DBus
import GuidedAccessCore
import Logging

/// One message from the browser: the reply to a command, or an event.
/// Anything else is not DevTools (and closes the connection). `package`:
/// the fuzz target reads through it.
package enum DevToolsMessage {
    case reply(id: Int, Result<JSON, DevToolsFailure>)
    case event(DevToolsEvent)

    /// Reads a text message; nothing in it is evaluated, only these fields read.
    package init(_ bytes: [UInt8]) throws(DevToolsFailure) {
        let message: JSON
        do throws(JSON.ParseError) {
            message = try JSON.parse(bytes)
        } catch {
            throw DevToolsFailure("not a DevTools message: \(error)")
        }
        guard case .object = message else { throw DevToolsFailure("not a DevTools message: not a JSON object") }
        if let id = message["id"] {
            guard case .number(let text) = id, let id = Int(text) else {
                throw DevToolsFailure("not a DevTools message: an id that is not an integer")
            }
            if let error = message["error"] {
                self = .reply(id: id, .failure(DevToolsFailure(bounded(error["message"]?.string ?? "an error"))))
            } else {
                self = .reply(id: id, .success(message["result"] ?? .object([])))
            }
        } else if case .string(let method)? = message["method"] {
            self = .event(
                DevToolsEvent(
                    method: method, params: message["params"] ?? .object([]), sessionID: message["sessionId"]?.string))
        } else {
            throw DevToolsFailure("not a DevTools message: neither an id nor a method")
        }
    }
}

/// A DevTools event: its method, its parameters and, for a page attached in
/// flat mode, the session it came from.
package struct DevToolsEvent: Sendable {
    package let method: String
    package let params: JSON
    package let sessionID: String?
}

/// One connection to a Chromium browser's DevTools: to its endpoint
/// (`/json/version` over plain HTTP for the browser target's WebSocket
/// address, then that WebSocket), or over the socket the launcher relays
/// the browser's DevTools pipe on (NUL-delimited messages,
/// `PipeFraming`); commands with ids and a timeout each, events to a handler.
/// Nothing the browser sends is ever evaluated; it is parsed as JSON with
/// limits and read for the few fields the layer needs. Anything that is not
/// a DevTools message closes the connection.
///
/// Every task it starts prefers the loop: a task without that preference
/// starts, and resumes, on the global executor's threads (which then wake
/// the idle service to retire them).
actor DevToolsClient {
    nonisolated let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    /// Messages longer than this are skipped unread (an event about a page
    /// with a huge `data:` URL); the replies the layer waits for are small.
    static let messageLimit = 1 << 20
    /// Bytes of commands waiting to go out: a browser that does not read
    /// them is taken for gone past this.
    static let outboxLimit = 256 << 10
    /// Commands waiting for their answer: more fail at once (a browser
    /// that answers none of them must not grow the service).
    static let pendingLimit = 256
    /// When the browser last sent anything.
    private var lastReceived: ContinuousClock.Instant?
    /// Whether the browser sent something in the last 2 s (of a command's
    /// 3): a command's answer that is late then is queued behind what it
    /// sends (a flood), not lost to a page that hangs.
    var busy: Bool { lastReceived.map { ContinuousClock.now - $0 < .seconds(2) } ?? false }

    /// Events over this are dropped unread (`handle`).
    static let eventLimit = 512 << 10
    private static let eventStart = Array(#"{"method":"#.utf8)
    private var droppedEvents = 0

    private let stream: LoopbackStream
    private var decoder: Decoder
    private var nextID: Int
    private var pending: [Int: (continuation: CheckedContinuation<JSON, Error>, timer: Task<Void, Never>)] = [:]
    private var failure: DevToolsFailure?
    /// Frames waiting for the one writer (`send`), from `outboxHead` on,
    /// `outboxBytes` in all.
    private var outbox: [[UInt8]] = []
    private var outboxHead = 0
    private var outboxBytes = 0
    /// The pong for the latest ping not answered yet: one at most (RFC 6455
    /// 5.5.3 lets an endpoint answer only the latest).
    private var pong: [UInt8]?
    private var writing = false
    private let onEvent: @Sendable (DevToolsEvent) -> Void
    private let onClose: @Sendable (DevToolsFailure) -> Void
    private let log: PeerLog
    /// The browser's product and version (`/json/version`, `Browser.getVersion`).
    private(set) var browserVersion: String

    /// How messages are cut out of the stream: WebSocket frames (an
    /// endpoint) or NUL bytes (a pipe).
    private enum Decoder {
        case webSocket(WebSocket.Decoder)
        case pipe(PipeFraming.Decoder)

        mutating func feed(_ bytes: UnsafeRawBufferPointer) {
            switch self {
            case .webSocket(var decoder):
                decoder.feed(bytes)
                self = .webSocket(decoder)
            case .pipe(var decoder):
                decoder.feed(bytes)
                self = .pipe(decoder)
            }
        }

        mutating func next() throws(WebSocket.ProtocolError) -> WebSocket.Incoming? {
            switch self {
            case .webSocket(var decoder):
                defer { self = .webSocket(decoder) }
                return try decoder.next()
            case .pipe(var decoder):
                defer { self = .pipe(decoder) }
                return decoder.next()
            }
        }

        func frame(_ text: [UInt8]) -> [UInt8] {
            if case .pipe = self { return PipeFraming.frame(text) }
            return WebSocket.frame(.text, text)
        }
    }

    private init(
        stream: LoopbackStream, loop: EventLoop, browserVersion: String, log: PeerLog, pipe: Bool,
        onEvent: @escaping @Sendable (DevToolsEvent) -> Void, onClose: @escaping @Sendable (DevToolsFailure) -> Void
    ) {
        self.stream = stream
        self.loop = loop
        self.browserVersion = browserVersion
        self.log = log
        self.onEvent = onEvent
        self.onClose = onClose
        if pipe {
            decoder = .pipe(PipeFraming.Decoder(limit: Self.messageLimit))
            // The pipe outlives a service: replies to commands of a service
            // before this one (or of the launcher) may still come, and must
            // not be taken for this one's. Ids start somewhere else each time.
            nextID = Int.random(in: 1..<Self.pipeIDCeiling / 2)
        } else {
            decoder = .webSocket(WebSocket.Decoder(limit: Self.messageLimit))
            nextID = 1
        }
    }

    /// The service's command ids on a pipe stay below this; the launcher's
    /// own (`guidedaccessctl browser`, cleaning up after a service that
    /// went) are above it.
    package static let pipeIDCeiling = 1 << 30

    /// Connects to the browser target at `endpoint` within `timeout`.
    /// `onEvent` and `onClose` run on the loop, in the order the browser
    /// sent; `onClose` once, when the connection ends for any reason but `close()`.
    ///
    /// Only to the kiosk's browser: the socket that answers must belong to
    /// the user the service runs as (`owner`; the kernel says whose it is),
    /// else nothing is sent to it. Any local user can listen on a loopback
    /// port the browser does not hold (before it starts, after it dies, or
    /// on 127.0.0.1 while Chromium falls back to [::1]).
    nonisolated(nonsending) static func open(
        _ endpoint: DevToolsEndpoint, loop: EventLoop, timeout: Duration, owner: UInt32, log: PeerLog,
        onEvent: @escaping @Sendable (DevToolsEvent) -> Void, onClose: @escaping @Sendable (DevToolsFailure) -> Void
    ) async throws(DevToolsFailure) -> DevToolsClient {
        let version = LoopbackStream(loop: loop)
        let watchdog = Watchdog(loop: loop, timeout: timeout, stream: version)
        defer { watchdog.cancel() }
        let (path, product): (String, String)
        do throws(DevToolsFailure) {
            try await version.connect(to: endpoint)
            try await checkOwner(version, endpoint, owner)
            (path, product) = try await browserTarget(endpoint, version)
        } catch {
            throw watchdog.fired ? DevToolsFailure("no answer from \(endpoint) within \(timeout)") : error
        }
        version.close()

        let stream = LoopbackStream(loop: loop)
        let handshakeWatchdog = Watchdog(loop: loop, timeout: timeout, stream: stream)
        defer { handshakeWatchdog.cancel() }
        let rest: [UInt8]
        do throws(DevToolsFailure) {
            try await stream.connect(to: endpoint)
            try await checkOwner(stream, endpoint, owner)
            rest = try await upgrade(endpoint, path, stream)
        } catch {
            stream.close()
            throw handshakeWatchdog.fired ? DevToolsFailure("no WebSocket from \(endpoint) within \(timeout)") : error
        }
        let client = DevToolsClient(
            stream: stream, loop: loop, browserVersion: product, log: log, pipe: false, onEvent: onEvent,
            onClose: onClose)
        await client.run(after: rest)
        return client
    }

    /// Takes over `descriptor`, the service's end of the socket the launcher
    /// relays the browser's DevTools pipe on, and asks the browser its
    /// version within `timeout`: what answers must speak DevTools.
    nonisolated(nonsending) static func attach(
        _ descriptor: Int32, loop: EventLoop, timeout: Duration, log: PeerLog,
        onEvent: @escaping @Sendable (DevToolsEvent) -> Void, onClose: @escaping @Sendable (DevToolsFailure) -> Void
    ) async throws(DevToolsFailure) -> DevToolsClient {
        let stream = LoopbackStream(loop: loop, adopting: descriptor)
        let client = DevToolsClient(
            stream: stream, loop: loop, browserVersion: "a browser", log: log, pipe: true, onEvent: onEvent,
            onClose: onClose)
        await client.run(after: [])
        do throws(DevToolsFailure) {
            let version = try await client.call("Browser.getVersion", timeout: timeout)
            await client.named(bounded(version["product"]?.string ?? "a browser", 80))
        } catch {
            await client.close()
            throw DevToolsFailure("the browser did not answer Browser.getVersion: \(error)")
        }
        return client
    }

    private func named(_ product: String) { browserVersion = product }

    /// Sends a command and waits for its result; throws the browser's error,
    /// or a timeout (the connection stays: one page may hang, not the browser).
    func call(
        _ method: String, _ params: [(String, JSON)] = [], session: String? = nil, timeout: Duration = .seconds(3)
    ) async throws(DevToolsFailure) -> JSON {
        if let failure { throw failure }
        guard pending.count < Self.pendingLimit else {
            throw DevToolsFailure("\(method): \(Self.pendingLimit) commands already wait for the browser's answer")
        }
        let (id, frame) = command(method, params, session: session)
        do {
            return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<JSON, Error>) in
                let loop = self.loop
                let timer = Task(executorPreference: loop) {
                    do { try await loop.sleep(for: timeout) } catch { return }
                    await self.resolve(id, .failure(DevToolsFailure("\(method) got no answer within \(timeout)", isTimeout: true)))
                }
                pending[id] = (continuation, timer)
                send(frame)
            }
        } catch let failure as DevToolsFailure {
            throw failure
        } catch {
            throw DevToolsFailure("\(method): \(error)")
        }
    }

    /// Sends a command whose answer nobody waits for (an answer or event for
    /// a page; resuming a tab). Dropped, not queued, while the outbox is half
    /// full: what a flooding page is sent must not cost the connection.
    func tell(_ method: String, _ params: [(String, JSON)] = [], session: String? = nil) {
        guard failure == nil else { return }
        let (_, frame) = command(method, params, session: session)
        guard outboxBytes + frame.count <= Self.outboxLimit / 2 else {
            log.log(.warning, "browser layer: \(method) not sent: the browser is slow to read what the service sends")
            return
        }
        send(frame)
    }

    /// A command's id (the next; below 2^30 on a pipe, whose launcher uses
    /// those above) and its frame.
    private func command(_ method: String, _ params: [(String, JSON)], session: String?) -> (Int, [UInt8]) {
        let id = nextID
        nextID += 1
        if case .pipe = decoder, nextID >= Self.pipeIDCeiling { nextID = 1 }
        var message: [(String, JSON)] = [("id", .number(String(id))), ("method", .string(method))]
        message.append(("params", .object(params)))
        if let session { message.append(("sessionId", .string(session))) }
        return (id, decoder.frame(JSON.object(message).compactBytes()))
    }

    /// Closes the connection; pending commands fail. `onClose` is not called.
    func close() {
        finish(DevToolsFailure("closed by the service"), notify: false)
    }

    // MARK: Inside

    /// Queues a frame. Frames go out whole and in order, one writer at a
    /// time: a write that waits for room (a browser slow to read) must not
    /// have another frame's bytes cut into it.
    private func send(_ frame: [UInt8]) {
        guard failure == nil else { return }
        guard outboxBytes + frame.count <= Self.outboxLimit else {
            finish(
                DevToolsFailure("the browser does not read what the service sends (over \(Self.outboxLimit >> 10) KiB waiting)"),
                notify: true)
            return
        }
        outbox.append(frame)
        outboxBytes += frame.count
        startWriting()
    }

    /// Queues the answer to a ping, in place of one not sent yet.
    private func sendPong(_ payload: [UInt8]) {
        guard failure == nil else { return }
        pong = WebSocket.frame(.pong, payload)
        startWriting()
    }

    private func startWriting() {
        guard !writing else { return }
        writing = true
        Task(executorPreference: loop) { await self.writeOut() }
    }

    private func writeOut() async {
        while failure == nil {
            let frame: [UInt8]
            if let pong {
                frame = pong
                self.pong = nil
            } else if outboxHead < outbox.count {
                frame = outbox[outboxHead]
                outboxHead += 1
                outboxBytes -= frame.count
                if outboxHead == outbox.count {
                    outbox.removeAll(keepingCapacity: outbox.capacity <= 64)
                    outboxHead = 0
                }
            } else {
                break
            }
            do throws(DevToolsFailure) {
                try await stream.write(frame)
            } catch {
                finish(error, notify: true)
            }
        }
        writing = false
    }

    private func resolve(_ id: Int, _ result: Result<JSON, DevToolsFailure>) {
        guard let entry = pending.removeValue(forKey: id) else { return }
        entry.timer.cancel()
        entry.continuation.resume(with: result.mapError { $0 as Error })
    }

    private func run(after rest: [UInt8]) {
        rest.withUnsafeBytes { decoder.feed($0) }
        Task(executorPreference: loop) { await self.readLoop() }
    }

    private func readLoop() async {
        var buffer = [UInt8](repeating: 0, count: 16384)
        do throws(DevToolsFailure) {
            while failure == nil {
                try drain()
                let n = try await stream.read(into: &buffer)
                lastReceived = .now
                buffer.withUnsafeBytes { decoder.feed(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
            }
        } catch {
            finish(error, notify: true)
        }
    }

    /// Handles every whole message the decoder has.
    private func drain() throws(DevToolsFailure) {
        while failure == nil {
            let incoming: WebSocket.Incoming?
            do throws(WebSocket.ProtocolError) {
                incoming = try decoder.next()
            } catch {
                throw DevToolsFailure("not a WebSocket stream: \(error)")
            }
            guard let incoming else { return }
            switch incoming {
            case .text(let bytes): try handle(bytes)
            case .skipped(let length):
                log.log(.warning, "browser layer: skipped a DevTools message of \(length) bytes (limit \(Self.messageLimit))")
            case .ping(let payload): sendPong(payload)
            case .pong: break
            case .close: throw DevToolsFailure("the browser closed the WebSocket")
            }
        }
    }

    private func handle(_ bytes: [UInt8]) throws(DevToolsFailure) {
        // An event this big is none the layer uses (a page's call is at
        // most 64 KiB, checked by its script; a console message or a forged
        // call of a page can be a megabyte): dropped unread, so a page that
        // sends such things costs the service the bytes, not their parsing.
        if bytes.count > Self.eventLimit, bytes.starts(with: Self.eventStart) {
            droppedEvents += 1
            if droppedEvents == 1 || droppedEvents.isMultiple(of: 1000) {
                log.log(.info, "browser layer: \(droppedEvents) DevTools events over \(Self.eventLimit >> 10) KiB dropped unread")
            }
            return
        }
        switch try DevToolsMessage(bytes) {
        case .reply(let id, let result): resolve(id, result)
        case .event(let event): onEvent(event)
        }
    }

    private func finish(_ reason: DevToolsFailure, notify: Bool) {
        guard failure == nil else { return }
        failure = reason
        stream.close()
        outbox = []
        outboxHead = 0
        outboxBytes = 0
        pong = nil
        let waiting = pending
        pending = [:]
        for (_, entry) in waiting {
            entry.timer.cancel()
            entry.continuation.resume(throwing: reason)
        }
        if notify { onClose(reason) }
    }

    // MARK: The opening, over HTTP

    private nonisolated(nonsending) static func checkOwner(
        _ stream: LoopbackStream, _ endpoint: DevToolsEndpoint, _ owner: UInt32
    ) async throws(DevToolsFailure) {
        guard let found = await stream.peerOwner(endpoint) else {
            throw DevToolsFailure(
                "cannot tell whose socket answers there (not in /proc/net/tcp\(endpoint.isIPv6 ? "6" : "")): not connected")
        }
        guard found == owner else {
            throw DevToolsFailure(
                "its socket belongs to uid \(found), not to uid \(owner) that the browser layer runs as: not the kiosk's browser")
        }
    }

    /// `GET /json/version`: the browser target's WebSocket path (checked to
    /// be on this endpoint) and the browser's product name.
    private nonisolated(nonsending) static func browserTarget(
        _ endpoint: DevToolsEndpoint, _ stream: LoopbackStream
    ) async throws(DevToolsFailure) -> (path: String, product: String) {
        try await stream.write(Array("GET /json/version HTTP/1.1\r\nHost: \(endpoint.authority)\r\nConnection: close\r\n\r\n".utf8))
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        var headerEnd: Int?
        var contentLength: Int?
        while true {
            if let end = headerEnd, let length = contentLength, response.count >= end + length { break }
            let n: Int
            do throws(DevToolsFailure) {
                n = try await stream.read(into: &buffer)
            } catch {
                if headerEnd != nil, contentLength == nil { break }  // the body ends with the connection
                throw error
            }
            response.append(contentsOf: buffer[..<n])
            guard response.count <= 65536 else { throw DevToolsFailure("/json/version: an answer over 64 KiB") }
            if headerEnd == nil, let end = HTTPHead.end(of: response) {
                headerEnd = end
                let head = try HTTPHead(response[..<end], what: "/json/version")
                guard head.status == 200 else { throw DevToolsFailure("/json/version: HTTP status \(head.status)") }
                if let field = head.field("content-length") {
                    // Digits, and no more than is read at all: a negative or
                    // huge length would trap in the arithmetic above and below.
                    guard !field.isEmpty, field.utf8.allSatisfy({ (0x30...0x39).contains($0) }), let length = Int(field),
                        length <= 65536
                    else { throw DevToolsFailure("/json/version: a Content-Length of '\(bounded(field))'") }
                    contentLength = length
                }
            }
        }
        let body = Array(response[headerEnd!...].prefix(contentLength ?? Int.max))
        let version: JSON
        do throws(JSON.ParseError) {
            version = try JSON.parse(body)
        } catch {
            throw DevToolsFailure("/json/version: \(error)")
        }
        guard let url = version["webSocketDebuggerUrl"]?.string else {
            throw DevToolsFailure("/json/version: no webSocketDebuggerUrl (not a Chromium DevTools endpoint?)")
        }
        let prefix = "ws://\(endpoint.authority)/devtools/browser/"
        let id = url.hasPrefix(prefix) ? url.dropFirst(prefix.count) : ""
        guard !id.isEmpty, id.count <= 64, id.utf8.allSatisfy({ $0 == UInt8(ascii: "-") || ($0 < 0x80 && Character(Unicode.Scalar($0)).isLetter) || (0x30...0x39).contains($0) })
        else {
            throw DevToolsFailure("/json/version: the browser's WebSocket '\(bounded(url))' is not \(prefix)ID")
        }
        return ("/devtools/browser/" + id, bounded(version["Browser"]?.string ?? "a browser", 80))
    }

    /// The WebSocket opening handshake; what the browser sent after it.
    private nonisolated(nonsending) static func upgrade(
        _ endpoint: DevToolsEndpoint, _ path: String, _ stream: LoopbackStream
    ) async throws(DevToolsFailure) -> [UInt8] {
        let key = WebSocket.newKey()
        try await stream.write(
            Array(
                ("GET \(path) HTTP/1.1\r\nHost: \(endpoint.authority)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    + "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n").utf8))
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = try await stream.read(into: &buffer)
            response.append(contentsOf: buffer[..<n])
            if let end = HTTPHead.end(of: response) {
                let head = try HTTPHead(response[..<end], what: "the WebSocket handshake")
                guard head.status == 101 else { throw DevToolsFailure("the WebSocket handshake: HTTP status \(head.status)") }
                guard head.field("sec-websocket-accept") == WebSocket.accept(for: key) else {
                    throw DevToolsFailure("the WebSocket handshake: a wrong Sec-WebSocket-Accept")
                }
                return Array(response[end...])
            }
            guard response.count <= 16384 else { throw DevToolsFailure("the WebSocket handshake: a head over 16 KiB") }
        }
    }
}

/// An HTTP response's status and header fields.
private struct HTTPHead {
    let status: Int
    let fields: [(String, String)]

    /// Where the head ends (after the blank line), once it has.
    static func end(of bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for i in 0...(bytes.count - 4)
        where bytes[i] == 13 && bytes[i + 1] == 10 && bytes[i + 2] == 13 && bytes[i + 3] == 10 {
            return i + 4
        }
        return nil
    }

    init(_ bytes: ArraySlice<UInt8>, what: String) throws(DevToolsFailure) {
        let lines = String(decoding: bytes, as: UTF8.self).split(separator: "\r\n", omittingEmptySubsequences: true)
        let statusLine = lines.first?.split(separator: " ") ?? []
        guard statusLine.count >= 2, statusLine[0].hasPrefix("HTTP/1."), let status = Int(statusLine[1]) else {
            throw DevToolsFailure("\(what): not an HTTP response")
        }
        self.status = status
        fields = lines.dropFirst().compactMap { line in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (
                line[..<colon].lowercased(),
                String(line[line.index(after: colon)...].drop(while: { $0 == " " || $0 == "\t" }))
            )
        }
    }

    func field(_ name: String) -> String? { fields.first { $0.0 == name }?.1 }
}

/// Closes a stream that has not finished its opening in time, which fails
/// whatever waits on it.
private final class Watchdog: @unchecked Sendable {
    private var task: Task<Void, Never>?
    /// Read after the opening ended: set on the loop, read on the loop.
    private(set) var fired = false

    init(loop: EventLoop, timeout: Duration, stream: LoopbackStream) {
        task = Task(executorPreference: loop) { [weak self] in
            do { try await loop.sleep(for: timeout) } catch { return }
            self?.fired = true
            stream.close()
        }
    }

    func cancel() { task?.cancel() }
}

/// At most 200 characters of what the browser sent, for a log line (the
/// daemon's log handler escapes what it writes).
func bounded(_ text: String, _ limit: Int = 200) -> String {
    text.count <= limit ? text : text.prefix(limit) + "…"
}

extension JSON {
    package var string: String? {
        if case .string(let s) = self { return s }
        return nil
    }
}
