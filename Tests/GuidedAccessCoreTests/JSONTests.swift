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

/// The writer's output, byte for byte: the journal's bytes must not change
/// with how they are made.
@Suite struct JSONWriterTests {
    static let unicorn = "\u{1F984}"
    static let family = "\u{1F469}\u{200D}\u{1F469}\u{200D}\u{1F467}"
    static let flag = "\u{1F1EB}\u{1F1F7}"

    @Test func trickyStringsAreWrittenAsTheyAlwaysWere() throws {
        let value = JSON.object([
            ("quotes", .string("say \"hi\" \"\"")),
            ("backslashes", .string("C:\\path\\ and \\\" and \\\\ and \\n")),
            ("controls", .string("\u{00}\u{01}\u{07}\u{08}\t\n\u{0B}\u{0C}\r\u{0E}\u{1B}\u{1F} \u{7F}")),
            ("non-ASCII", .string("Détail ümlaut ß ✓ – “curly” \u{00A0}\u{2028}\u{2029}\u{FEFF}\u{FFFD}")),
            ("emoji", .string("\(Self.unicorn) \(Self.family) \(Self.flag) e\u{301}\u{10FFFF}")),
            ("", .string("")),
            ("key \"with\" \\ and \n", .array([
                .string("\u{1F}\(Self.unicorn)\""), .number("1.5e-7"), .bool(true), .null, .array([]), .object([]),
            ])),
            ("nested", .object([("a", .array([.object([("b", .string("c"))]), .array([.array([])])]))])),
        ])
        // The output of the String-based writer this one replaced.
        let expected = #"""
            {
              "quotes" : "say \"hi\" \"\"",
              "backslashes" : "C:\\path\\ and \\\" and \\\\ and \\n",
              "controls" : "\u0000\u0001\u0007\u0008\t\n\u000b\u000c\r\u000e\u001b\u001f \#u{7F}",
              "non-ASCII" : "Détail ümlaut ß ✓ – “curly” \#u{A0}\#u{2028}\#u{2029}\#u{FEFF}\#u{FFFD}",
              "emoji" : "\#u{1F984} \#u{1F469}\#u{200D}\#u{1F469}\#u{200D}\#u{1F467} \#u{1F1EB}\#u{1F1F7} e\#u{301}\#u{10FFFF}",
              "" : "",
              "key \"with\" \\ and \n" : [
                "\u001f\#u{1F984}\"",
                1.5e-7,
                true,
                null,
                [],
                {}
              ],
              "nested" : {
                "a" : [
                  {
                    "b" : "c"
                  },
                  [
                    []
                  ]
                ]
              }
            }

            """#
        #expect(value.serializedBytes() == Array(expected.utf8))
        #expect(value.serialized() == expected)
        #expect(try JSON.parse(value.serializedBytes()) == value)
    }

    @Test func everyASCIICharacterIsWrittenAsTheyAlwaysWere() {
        for byte in UInt8(0)...0x7F {
            let text = String(UnicodeScalar(byte))
            for string in [text, "a" + text, text + "b", "a" + text + "b" + text + text + "c"] {
                let value = JSON.array([.string(string)])
                #expect(value.serializedBytes() == Array(Reference.serialized(value).utf8), "byte \(byte)")
            }
        }
    }

    @Test func manyStringsAreWrittenAsTheyAlwaysWere() throws {
        // Scalars from every UTF-8 length, the escaped ones more often.
        let pool: [Unicode.Scalar] = (0..<0x80).compactMap(Unicode.Scalar.init) + [
            "\u{80}", "\u{A0}", "\u{E9}", "\u{7FF}", "\u{800}", "\u{2028}", "\u{D7FF}", "\u{E000}", "\u{FEFF}",
            "\u{FFFD}", "\u{FFFF}", "\u{10000}", "\u{1F984}", "\u{1F469}", "\u{200D}", "\u{301}", "\u{10FFFF}",
            "\"", "\\", "\n", "\u{01}", "\u{1F}",
        ]
        var generator = SplitMix64(seed: 0x5EED)
        for round in 0..<500 {
            var strings: [String] = []
            for _ in 0..<4 {
                var scalars = String.UnicodeScalarView()
                // Now and then longer than the writer's first capacity.
                let length = round % 50 == 0 ? 1500 : Int(generator.next() % 40)
                for _ in 0..<length { scalars.append(pool[Int(generator.next() % UInt64(pool.count))]) }
                strings.append(String(scalars))
            }
            let value = JSON.object([
                (strings[0], .string(strings[1])),
                ("list", .array([.string(strings[2]), .object([(strings[3], .number("42"))])])),
            ])
            let bytes = value.serializedBytes()
            #expect(bytes == Array(Reference.serialized(value).utf8), "round \(round)")
            #expect(try JSON.parse(bytes) == value)
        }
    }

    @Test func theCapacityIsOnlyAHint() {
        let value = JSON.array(Array(repeating: .string(String(repeating: "\u{01}é", count: 100)), count: 20))
        #expect(value.serializedBytes(reservingCapacity: 0) == Array(Reference.serialized(value).utf8))
        #expect(value.serializedBytes(reservingCapacity: 1 << 16) == Array(Reference.serialized(value).utf8))
    }

    /// The writer as it was before it wrote bytes (String appends, one per
    /// scalar): what the output is compared with.
    enum Reference {
        static func serialized(_ value: JSON) -> String {
            var out = ""
            write(value, into: &out, indent: 0)
            return out + "\n"
        }

        static func write(_ value: JSON, into out: inout String, indent: Int) {
            let pad = String(repeating: "  ", count: indent + 1)
            let closePad = String(repeating: "  ", count: indent)
            switch value {
            case .null: out += "null"
            case .bool(let b): out += b ? "true" : "false"
            case .number(let n): out += n
            case .string(let s): quote(s, into: &out)
            case .array(let items):
                guard !items.isEmpty else {
                    out += "[]"
                    return
                }
                out += "[\n"
                for (i, item) in items.enumerated() {
                    out += pad
                    write(item, into: &out, indent: indent + 1)
                    out += i + 1 < items.count ? ",\n" : "\n"
                }
                out += closePad + "]"
            case .object(let members):
                guard !members.isEmpty else {
                    out += "{}"
                    return
                }
                out += "{\n"
                for (i, (key, value)) in members.enumerated() {
                    out += pad
                    quote(key, into: &out)
                    out += " : "
                    write(value, into: &out, indent: indent + 1)
                    out += i + 1 < members.count ? ",\n" : "\n"
                }
                out += closePad + "}"
            }
        }

        static func quote(_ s: String, into out: inout String) {
            out += "\""
            for scalar in s.unicodeScalars {
                switch scalar {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case "\n": out += "\\n"
                case "\r": out += "\\r"
                case "\t": out += "\\t"
                case _ where scalar.value < 0x20:
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                default: out.unicodeScalars.append(scalar)
                }
            }
            out += "\""
        }
    }

    /// A seeded generator, so a failure can be run again.
    struct SplitMix64: RandomNumberGenerator {
        var state: UInt64
        init(seed: UInt64) { state = seed }
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }
}
