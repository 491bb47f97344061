// swift-tools-version:6.0
// What a WebSocket client costs a process, for the DevTools client of
// guidedaccessd: each program connects to a Chromium DevTools browser endpoint
// (ws://127.0.0.1:PORT/devtools/browser/ID, given as its one argument), sends
// {"id":1,"method":"Target.getTargets"}, reads the reply, prints
// "ready pid=N" and then stays connected and idle.
//   idle-baseline   prints and pause()s: the floor
//   ws-baseline     plain Glibc socket, hand-written RFC 6455 handshake and
//                   framing, blocking, poll(2) when idle: "own framing"
//   ws-nio          swift-nio: NIOHTTP1 + NIOWebSocketClientUpgrader on a
//                   1-thread MultiThreadedEventLoopGroup, JSON by hand
//   ws-hummingbird  hummingbird-project/swift-websocket's WSClient
//   ws-vapor        vapor/websocket-kit's WebSocket.connect
// scripts/bench-websocket-footprint builds and measures them. Not a
// dependency of the main package; nothing here ships.
import PackageDescription

let package = Package(
    name: "websocket-footprint",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", exact: "2.101.3"),
        .package(url: "https://github.com/hummingbird-project/swift-websocket", exact: "1.6.2"),
        .package(url: "https://github.com/vapor/websocket-kit", exact: "2.16.2"),
    ],
    targets: [
        .executableTarget(name: "idle-baseline"),
        .executableTarget(name: "ws-baseline"),
        .executableTarget(
            name: "ws-nio",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
            ]),
        .executableTarget(
            name: "ws-hummingbird",
            dependencies: [
                .product(name: "WSClient", package: "swift-websocket"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]),
        .executableTarget(
            name: "ws-vapor",
            dependencies: [
                .product(name: "WebSocketKit", package: "websocket-kit"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]),
    ],
    swiftLanguageModes: [.v5]
)
