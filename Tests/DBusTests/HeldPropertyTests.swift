import TestSupport
import Testing

@testable import DBus

/// The state behind the properties, changed by the tests without
/// announcing, and how often each getter ran.
actor HeldState {
    var value: Int32 = 1
    var generation: Int32 = 1
    var constantReads = 0
    /// How often a client read `Watched` (its onRead hook).
    var watchedReads = 0
    func set(value: Int32) { self.value = value }
    func noteWatchedRead() { watchedReads += 1 }
    func bumpGeneration() { generation += 1 }
    func readConstant() -> String {
        constantReads += 1
        return "fixed"
    }
}

/// A conformance whose value is not of its declared type (a service bug).
struct Mistyped: DBusRepresentable {
    static var dbusType: DBusType { .string }
    var dbusValue: DBusValue { .int32(7) }
    init() {}
    init(dbusValue v: DBusValue) throws(DBusError) {}
}

/// `Properties.Get` and `GetAll` answer from the values the connection holds
/// (the last announced, a constant's first read) and fall back to the getter,
/// with the same errors as ever, for everything else.
@Suite(.serialized) struct HeldProperties {
    static let path: ObjectPath = "/org/example/Held"
    /// Every change behaviour.
    static let mixed = "org.example.Mixed1"
    /// Only properties whose values the connection holds: GetAll is served
    /// from them.
    static let held = "org.example.Held1"
    /// A property whose getter returns a value of the wrong type.
    static let broken = "org.example.Broken1"
    /// A property with an onRead hook.
    static let watched = "org.example.Watched1"

    struct Peers {
        let bus: PrivateBus
        let server: Connection
        let client: Connection
        let state = HeldState()

        init() async throws {
            bus = try PrivateBus()
            server = try await Connection.connect(to: .address(bus.address))
            client = try await Connection.connect(to: .address(bus.address))
            let state = state
            try await server.export(
                [
                    Interface(
                        HeldProperties.mixed,
                        methods: [
                            Method("Bump", Argument("value", Int32.self)) { call, value in
                                await state.set(value: value)
                                await call.connection.propertiesChanged(path: call.path, interface: call.interface)
                            }
                        ],
                        properties: [
                            Property("Value", Int32.self) { await state.value },
                            Property("Name", String.self, changes: .constant) { await state.readConstant() },
                            Property("Generation", Int32.self, changes: .invalidates) { await state.generation },
                            Property("Polled", Int32.self, changes: .silent) { await state.value },
                        ]),
                    Interface(HeldProperties.broken, properties: [Property("Mistyped", Mistyped.self) { Mistyped() }]),
                    Interface(
                        HeldProperties.watched,
                        properties: [
                            Property(
                                "Watched", Int32.self, get: { await state.value },
                                onRead: { Task { await state.noteWatchedRead() } })
                        ]),
                    Interface(
                        HeldProperties.held,
                        properties: [
                            Property("Value", Int32.self) { await state.value },
                            Property("Name", String.self, changes: .constant) { await state.readConstant() },
                        ]),
                ], at: HeldProperties.path)
        }

        func properties(_ member: String, _ arguments: [DBusValue]) async throws(DBusError) -> [DBusValue] {
            try await client.call(
                destination: server.uniqueName, path: HeldProperties.path,
                interface: "org.freedesktop.DBus.Properties", member: member, arguments)
        }

        func get(_ interface: String, _ name: String) async throws(DBusError) -> DBusValue? {
            try await properties("Get", [.string(interface), .string(name)]).first
        }

        func getAll(_ interface: String) async throws(DBusError) -> DBusValue? {
            try await properties("GetAll", [.string(interface)]).first
        }

        func announce(_ interface: String) async {
            await server.propertiesChanged(path: HeldProperties.path, interface: interface)
        }

        func close() async {
            await client.close()
            await server.close()
        }
    }

    @Test func getAnswersWithTheValueLastAnnounced() async throws {
        let peers = try await Peers()
        #expect(try await peers.get(Self.mixed, "Value") == .variant(.int32(1)))

        // Changed, not announced yet: not seen half-way.
        await peers.state.set(value: 2)
        #expect(try await peers.get(Self.mixed, "Value") == .variant(.int32(1)))
        // Properties that announce no value are read from their getters.
        #expect(try await peers.get(Self.mixed, "Polled") == .variant(.int32(2)))
        await peers.state.bumpGeneration()
        #expect(try await peers.get(Self.mixed, "Generation") == .variant(.int32(2)))

        await peers.announce(Self.mixed)
        #expect(try await peers.get(Self.mixed, "Value") == .variant(.int32(2)))
        await peers.close()
    }

    /// A Get behind a call still being handled waits its turn (and reads
    /// the getter, as before): it does not overtake a call sent before it.
    @Test func aGetDoesNotOvertakeACallSentBeforeIt() async throws {
        let peers = try await Peers()
        for value in Int32(2)...Int32(21) {
            let bump = try Message.methodCall(
                destination: peers.server.uniqueName, path: Self.path, interface: Self.mixed, member: "Bump")
            try bump.append([.int32(value)])
            bump.noReplyExpected = true
            try await peers.client.send(bump)
            #expect(try await peers.get(Self.mixed, "Value") == .variant(.int32(value)))
        }
        await peers.close()
    }

    /// The hook runs for every client read — from the getter or from the
    /// held value, Get or GetAll — and not when the service announces.
    @Test func onReadRunsForEveryClientRead() async throws {
        let peers = try await Peers()
        #expect(try await peers.get(Self.watched, "Watched") == .variant(.int32(1)))  // the getter
        #expect(try await peers.get(Self.watched, "Watched") == .variant(.int32(1)))  // held
        _ = try await peers.getAll(Self.watched)
        await peers.state.set(value: 3)
        await peers.announce(Self.watched)
        #expect(try await peers.get(Self.watched, "Watched") == .variant(.int32(3)))
        // The hook starts a task of its own for each read: waited for (on a
        // loaded machine they may run late), then given a moment more in
        // which an extra one would show.
        _ = try await peers.getAll(Self.held)
        let deadline = ContinuousClock.now + .seconds(5)
        while await peers.state.watchedReads < 4, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        try await Task.sleep(for: .milliseconds(50))
        #expect(await peers.state.watchedReads == 4)
        await peers.close()
    }

    @Test func aConstantPropertysGetterRunsOnce() async throws {
        let peers = try await Peers()
        for _ in 0..<5 {
            #expect(try await peers.get(Self.mixed, "Name") == .variant(.string("fixed")))
        }
        _ = try await peers.getAll(Self.mixed)
        #expect(await peers.state.constantReads == 1)
        await peers.close()
    }

    @Test func errorsAreTheSameAsFromTheGetter() async throws {
        let peers = try await Peers()
        // Read once, so that every value is held.
        _ = try await peers.getAll(Self.held)
        let object = Self.path.rawValue
        await #expect(throws: DBusError.unknownProperty("no property 'Nope' in \(Self.held)")) {
            try await peers.get(Self.held, "Nope")
        }
        await #expect(throws: DBusError.unknownInterface("no interface 'org.example.Nope1' at \(object)")) {
            try await peers.get("org.example.Nope1", "Value")
        }
        await #expect(throws: DBusError.unknownInterface("no interface '' at \(object)")) {
            try await peers.get("", "Value")
        }
        await #expect(throws: DBusError.unknownInterface("no interface 'org.example.Nope1' at \(object)")) {
            try await peers.getAll("org.example.Nope1")
        }
        await #expect(throws: DBusError.invalidArgs("expected arguments of type 'ss', got 's'")) {
            try await peers.properties("Get", [.string(Self.held)])
        }
        await #expect(throws: DBusError.invalidArgs("expected arguments of type 'ss', got 'su'")) {
            try await peers.properties("Get", [.string(Self.held), .uint32(1)])
        }
        await #expect(throws: DBusError.invalidArgs("expected arguments of type 's', got 'ss'")) {
            try await peers.properties("GetAll", [.string(Self.held), .string("Value")])
        }
        // A held value of another type than declared: the getter path reports it.
        await #expect(throws: DBusError.failed("the service returned a property of the wrong type")) {
            try await peers.get(Self.broken, "Mistyped")
        }
        await peers.close()
    }

    @Test func getAllFromHeldValuesEqualsTheGetters() async throws {
        let peers = try await Peers()
        let expected: DBusValue = .dictionary(
            key: .string, value: .variant,
            [.init(.string("Value"), .variant(.int32(1))), .init(.string("Name"), .variant(.string("fixed")))])
        // The first reads the constant; the second has every value held.
        #expect(try await peers.getAll(Self.held) == expected)
        #expect(try await peers.getAll(Self.held) == expected)

        await peers.state.set(value: 5)
        #expect(try await peers.getAll(Self.held) == expected)
        await peers.announce(Self.held)
        let announced: DBusValue = .dictionary(
            key: .string, value: .variant,
            [.init(.string("Value"), .variant(.int32(5))), .init(.string("Name"), .variant(.string("fixed")))])
        #expect(try await peers.getAll(Self.held) == announced)
        #expect(await peers.state.constantReads == 1)

        // An interface with a property read from its getter: all from the getters.
        let mixed = try #require(try await peers.getAll(Self.mixed))
        guard case .dictionary(_, _, let entries) = mixed else {
            Issue.record("GetAll returned \(mixed)")
            return
        }
        #expect(entries.map { $0.key } == ["Value", "Name", "Generation", "Polled"].map { .string($0) })
        await peers.close()
    }
}
