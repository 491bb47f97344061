// vapor/websocket-kit's WebSocket.connect (callbacks on NIO) on a 1-thread
// MultiThreadedEventLoopGroup like ws-nio's. The main thread then blocks on
// the connection's close.
import Glibc
import NIOCore
import NIOPosix
import WebSocketKit

func fail(_ message: String) -> Never {
    let text = "ws-vapor: \(message)\n"
    _ = write(2, text, text.utf8.count)
    exit(1)
}

let arguments = CommandLine.arguments
guard arguments.count == 2, arguments[1].hasPrefix("ws://") else { fail("usage: ws-vapor ws://127.0.0.1:PORT/PATH") }
let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
let closed = group.next().makePromise(of: Void.self)
do {
    try WebSocket.connect(to: arguments[1], on: group) { ws in
        var replied = false
        ws.onText { _, reply in
            guard !replied else { return }
            replied = true
            guard reply.hasPrefix(#"{"id":1,"result":"#) else { fail("unexpected reply: \(reply)") }
            let ready = "reply: \(reply.utf8.count) bytes\nready pid=\(getpid())\n"
            _ = write(1, ready, ready.utf8.count)
        }
        ws.onClose.cascade(to: closed)
        ws.send(#"{"id":1,"method":"Target.getTargets"}"#)
    }.wait()
    try closed.futureResult.wait()
    fail("connection closed")
} catch {
    fail("\(error)")
}
