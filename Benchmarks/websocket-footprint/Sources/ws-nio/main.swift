// swift-nio's own WebSocket client: NIOHTTP1 + NIOWebSocketClientUpgrader on
// a 1-thread MultiThreadedEventLoopGroup, channel handlers (no Swift
// concurrency), JSON by hand and no Foundation, so that what it costs beyond
// ws-baseline is NIO's. The main thread waits on the channel's closeFuture,
// as a service's own loop thread would go on beside NIO's. The endpoint's
// host is an IP address (Chromium prints 127.0.0.1).
import Glibc
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOWebSocket

func fail(_ message: String) -> Never {
    let text = "ws-nio: \(message)\n"
    _ = write(2, text, text.utf8.count)
    exit(1)
}

// ws://HOST:PORT/PATH
let arguments = CommandLine.arguments
guard arguments.count == 2, arguments[1].hasPrefix("ws://") else { fail("usage: ws-nio ws://127.0.0.1:PORT/PATH") }
let rest = arguments[1].dropFirst(5)
let slash = rest.firstIndex(of: "/") ?? rest.endIndex
let authority = String(rest[..<slash])
let path = slash < rest.endIndex ? String(rest[slash...]) : "/"
guard let colon = authority.lastIndex(of: ":"), let port = Int(authority[authority.index(after: colon)...]) else {
    fail("no port in \(arguments[1])")
}
let host = String(authority[..<colon])

/// Writes the GET that NIOHTTPClientUpgradeHandler turns into the upgrade
/// request; removed once the upgrade is done.
final class UpgradeRequest: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    func channelActive(context: ChannelHandlerContext) {
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: authority)
        headers.add(name: "Content-Length", value: "0")
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Only reached when the server did not upgrade.
        if case .head(let head) = unwrapInboundIn(data) { fail("upgrade refused: \(head.status)") }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) { fail("\(error)") }
}

/// Sends Target.getTargets, reads its reply (fragments joined), answers
/// pings; prints "ready" after the reply.
final class DevTools: ChannelInboundHandler {
    typealias InboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame
    var message = ByteBuffer()
    var replied = false

    func handlerAdded(context: ChannelHandlerContext) {
        let request = context.channel.allocator.buffer(string: #"{"id":1,"method":"Target.getTargets"}"#)
        let frame = WebSocketFrame(fin: true, opcode: .text, maskKey: .random(), data: request)
        context.writeAndFlush(wrapOutboundOut(frame), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var frame = unwrapInboundIn(data)
        switch frame.opcode {
        case .ping:
            let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.unmaskedData)
            context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
        case .connectionClose:
            fail("closed by the server")
        case .text, .binary, .continuation:
            message.writeBuffer(&frame.data)
            guard frame.fin else { return }
            let reply = message.readString(length: message.readableBytes) ?? ""
            message.clear()
            if !replied {
                replied = true
                guard reply.hasPrefix(#"{"id":1,"result":"#) else { fail("unexpected reply: \(reply)") }
                let ready = "reply: \(reply.utf8.count) bytes\nready pid=\(getpid())\n"
                _ = write(1, ready, ready.utf8.count)
            }
        default:
            break
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) { fail("\(error)") }
}

let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
let bootstrap = ClientBootstrap(group: group).channelInitializer { channel in
    channel.eventLoop.makeCompletedFuture {
        let upgrader = NIOWebSocketClientUpgrader(maxFrameSize: 1 << 20) { channel, _ in
            channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(DevTools()) }
        }
        let pipeline = channel.pipeline.syncOperations
        try pipeline.addHTTPClientHandlers(
            withClientUpgrade: (
                upgraders: [upgrader],
                completionHandler: { context in context.pipeline.removeHandler(name: "upgrade-request", promise: nil) }
            ))
        try pipeline.addHandler(UpgradeRequest(), name: "upgrade-request")
    }
}
do {
    // By address, not connect(host:port:): that resolves the name with
    // getaddrinfo on a libdispatch worker thread, which lingers for 5 s.
    let channel = try bootstrap.connect(to: SocketAddress(ipAddress: host, port: port)).wait()
    try channel.closeFuture.wait()
    fail("connection closed")
} catch {
    fail("\(error)")
}
