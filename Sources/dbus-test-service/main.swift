// A test object served through the DBus layer: every type, every kind of
// member, an async handler that awaits another service, signals and
// property changes. The integration tests and the benchmark drive it with
// busctl, gdbus and dbus-python.
//
//   dbus-test-service --address ADDR [--name NAME]
//
// Prints "READY <unique-name>" on stdout once the name is owned.

import DBus
import Glibc
import Logging

LoggingSystem.bootstrap { label in
    var handler = StreamLogHandler.standardError(label: label)
    handler.logLevel = .info
    return handler
}
let logger = Logger(label: "dbus-test-service")

var address: String?
var name = "org.guidedaccess.Test1"
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    switch argument {
    case "--address": address = arguments.next()
    case "--name": name = arguments.next() ?? name
    default:
        logger.critical("unknown argument '\(argument)'; usage: dbus-test-service [--address ADDR] [--name NAME]")
        exit(2)
    }
}

/// The object's state, on the connection's executor.
actor TestState {
    let connection: Connection
    nonisolated var unownedExecutor: UnownedSerialExecutor { connection.unownedExecutor }

    var counter: UInt32 = 0
    var label = "initial"
    var generation: Int32 = 0

    init(connection: Connection) { self.connection = connection }

    func increment() { counter += 1 }
    func setLabel(_ text: String) { label = text }
    func bumpGeneration() { generation += 1 }
}

let path: ObjectPath = "/org/guidedaccess/Test1"
let interfaceName = "org.guidedaccess.Test1"

func makeInterface(_ state: TestState) -> Interface {
    Interface(
        interfaceName,
        methods: [
            Method("Echo", inputs: [Argument("value", "v")], outputs: [Argument("value", "v")]) { call in
                call.arguments
            },
            Method(
                "EchoAll",
                inputs: [
                    Argument("y", "y"), Argument("b", "b"), Argument("n", "n"), Argument("q", "q"),
                    Argument("i", "i"), Argument("u", "u"), Argument("x", "x"), Argument("t", "t"),
                    Argument("d", "d"), Argument("s", "s"), Argument("o", "o"), Argument("g", "g"),
                    Argument("as", "as"), Argument("asv", "a{sv}"), Argument("ass", "a{ss}"),
                    Argument("sss", "(sss)"), Argument("ssss", "a(ssss)"),
                ],
                outputs: [
                    Argument("y", "y"), Argument("b", "b"), Argument("n", "n"), Argument("q", "q"),
                    Argument("i", "i"), Argument("u", "u"), Argument("x", "x"), Argument("t", "t"),
                    Argument("d", "d"), Argument("s", "s"), Argument("o", "o"), Argument("g", "g"),
                    Argument("as", "as"), Argument("asv", "a{sv}"), Argument("ass", "a{ss}"),
                    Argument("sss", "(sss)"), Argument("ssss", "a(ssss)"),
                ]
            ) { call in call.arguments },
            Method("Add", inputs: [Argument("a", "i"), Argument("b", "i")], outputs: [Argument("sum", "i")]) { call in
                let a: Int32 = try call.argument(0)
                let b: Int32 = try call.argument(1)
                let (sum, overflow) = a.addingReportingOverflow(b)
                guard !overflow else { throw DBusError.invalidArgs("\(a) + \(b) overflows int32") }
                return [.int32(sum)]
            },
            Method("Sleep", inputs: [Argument("milliseconds", "u")]) { call in
                let ms: UInt32 = try call.argument(0)
                try await call.connection.loop.sleep(for: .milliseconds(ms))
                return []
            },
            // Awaits a call to another service before replying.
            Method(
                "CallOther", inputs: [Argument("destination", "s"), Argument("milliseconds", "u")],
                outputs: [Argument("answer", "s")]
            ) { call in
                let destination: String = try call.argument(0)
                let ms: UInt32 = try call.argument(1)
                _ = try await call.connection.call(
                    destination: destination, path: path, interface: interfaceName, member: "Sleep", [.uint32(ms)])
                return [.string("\(destination) slept \(ms) ms")]
            },
            Method("Emit", inputs: [Argument("text", "s")]) { call in
                try await call.connection.emit("Pinged", interface: interfaceName, path: path, call.arguments)
                return []
            },
            Method("Increment") { _ in
                await state.increment()
                await state.connection.propertiesChanged(path: path, interface: interfaceName)
                return []
            },
            Method("BumpGeneration") { _ in
                await state.bumpGeneration()
                await state.connection.propertiesChanged(path: path, interface: interfaceName)
                return []
            },
            Method("Fail", inputs: [Argument("name", "s"), Argument("message", "s")]) { call in
                throw DBusError(name: try call.argument(0), message: try call.argument(1))
            },
            Method(
                "WhoAmI",
                outputs: [
                    Argument("uid", "u"), Argument("pid", "u"), Argument("executable", "s"), Argument("unit", "s"),
                ]
            ) { call in
                let credentials = try await call.connection.credentials(of: call.sender)
                let pid = credentials.processID ?? 0
                return [
                    .uint32(credentials.unixUserID ?? UInt32.max), .uint32(pid),
                    .string(ProcessInfo.executable(of: pid) ?? ""), .string(ProcessInfo.systemdUnit(of: pid) ?? ""),
                ]
            },
            Method("Quit") { call in
                Task(executorPreference: call.connection.loop) { await call.connection.close() }
                return []
            },
        ],
        properties: [
            Property("Counter", "u") { .uint32(await state.counter) },
            Property("Label", "s", get: { .string(await state.label) }) { value, _ in
                let text = try String(dbusValue: value)
                guard !text.isEmpty else { throw DBusError.invalidArgs("Label must not be empty") }
                await state.setLabel(text)
            },
            Property("Generation", "i", changes: .invalidates) { .int32(await state.generation) },
            Property("Version", "s", changes: .constant) { .string("1.0") },
        ],
        signals: [Signal("Pinged", [Argument("text", "s")])]
    )
}

let loop = EventLoop()
loop.handleSignals([SIGTERM, SIGINT]) { signal in
    logger.notice("received signal \(signal); exiting")
    exit(0)
}
loop.start()

/// Everything after start-up runs on the loop (executor preference), so the
/// process never wakes the global executor's thread pool and its timer.
func serve(address: String?, name: String, loop: EventLoop) async -> Int32 {
    do {
        let bus: Bus = address.map { .address($0) } ?? .session
        let connection = try await Connection.connect(to: bus, loop: loop, logger: logger)
        let state = TestState(connection: connection)
        // Objects first, then the name: no call can reach a half-built service.
        try await connection.export([makeInterface(state)], at: path)
        let reply = try await connection.requestName(name)
        guard reply == .primaryOwner else {
            logger.critical("cannot own \(name): \(reply)")
            return 1
        }
        let line = Array("READY \(connection.uniqueName)\n".utf8)
        _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
        logger.info("serving \(path) as \(name) on the \(bus)")
        await connection.waitUntilDisconnected()
        logger.notice("the bus connection is gone; exiting cleanly")
        return 0
    } catch {
        logger.critical("\(error)")
        return 1
    }
}

exit(await Task(executorPreference: loop) { [address, name] in await serve(address: address, name: name, loop: loop) }.value)
