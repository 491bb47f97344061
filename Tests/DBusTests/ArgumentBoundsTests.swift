import TestSupport
import Testing

@testable import DBus

/// A server whose methods bound their arguments, and a client, on a bus of
/// their own. Each handler logs what it received.
@Suite(.serialized) struct ArgumentBoundsOnAPrivateBus {
    static let name = "org.example.Bounded1"
    static let path: ObjectPath = "/org/example/Bounded"

    static func interface(_ log: Log) -> Interface {
        Interface(
            name,
            methods: [
                Method("Names", Argument("names", [String].self, bounds: .init(elements: 3, stringBytes: 5))) {
                    _, names in await log.add("Names \(names)")
                },
                Method(
                    "Batch",
                    Argument(
                        "items", [Labelled].self,
                        bounds: .init(elements: 2, elementsErrorName: "org.example.Error.TooMany"))
                ) { _, items in await log.add("Batch \(items.count)") },
                Method("Options", Argument("options", [String: Variant].self, bounds: .init(elements: 2, values: 10))) {
                    _, options in await log.add("Options \(options.keys.sorted())")
                },
                Method("Unbounded", Argument("names", [String].self)) { _, names in
                    await log.add("Unbounded \(names.count)")
                },
            ])
    }

    static func peers() async throws -> LoggedPeers {
        try await LoggedPeers(serving: interface, name: name, at: path)
    }

    static func names(_ count: Int, _ name: String = "x") -> DBusValue {
        Array(repeating: name, count: count).dbusValue
    }

    @Test func argumentsWithinTheirBoundsReachTheHandler() async throws {
        let peers = try await Self.peers()
        try await peers.call("Names", [Self.names(3, "fives")])
        try await peers.call("Batch", [[Labelled("a", "one"), Labelled("b", "two")].dbusValue])
        try await peers.call("Options", [["a": Variant(["x", "y"]), "b": Variant(UInt32(1))].dbusValue])
        #expect(
            await peers.log.entries == [
                "Names [\"fives\", \"fives\", \"fives\"]", "Batch 2", "Options [\"a\", \"b\"]",
            ])
        await peers.close()
    }

    @Test func moreElementsThanTheBoundIsInvalidArgsNamingTheArgumentTheCountAndTheBound() async throws {
        let peers = try await Self.peers()
        await #expect(throws: DBusError.invalidArgs("Names argument 'names': 100000 elements, more than the 3 allowed")) {
            try await peers.call("Names", [Self.names(100_000)])
        }
        await #expect(throws: DBusError.invalidArgs("Options argument 'options': 3 elements, more than the 2 allowed")) {
            try await peers.call("Options", [["a": Variant(true), "b": Variant(true), "c": Variant(true)].dbusValue])
        }
        #expect(await peers.log.entries == [])
        await peers.close()
    }

    @Test func aBoundMayAnswerWithTheErrorItsAPINames() async throws {
        let peers = try await Self.peers()
        let items = [Labelled("a", "1"), Labelled("b", "2"), Labelled("c", "3")].dbusValue
        let tooMany = DBusError(
            name: "org.example.Error.TooMany", message: "Batch argument 'items': 3 elements, more than the 2 allowed")
        await #expect(throws: tooMany) {
            try await peers.call("Batch", [items])
        }
        await peers.close()
    }

    @Test func aLongerStringIsInvalidArgsBeforeItIsCopied() async throws {
        let peers = try await Self.peers()
        await #expect(throws: DBusError.invalidArgs("Names argument 'names': a string of 6 bytes, more than the 5 allowed")) {
            try await peers.call("Names", [["ok", "sixsix"].dbusValue])
        }
        #expect(await peers.log.entries == [])
        await peers.close()
    }

    @Test func valuesNestedInVariantsCountAgainstTheArgument() async throws {
        let peers = try await Self.peers()
        // The dictionary, a key, its variant, the list and 7 names: 11 values.
        await #expect(throws: DBusError.invalidArgs("Options argument 'options': more than the 10 values allowed")) {
            try await peers.call("Options", [["a": Variant(Array(repeating: "x", count: 7))].dbusValue])
        }
        try await peers.call("Options", [["a": Variant(Array(repeating: "x", count: 6))].dbusValue])
        #expect(await peers.log.entries == ["Options [\"a\"]"])
        await peers.close()
    }

    @Test func anArgumentDeclaredWithoutBoundsTakesWhatTheBusCarries() async throws {
        let peers = try await Self.peers()
        try await peers.call("Unbounded", [Self.names(100_000)])
        #expect(await peers.log.entries == ["Unbounded 100000"])
        await peers.close()
    }
}
