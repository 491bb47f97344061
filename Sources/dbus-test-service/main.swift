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

/// `(sss)`: a struct of strings, as the GuidedAccess API's restrictions are.
struct StringTriple: DBusRepresentable, Equatable {
    var first, second, third: String
    static var dbusType: DBusType { .structure([.string, .string, .string]) }
    var dbusValue: DBusValue { .structure([.string(first), .string(second), .string(third)]) }
    init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .structure(let fields) = v, fields.count == 3 else {
            throw .invalidArgs("expected '(sss)', got '\(v.type.signature)'")
        }
        first = try String(dbusValue: fields[0])
        second = try String(dbusValue: fields[1])
        third = try String(dbusValue: fields[2])
    }
}

/// `(ssss)`, the element of `a(ssss)`.
struct StringQuadruple: DBusRepresentable, Equatable {
    var first, second, third, fourth: String
    static var dbusType: DBusType { .structure([.string, .string, .string, .string]) }
    var dbusValue: DBusValue { .structure([.string(first), .string(second), .string(third), .string(fourth)]) }
    init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .structure(let fields) = v, fields.count == 4 else {
            throw .invalidArgs("expected '(ssss)', got '\(v.type.signature)'")
        }
        first = try String(dbusValue: fields[0])
        second = try String(dbusValue: fields[1])
        third = try String(dbusValue: fields[2])
        fourth = try String(dbusValue: fields[3])
    }
}

/// One argument of every type EchoAll passes through, in and out.
let everyType: [any ArgumentDeclaration] = [
    Argument("y", UInt8.self), Argument("b", Bool.self), Argument("n", Int16.self), Argument("q", UInt16.self),
    Argument("i", Int32.self), Argument("u", UInt32.self), Argument("x", Int64.self), Argument("t", UInt64.self),
    Argument("d", Double.self), Argument("s", String.self), Argument("o", ObjectPath.self),
    Argument("g", Signature.self), Argument("as", [String].self), Argument("asv", [String: Variant].self),
    Argument("ass", [String: String].self), Argument("sss", StringTriple.self),
    Argument("ssss", [StringQuadruple].self),
]

func makeInterface(_ state: TestState) -> Interface {
    Interface(
        interfaceName,
        methods: [
            Method("Echo", Argument("value", Variant.self), returns: Argument("value", Variant.self)) { _, value in
                value
            },
            // More arguments than the typed forms take, passed through undecoded.
            Method("EchoAll", inputs: everyType, outputs: everyType) { call in call.arguments },
            Method(
                "Add", Argument("a", Int32.self), Argument("b", Int32.self), returns: Argument("sum", Int32.self)
            ) { _, a, b in
                let (sum, overflow) = a.addingReportingOverflow(b)
                guard !overflow else { throw DBusError.invalidArgs("\(a) + \(b) overflows int32") }
                return sum
            },
            Method("Sleep", Argument("milliseconds", UInt32.self)) { call, ms in
                try await call.connection.loop.sleep(for: .milliseconds(ms))
            },
            // Awaits a call to another service before replying.
            Method(
                "CallOther", Argument("destination", String.self), Argument("milliseconds", UInt32.self),
                returns: Argument("answer", String.self)
            ) { call, destination, ms in
                _ = try await call.connection.call(
                    destination: destination, path: path, interface: interfaceName, member: "Sleep", [.uint32(ms)])
                return "\(destination) slept \(ms) ms"
            },
            Method("Emit", Argument("text", String.self)) { call, text in
                try await call.connection.emit("Pinged", interface: interfaceName, path: path, [text.dbusValue])
            },
            Method("Increment") { _ in
                await state.increment()
                await state.connection.propertiesChanged(path: path, interface: interfaceName)
            },
            Method("BumpGeneration") { _ in
                await state.bumpGeneration()
                await state.connection.propertiesChanged(path: path, interface: interfaceName)
            },
            Method("Fail", Argument("name", String.self), Argument("message", String.self)) { _, name, message in
                throw DBusError(name: name, message: message)
            },
            // Four outputs: the untyped form.
            Method(
                "WhoAmI", inputs: [],
                outputs: [
                    Argument("uid", UInt32.self), Argument("pid", UInt32.self), Argument("executable", String.self),
                    Argument("unit", String.self),
                ]
            ) { call in
                let credentials = try await call.connection.credentials(of: call.sender)
                let uid = credentials.unixUserID ?? UInt32.max
                let pid = credentials.processID ?? 0
                let executable = ProcessInfo.executable(of: pid) ?? ""
                let unit = ProcessInfo.systemdUnit(of: pid) ?? ""
                return [uid.dbusValue, pid.dbusValue, executable.dbusValue, unit.dbusValue]
            },
            Method("Quit") { call in
                Task(executorPreference: call.connection.loop) { await call.connection.close() }
            },
        ],
        properties: [
            Property("Counter", UInt32.self) { await state.counter },
            Property("Label", String.self, get: { await state.label }) { text, _ in
                guard !text.isEmpty else { throw DBusError.invalidArgs("Label must not be empty") }
                await state.setLabel(text)
            },
            Property("Generation", Int32.self, changes: .invalidates) { await state.generation },
            Property("Version", String.self, changes: .constant) { "1.0" },
        ],
        signals: [Signal("Pinged", Argument("text", String.self))]
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
