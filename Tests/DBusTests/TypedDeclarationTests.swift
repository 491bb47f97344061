import TestSupport
import Testing

@testable import DBus

/// `(ss)`: a key and its label. An empty label has the right signature but
/// does not decode.
struct Labelled: DBusRepresentable, Equatable {
    var key: String
    var label: String

    init(_ key: String, _ label: String) {
        self.key = key
        self.label = label
    }

    static var dbusType: DBusType { .structure([.string, .string]) }
    var dbusValue: DBusValue { .structure([.string(key), .string(label)]) }
    init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .structure(let fields) = v, fields.count == 2 else {
            throw .invalidArgs("expected '(ss)', got '\(v.type.signature)'")
        }
        key = try String(dbusValue: fields[0])
        label = try String(dbusValue: fields[1])
        guard !label.isEmpty else { throw .invalidArgs("the label of '\(key)' is empty") }
    }
}

/// A conformance that rejects a value with an error name of its own.
enum Colour: String, DBusRepresentable {
    case red, green

    static var dbusType: DBusType { .string }
    var dbusValue: DBusValue { .string(rawValue) }
    init(dbusValue v: DBusValue) throws(DBusError) {
        let text = try String(dbusValue: v)
        guard let colour = Colour(rawValue: text) else {
            throw DBusError(name: "org.example.Error.NoSuchColour", message: "no colour '\(text)'")
        }
        self = colour
    }
}

/// A type the specification does not allow: a dictionary keyed by a variant.
struct KeyedByVariant: DBusRepresentable {
    static var dbusType: DBusType { .dictionary(key: .variant, value: .string) }
    var dbusValue: DBusValue { .dictionary(key: .variant, value: .string, []) }
    init(dbusValue v: DBusValue) throws(DBusError) { throw .invalidArgs("never") }
}

/// What the handlers received, in order.
actor Log {
    var entries: [String] = []
    var labels: [Labelled] = [Labelled("k", "first")]
    func add(_ entry: String) { entries.append(entry) }
    func setLabels(_ new: [Labelled]) { labels = new }
}

/// A server exporting an interface whose handlers write to `log`, and a
/// client, on a bus of their own: the fixture of the suites that test
/// declarations on a real bus.
struct LoggedPeers {
    let bus: PrivateBus
    let server: Connection
    let client: Connection
    let log = Log()
    let name: String
    let path: ObjectPath

    init(serving interface: (Log) -> Interface, name: String, at path: ObjectPath) async throws {
        self.name = name
        self.path = path
        bus = try PrivateBus()
        server = try await Connection.connect(to: .address(bus.address))
        client = try await Connection.connect(to: .address(bus.address))
        try await server.export([interface(log)], at: path)
    }

    @discardableResult
    func call(_ member: String, _ arguments: [DBusValue] = []) async throws(DBusError) -> [DBusValue] {
        try await client.call(destination: server.uniqueName, path: path, interface: name, member: member, arguments)
    }

    func callError(_ member: String, _ arguments: [DBusValue]) async -> DBusError? {
        do {
            try await call(member, arguments)
            return nil
        } catch {
            return error
        }
    }

    func close() async {
        await client.close()
        await server.close()
    }
}

@Suite(.serialized) struct TypedDeclarations {
    static let name = "org.example.Typed1"
    static let path: ObjectPath = "/org/example/Typed"

    /// One method of each typed form, each logging what it received.
    static func interface(_ log: Log) -> Interface {
        Interface(
            name,
            methods: [
                Method("Zero") { _ in await log.add("Zero") },
                Method("ZeroOut", returns: Argument("answer", String.self)) { _ in "zero" },
                Method("One", Argument("colour", Colour.self)) { _, colour in await log.add("One \(colour)") },
                Method("OneOut", Argument("n", UInt32.self), returns: Argument("double", UInt32.self)) { _, n in
                    n * 2
                },
                Method("Two", Argument("items", [Labelled].self), Argument("colour", Colour.self)) {
                    _, items, colour in
                    await log.add("Two \(items.map { "\($0.key)=\($0.label)" }) \(colour)")
                },
                Method(
                    "TwoOut", Argument("a", Int32.self), Argument("b", String.self),
                    returns: Argument("joined", String.self)
                ) { _, a, b in "\(a)\(b)" },
                Method("Three", Argument("a", String.self), Argument("b", Bool.self), Argument("c", Double.self)) {
                    _, a, b, c in
                    await log.add("Three \(a) \(b) \(c)")
                },
                Method(
                    "ThreeOut", Argument("items", [Labelled].self), Argument("colour", Colour.self),
                    Argument("limit", UInt32.self), returns: Argument("kept", [Labelled].self)
                ) { call, items, colour, limit in
                    await log.add("ThreeOut from \(call.sender.isEmpty ? "nobody" : "a sender") \(colour)")
                    return Array(items.prefix(Int(limit)))
                },
                // The handler queues work that ends the connection: the
                // reply must leave before it runs.
                Method("Quit") { call in
                    Task(executorPreference: call.connection.loop) { await call.connection.close() }
                },
            ],
            properties: [
                Property("Labels", [Labelled].self, get: { await log.labels }) { labels, _ in
                    await log.setLabels(labels)
                }
            ],
            signals: [
                Signal("Tagged", Argument("item", Labelled.self), Argument("extra", [String: Variant].self)),
                Signal("Reset"),
            ])
    }

    @Test func signaturesComeFromTheArgumentTypes() throws {
        let interface = Self.interface(Log())
        #expect(interface.method("ThreeOut")?.inputSignature == "a(ss)su")
        #expect(interface.method("ThreeOut")?.outputSignature == "a(ss)")
        #expect(interface.method("Zero")?.inputSignature == "")
        #expect(interface.property("Labels")?.type.signature == "a(ss)")
        #expect(interface.signal("Tagged")?.signature == "(ss)a{sv}")

        let xml = Introspection.xml(interfaces: [interface], children: [])
        #expect(
            xml.contains(
                """
                    <method name="ThreeOut">
                      <annotation name="org.qtproject.QtDBus.QtTypeName.In0" value="QDBusArgument"/>
                      <annotation name="org.qtproject.QtDBus.QtTypeName.Out0" value="QDBusArgument"/>
                      <arg type="a(ss)" name="items" direction="in"/>
                      <arg type="s" name="colour" direction="in"/>
                      <arg type="u" name="limit" direction="in"/>
                      <arg type="a(ss)" name="kept" direction="out"/>
                    </method>
                """))
        #expect(xml.contains("    <method name=\"Zero\"/>\n"))
        #expect(
            xml.contains(
                """
                    <signal name="Tagged">
                      <annotation name="org.qtproject.QtDBus.QtTypeName.Out0" value="QDBusArgument"/>
                      <annotation name="org.qtproject.QtDBus.QtTypeName.In0" value="QDBusArgument"/>
                      <annotation name="org.qtproject.QtDBus.QtTypeName.Out1" value="QVariantMap"/>
                      <annotation name="org.qtproject.QtDBus.QtTypeName.In1" value="QVariantMap"/>
                      <arg type="(ss)" name="item"/>
                      <arg type="a{sv}" name="extra"/>
                    </signal>
                """))
        #expect(xml.contains("    <signal name=\"Reset\"/>\n"))
        // Qt's type for what qdbusxml2cpp does not know.
        #expect(
            xml.contains(
                "<property name=\"Labels\" type=\"a(ss)\" access=\"readwrite\">\n"
                    + "      <annotation name=\"org.qtproject.QtDBus.QtTypeName\" value=\"QDBusArgument\"/>\n"))
    }

    @Test func aTypeTheSpecificationForbidsStopsTheDeclaration() async {
        await #expect(processExitsWith: .failure) {
            _ = Argument("bad", KeyedByVariant.self)
        }
    }

    static func peers() async throws -> LoggedPeers {
        try await LoggedPeers(serving: interface, name: name, at: path)
    }

    static let items: DBusValue = [Labelled("a", "one"), Labelled("b", "two"), Labelled("c", "three")].dbusValue

    @Test func handlersReceiveTheDecodedValuesAndReturnTheirOutput() async throws {
        let peers = try await Self.peers()
        #expect(try await peers.call("Zero") == [])
        #expect(try await peers.call("ZeroOut") == [.string("zero")])
        #expect(try await peers.call("One", [.string("green")]) == [])
        #expect(try await peers.call("OneOut", [.uint32(21)]) == [.uint32(42)])
        #expect(try await peers.call("Two", [Self.items, .string("red")]) == [])
        #expect(try await peers.call("TwoOut", [.int32(-7), .string("x")]) == [.string("-7x")])
        #expect(try await peers.call("Three", [.string("s"), .bool(true), .double(0.5)]) == [])
        let kept = try await peers.call("ThreeOut", [Self.items, .string("red"), .uint32(2)])
        #expect(kept == [[Labelled("a", "one"), Labelled("b", "two")].dbusValue])
        #expect(
            await peers.log.entries == [
                "Zero", "One green", "Two [\"a=one\", \"b=two\", \"c=three\"] red", "Three s true 0.5",
                "ThreeOut from a sender red",
            ])
        await peers.close()
    }

    @Test func contentThatDoesNotDecodeIsInvalidArgsNamingTheProblem() async throws {
        let peers = try await Self.peers()
        let unlabelled: DBusValue = [Labelled("a", "one"), Labelled("b", "")].dbusValue
        // The signature is right ('a(ss)su'); an element's content is not.
        let error = await peers.callError("ThreeOut", [unlabelled, .string("red"), .uint32(1)])
        #expect(error?.name == "org.freedesktop.DBus.Error.InvalidArgs")
        #expect(error?.message == "ThreeOut argument 'items': the label of 'b' is empty")

        // A conformance's own error name still reaches the caller as InvalidArgs.
        let colour = await peers.callError("Two", [Self.items, .string("blue")])
        #expect(colour?.name == "org.freedesktop.DBus.Error.InvalidArgs")
        #expect(colour?.message == "Two argument 'colour': no colour 'blue'")

        // No handler ran, and the service goes on answering.
        #expect(await peers.log.entries == [])
        #expect(try await peers.call("One", [.string("red")]) == [])
        await peers.close()
    }

    @Test func aCallOfAnotherSignatureIsInvalidArgsBeforeDecoding() async throws {
        let peers = try await Self.peers()
        let error = await peers.callError("OneOut", [.string("21")])
        #expect(error?.name == "org.freedesktop.DBus.Error.InvalidArgs")
        #expect(error?.message.contains("'u'") == true)
        #expect(error?.message.contains("'s'") == true)
        await peers.close()
    }

    @Test func typedPropertiesReadAndWriteTheirValues() async throws {
        let peers = try await Self.peers()
        let properties = "org.freedesktop.DBus.Properties"
        func get() async throws -> [DBusValue] {
            try await peers.client.call(
                destination: peers.server.uniqueName, path: Self.path, interface: properties, member: "Get",
                [.string(Self.name), .string("Labels")])
        }
        func set(_ value: DBusValue) async throws {
            _ = try await peers.client.call(
                destination: peers.server.uniqueName, path: Self.path, interface: properties, member: "Set",
                [.string(Self.name), .string("Labels"), .variant(value)])
        }
        #expect(try await get() == [.variant([Labelled("k", "first")].dbusValue)])
        try await set([Labelled("n", "new")].dbusValue)
        #expect(await peers.log.labels == [Labelled("n", "new")])

        await #expect(throws: DBusError.invalidArgs("property 'Labels': the label of 'n' is empty")) {
            try await set([Labelled("n", "")].dbusValue)
        }
        let wrongType = await #expect(throws: DBusError.self) { try await set(.string("n")) }
        #expect(wrongType?.name == "org.freedesktop.DBus.Error.InvalidArgs")
        #expect(await peers.log.labels == [Labelled("n", "new")])
        await peers.close()
    }

    @Test func theReplyLeavesBeforeWorkTheHandlerQueued() async throws {
        let peers = try await Self.peers()
        #expect(try await peers.call("Quit") == [])
        await peers.server.waitUntilDisconnected()
        await peers.client.close()
    }
}
