import Glibc
import TestSupport
import Synchronization
import Testing

@testable import DBus

actor Counter {
    var value = 0
    func add() -> Int {
        value += 1
        return value
    }
}

@Suite(.serialized) struct ConnectionOnAPrivateBus {
    func greeter(_ counter: Counter) -> Interface {
        Interface(
            "org.example.Greeter1",
            methods: [
                Method("Greet", Argument("name", String.self), returns: Argument("greeting", String.self)) {
                    call, name in
                    guard !name.isEmpty else { throw DBusError(name: "org.example.Error.Empty", message: "name is empty") }
                    _ = await counter.add()
                    // Get answers with the value last announced.
                    await call.connection.propertiesChanged(path: call.path, interface: call.interface)
                    return "hello, \(name)"
                }
            ],
            properties: [Property("Greetings", Int32.self) { Int32(await counter.value) }],
            signals: [Signal("Greeted", Argument("name", String.self))])
    }

    @Test func aCallIsAnsweredAndAnErrorKeepsItsNameAndMessage() async throws {
        let bus = try PrivateBus()
        let server = try await Connection.connect(to: .address(bus.address))
        let client = try await Connection.connect(to: .address(bus.address))
        try await server.export([greeter(Counter())], at: "/org/example/Greeter")
        #expect(try await server.requestName("org.example.Greeter") == .primaryOwner)

        let reply = try await client.call(
            destination: "org.example.Greeter", path: "/org/example/Greeter", interface: "org.example.Greeter1",
            member: "Greet", [.string("kiosk")])
        #expect(reply == [.string("hello, kiosk")])

        await #expect(throws: DBusError(name: "org.example.Error.Empty", message: "name is empty")) {
            try await client.call(
                destination: "org.example.Greeter", path: "/org/example/Greeter", interface: "org.example.Greeter1",
                member: "Greet", [.string("")])
        }
        let property = try await client.call(
            destination: "org.example.Greeter", path: "/org/example/Greeter",
            interface: "org.freedesktop.DBus.Properties", member: "Get",
            [.string("org.example.Greeter1"), .string("Greetings")])
        #expect(property == [.variant(.int32(1))])
        await client.close()
        await server.close()
    }

    /// A descriptor a call carries is lent to the handler: closed by the
    /// dispatcher once the handler returns (or throws), so a handler keeps
    /// one only by duplicating it, and calls leak none.
    @Test func aCallsDescriptorIsLentToItsHandlerAndClosedAfter() async throws {
        let bus = try PrivateBus()
        let server = try await Connection.connect(to: .address(bus.address))
        let client = try await Connection.connect(to: .address(bus.address))
        let seen = Mutex<[Int32]>([])
        let kept = Mutex<[Int32]>([])
        try await server.export(
            [
                Interface(
                    "org.example.Files1",
                    methods: [
                        Method("Take", Argument("file", UnixFD.self), Argument("keep", Bool.self)) { _, file, keep in
                            seen.withLock { $0.append(file.rawValue) }
                            #expect(fcntl(file.rawValue, F_GETFD) >= 0, "open while the handler runs")
                            if keep, let copy = file.duplicate() { kept.withLock { $0.append(copy) } }
                            if !keep { throw DBusError.invalidArgs("refused") }
                        }
                    ])
            ], at: "/org/example/Files")
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        // Close-on-exec: a child another test spawns meanwhile must not
        // hold the pipe open (the check below reads its end).
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        defer { for fd in fds where fd >= 0 { close(fd) } }
        func take(_ keep: Bool) async throws {
            _ = try await client.call(
                destination: server.uniqueName, path: "/org/example/Files", interface: "org.example.Files1",
                member: "Take", [.unixFD(fds[1]), .bool(keep)])
        }
        try await take(true)
        await #expect(throws: DBusError.self) { try await take(false) }
        #expect(seen.withLock { $0.count } == 2)
        // The copy the handler kept is the same pipe: it writes into it.
        let copy = try #require(kept.withLock { $0.first })
        var byte: UInt8 = 7
        #expect(write(copy, &byte, 1) == 1)
        close(copy)
        var got: UInt8 = 0
        #expect(read(fds[0], &got, 1) == 1 && got == 7)
        // With our write end and the kept copy closed, the pipe is at its
        // end only if no other copy is open: none of the calls' was leaked.
        close(fds[1])
        fds[1] = -1
        _ = fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK)
        #expect(read(fds[0], &got, 1) == 0, "a descriptor a call carried is still open somewhere")
        await client.close()
        await server.close()
    }

    @Test func subscribersSeeSignalsAndPropertyChangesInOrder() async throws {
        let bus = try PrivateBus()
        let counter = Counter()
        let server = try await Connection.connect(to: .address(bus.address))
        let client = try await Connection.connect(to: .address(bus.address))
        try await server.export([greeter(counter)], at: "/org/example/Greeter")
        let stream = try await client.signals(matching: MatchRule(sender: server.uniqueName))

        try await server.emit("Greeted", interface: "org.example.Greeter1", path: "/org/example/Greeter", [.string("a")])
        _ = await counter.add()
        await server.propertiesChanged(path: "/org/example/Greeter", interface: "org.example.Greeter1")
        // Nothing changed: no second PropertiesChanged.
        await server.propertiesChanged(path: "/org/example/Greeter", interface: "org.example.Greeter1")
        try await server.emit("Greeted", interface: "org.example.Greeter1", path: "/org/example/Greeter", [.string("b")])

        var seen: [String] = []
        for await message in stream {
            seen.append("\(message.member ?? "") \(try message.arguments())")
            if seen.count == 3 { break }
        }
        #expect(
            seen == [
                "Greeted [\"a\"]",
                "PropertiesChanged [\"org.example.Greeter1\", {\"Greetings\": <1>}, []]",
                "Greeted [\"b\"]",
            ])
        await #expect(throws: DBusError.self) {
            try await server.emit("Greeted", interface: "org.example.Greeter1", path: "/org/example/Greeter", [.int32(1)])
        }
    }

    @Test func nameOwnerChangedTellsWhenAPeerLeaves() async throws {
        let bus = try PrivateBus()
        let watcher = try await Connection.connect(to: .address(bus.address))
        let peer = try await Connection.connect(to: .address(bus.address))
        let stream = try await watcher.signals(matching: .nameOwnerChanged(for: peer.uniqueName))
        await peer.close()
        for await message in stream {
            let args = try message.arguments()
            #expect(args == [.string(peer.uniqueName), .string(peer.uniqueName), .string("")])
            break
        }
    }

    @Test func credentialsComeFromTheBus() async throws {
        let bus = try PrivateBus()
        let a = try await Connection.connect(to: .address(bus.address))
        let credentials = try await a.credentials(of: a.uniqueName)
        #expect(credentials.unixUserID == getuid())
        #expect(credentials.processID == UInt32(getpid()))
        #expect(ProcessInfo.executable(of: UInt32(getpid()))?.isEmpty == false)
    }

    @Test func aCallTimesOutWithNoReply() async throws {
        let bus = try PrivateBus()
        let server = try await Connection.connect(to: .address(bus.address))
        let client = try await Connection.connect(to: .address(bus.address))
        try await server.export(
            [
                Interface(
                    "org.example.Slow1",
                    methods: [
                        Method("Wait") { _ in try await Task.sleep(for: .seconds(2)) }
                    ])
            ], at: "/slow")
        let error = await #expect(throws: DBusError.self) {
            try await client.call(
                destination: server.uniqueName, path: "/slow", interface: "org.example.Slow1", member: "Wait", [],
                timeout: .milliseconds(200))
        }
        #expect(error?.name == "org.freedesktop.DBus.Error.NoReply")
    }

    @Test func killingTheBusEndsTheConnection() async throws {
        let bus = try PrivateBus()
        let connection = try await Connection.connect(to: .address(bus.address))
        kill(bus.pid, SIGKILL)
        await connection.waitUntilDisconnected()
        #expect(await connection.isConnected == false)
        await #expect(throws: DBusError.self) { try await connection.busID() }
    }
}
