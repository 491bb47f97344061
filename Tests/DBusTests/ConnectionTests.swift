import Glibc
import Testing

@testable import DBus

/// A dbus-daemon of the test's own, on a socket in a temporary directory.
final class PrivateBus {
    let address: String
    let pid: pid_t
    let directory: String

    init() throws {
        var template = Array("/tmp/dbus-tests-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw DBusError.failed("mkdtemp failed") }
        directory = String(cString: dir)
        let config = """
            <busconfig>
              <type>session</type>
              <listen>unix:path=\(directory)/bus</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow send_destination="*" eavesdrop="true"/>
                <allow receive_sender="*"/>
                <allow own="*"/>
              </policy>
            </busconfig>
            """
        let configPath = directory + "/bus.conf"
        let file = fopen(configPath, "w")
        fputs(config, file)
        fclose(file)
        let output = try PrivateBus.run(["/usr/bin/dbus-daemon", "--config-file=" + configPath, "--fork", "--print-address=1", "--print-pid=1"], expectedLines: 2)
        let lines = output.split(separator: "\n")
        guard lines.count >= 2, let pid = pid_t(lines[1]) else { throw DBusError.failed("dbus-daemon said: \(output)") }
        address = String(lines[0])
        self.pid = pid
    }

    deinit {
        kill(pid, SIGKILL)
        unlink(directory + "/bus")
        unlink(directory + "/bus.conf")
        rmdir(directory)
    }

    /// Runs a program and returns its standard output.
    static func run(_ argv: [String], expectedLines: Int = .max) throws -> String {
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw DBusError.failed("pipe failed") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 1)
        posix_spawn_file_actions_addclose(&actions, pipeFDs[0])
        var cArgs = argv.map { strdup($0) } + [nil]
        defer { cArgs.forEach { free($0) } }
        var child: pid_t = 0
        let rc = posix_spawn(&child, argv[0], &actions, nil, &cArgs, environ)
        posix_spawn_file_actions_destroy(&actions)
        close(pipeFDs[1])
        guard rc == 0 else { throw DBusError.failed("cannot start \(argv[0]): \(rc)") }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1024)
        // A forking daemon keeps the pipe open: stop at the expected lines.
        while bytes.filter({ $0 == UInt8(ascii: "\n") }).count < expectedLines {
            let n = read(pipeFDs[0], &chunk, chunk.count)
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        close(pipeFDs[0])
        var status: Int32 = 0
        waitpid(child, &status, 0)
        return String(decoding: bytes, as: UTF8.self)
    }
}

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
                Method("Greet", inputs: [Argument("name", "s")], outputs: [Argument("greeting", "s")]) { call in
                    let name: String = try call.argument(0)
                    guard !name.isEmpty else { throw DBusError(name: "org.example.Error.Empty", message: "name is empty") }
                    _ = await counter.add()
                    return [.string("hello, \(name)")]
                }
            ],
            properties: [Property("Greetings", "i") { .int32(Int32(await counter.value)) }],
            signals: [Signal("Greeted", [Argument("name", "s")])])
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
                        Method("Wait") { _ in
                            try await Task.sleep(for: .seconds(2))
                            return []
                        }
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
