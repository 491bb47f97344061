// hummingbird-project/swift-websocket's WSClient, as its README shows it
// (structured concurrency: an inbound message stream and an outbound writer),
// on a 1-thread MultiThreadedEventLoopGroup like ws-nio's (its default,
// MultiThreadedEventLoopGroup.singleton, starts one loop thread per core).
// Logging at the default level (info), to stderr.
import Glibc
import Logging
import NIOPosix
import WSClient

func fail(_ message: String) -> Never {
    let text = "ws-hummingbird: \(message)\n"
    _ = write(2, text, text.utf8.count)
    exit(1)
}

@main
struct Main {
    static func main() async {
        let arguments = CommandLine.arguments
        guard arguments.count == 2, arguments[1].hasPrefix("ws://") else {
            fail("usage: ws-hummingbird ws://127.0.0.1:PORT/PATH")
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let logger = Logger(label: "ws-hummingbird")
        do {
            try await WebSocketClient.connect(url: arguments[1], eventLoopGroup: group, logger: logger) {
                inbound, outbound, _ in
                try await outbound.write(.text(#"{"id":1,"method":"Target.getTargets"}"#))
                var messages = inbound.messages(maxSize: 1 << 20).makeAsyncIterator()
                guard case .text(let reply) = try await messages.next() else { fail("no text reply") }
                guard reply.hasPrefix(#"{"id":1,"result":"#) else { fail("unexpected reply: \(reply)") }
                let ready = "reply: \(reply.utf8.count) bytes\nready pid=\(getpid())\n"
                _ = write(1, ready, ready.utf8.count)
                while try await messages.next() != nil {}
            }
            fail("connection closed")
        } catch {
            fail("\(error)")
        }
    }
}
