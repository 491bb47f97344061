import Testing
@testable import GuidedAccessCore

@Suite struct RestrictionRegistryTests {
    func registration(_ id: String) -> RestrictionRegistration {
        RestrictionRegistration(identifier: id, text: "Text of \(id)", detail: "")
    }

    func batch(_ count: Int, prefix: String = "com.example.r") -> [RestrictionRegistration] {
        (0..<count).map { registration("\(prefix)\($0)") }
    }

    @Test func aNewRestrictionStartsAllowed() throws {
        var registry = RestrictionRegistry()
        try registry.register([registration("com.example.purchase")])
        #expect(try registry.state(of: "com.example.purchase") == .allow)
    }

    @Test func twoHundredFiftySixRestrictionsMayExist() throws {
        var registry = RestrictionRegistry()
        try registry.register(batch(256))
        #expect(registry.count == 256)
    }

    @Test func theTwoHundredFiftySeventhIsLimitExceeded() throws {
        var registry = RestrictionRegistry()
        try registry.register(batch(256))
        #expect(throws: GuidedAccessError.self) { try registry.register([registration("one.more")]) }
        do {
            try registry.register([registration("one.more")])
        } catch {
            #expect(error.dbusErrorName == "org.guidedaccess.GuidedAccess1.Error.LimitExceeded")
        }
    }

    @Test func aBatchCrossingTheLimitIsRejectedWhole() throws {
        var registry = RestrictionRegistry()
        try registry.register(batch(200, prefix: "a."))
        #expect(throws: GuidedAccessError.self) { try registry.register(batch(57, prefix: "b.")) }
        #expect(registry.count == 200)
        #expect(registry.restrictions.allSatisfy { $0.identifier.hasPrefix("a.") })
    }

    @Test func reRegisteringAtTheLimitIsNotNew() throws {
        var registry = RestrictionRegistry()
        try registry.register(batch(256))
        try registry.register([RestrictionRegistration(identifier: "com.example.r0", text: "New text")])
        #expect(registry.restrictions.first { $0.identifier == "com.example.r0" }?.text == "New text")
    }

    @Test func reRegisteringUpdatesTextsAndKeepsTheState() throws {
        var registry = RestrictionRegistry()
        try registry.register([registration("com.example.purchase")])
        try registry.setState(.deny, of: "com.example.purchase")
        try registry.register([RestrictionRegistration(identifier: "com.example.purchase", text: "Buy", detail: "In-app")])
        #expect(registry.restrictions == [Restriction(identifier: "com.example.purchase", text: "Buy", detail: "In-app", state: .deny)])
    }

    @Test func anEmptyBatchIsInvalidArgs() {
        var registry = RestrictionRegistry()
        #expect(throws: GuidedAccessError.invalidArgs("the list of restrictions to register is empty")) {
            try registry.register([])
        }
    }

    @Test func aDuplicateIdentifierInTheBatchIsInvalidArgsAndRegistersNothing() {
        var registry = RestrictionRegistry()
        #expect(throws: GuidedAccessError.invalidArgs("restriction identifier 'a.b' appears twice in the batch")) {
            try registry.register([registration("a.b"), registration("c.d"), registration("a.b")])
        }
        #expect(registry.count == 0)
    }

    @Test(arguments: ["", "has space", "slash/no", "ümlaut", String(repeating: "x", count: 256)])
    func anIdentifierOutsideTheAlphabetOrLengthIsInvalidArgs(_ id: String) {
        #expect(throws: GuidedAccessError.self) { try RestrictionRegistration(identifier: id, text: "Purchases").validate() }
    }

    @Test(arguments: ["a", "com.example.Kiosk_1-purchase", String(repeating: "x", count: 255)])
    func anIdentifierOfOneTo255AllowedCharactersIsValid(_ id: String) throws {
        try RestrictionRegistration(identifier: id, text: "Purchases").validate()
    }

    @Test func theInvalidArgsMessageNamesTheIdentifier() {
        #expect(throws: GuidedAccessError.invalidArgs(
            "restriction identifier 'has space' contains ' '; only A-Z a-z 0-9 . _ - are allowed")) {
            try registration("has space").validate()
        }
    }

    @Test func textIsOneTo200BytesOfUTF8() throws {
        try RestrictionRegistration(identifier: "a", text: String(repeating: "é", count: 100)).validate()  // 200 bytes
        #expect(throws: GuidedAccessError.self) {
            try RestrictionRegistration(identifier: "a", text: String(repeating: "é", count: 100) + "x").validate()
        }
        #expect(throws: GuidedAccessError.self) { try RestrictionRegistration(identifier: "a", text: "").validate() }
    }

    @Test func detailIsAtMost1000Bytes() throws {
        try RestrictionRegistration(identifier: "a", text: "t", detail: String(repeating: "d", count: 1000)).validate()
        #expect(throws: GuidedAccessError.invalidArgs("detail of restriction 'a' is 1001 bytes, at most 1000 allowed")) {
            try RestrictionRegistration(identifier: "a", text: "t", detail: String(repeating: "d", count: 1001)).validate()
        }
    }

    @Test func unregisteringAnUnknownRestrictionRemovesNothing() throws {
        var registry = RestrictionRegistry()
        try registry.register([registration("a"), registration("b")])
        #expect(throws: GuidedAccessError.unknownRestriction("no restriction 'zzz' is registered")) {
            try registry.unregister(["a", "zzz"])
        }
        #expect(registry.count == 2)
        try registry.unregister(["a"])
        #expect(registry.restrictions.map(\.identifier) == ["b"])
    }

    @Test func anIdentifierNamedTwiceIsInvalidArgsAndUnregistersNothing() throws {
        var registry = RestrictionRegistry()
        try registry.register([registration("a"), registration("b")])
        #expect(throws: GuidedAccessError.invalidArgs("restriction identifier 'a' appears twice in the list")) {
            try registry.unregister(["a", "b", "a"])
        }
        #expect(registry.count == 2)
    }

    @Test func moreIdentifiersThanMayExistIsInvalidArgs() throws {
        var registry = RestrictionRegistry()
        try registry.register(batch(256))
        let identifiers = (0..<257).map { "com.example.r\($0)" }
        #expect(throws: GuidedAccessError.invalidArgs("257 identifiers to unregister, more than the 256 that may exist")) {
            try registry.unregister(identifiers)
        }
        #expect(registry.count == 256)
    }

    @Test func aBatchLongerThanTheLimitIsLimitExceededWhateverItHolds() {
        var registry = RestrictionRegistry()
        // Repeats and all: more than may exist is too many.
        #expect(throws: GuidedAccessError.limitExceeded("a batch of 300 restrictions is more than the 256 that may exist")) {
            try registry.register(Array(repeating: registration("a.b"), count: 300))
        }
        #expect(registry.count == 0)
    }

    @Test func settingAStateReportsWhetherItChanged() throws {
        var registry = RestrictionRegistry()
        try registry.register([registration("a")])
        let first = try registry.setState(.deny, of: "a")
        let second = try registry.setState(.deny, of: "a")
        #expect(first)
        #expect(!second)
        #expect(try registry.state(of: "a") == .deny)
    }

    @Test func anUnknownStateIsInvalidArgs() {
        #expect(throws: GuidedAccessError.invalidArgs("restriction state 'maybe' is neither 'allow' nor 'deny'")) {
            try RestrictionState(wireName: "maybe")
        }
    }

    @Test func restrictionsListSortedByIdentifier() throws {
        var registry = RestrictionRegistry()
        try registry.register([registration("c"), registration("a"), registration("b")])
        #expect(registry.restrictions.map(\.identifier) == ["a", "b", "c"])
    }

    @Test func resetAllAllowsEverythingAndNamesTheDeniedInOrder() throws {
        var registry = RestrictionRegistry()
        try registry.register([registration("c"), registration("a"), registration("b")])
        try registry.setState(.deny, of: "c")
        try registry.setState(.deny, of: "a")
        let reset = registry.resetAll()
        #expect(reset == ["a", "c"])
        #expect(registry.restrictions.allSatisfy { $0.state == .allow })
        let resetAgain = registry.resetAll()
        #expect(resetAgain.isEmpty)
    }
}
