import Testing

@testable import GuidedAccessCore

@Suite struct JSONTests {
    @Test func valuesRoundTripThroughTheirText() throws {
        let value = JSON.object([
            ("deadline", .number(String(UInt64.max))),
            ("factor", .number(String(0.1 + 0.2))),
            ("text", .string("quote \" backslash \\ newline \n tab \t bell \u{07} ümlaut ✓ 🦄")),
            ("list", .array([.bool(true), .bool(false), .null, .array([]), .object([])])),
        ])
        let text = value.serialized()
        #expect(try JSON.parse(Array(text.utf8)) == value)
        guard case .number(let deadline)? = try JSON.parse(Array(text.utf8))["deadline"] else {
            Issue.record("no deadline")
            return
        }
        #expect(UInt64(deadline) == UInt64.max)
    }

    @Test func escapesAndSurrogatePairsAreRead() throws {
        let parsed = try JSON.parse(Array(#"{"a": "\u00fc\ud83e\udd84\/\b"}"#.utf8))
        #expect(parsed["a"] == .string("ü🦄/\u{08}"))
    }

    @Test func malformedInputIsAnErrorWithItsOffset() {
        for text in ["", "{", "{\"a\" 1}", "[1,]", "\"abc", "{\"a\": tru}", "[1] 2", "\"\u{01}\""] {
            #expect(throws: JSON.ParseError.self) { try JSON.parse(Array(text.utf8)) }
        }
        #expect(throws: JSON.ParseError.self) { try JSON.parse([0x22, 0xFF, 0x22]) }  // invalid UTF-8
    }
}
