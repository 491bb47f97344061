import Testing

@testable import GuidedAccessService

@Suite struct LogTextTests {
    @Test func plainTextIsUnchanged() {
        #expect(LogText.escaped("uid 0 running /usr/bin/kiosk-browser, é 🦄") == "uid 0 running /usr/bin/kiosk-browser, é 🦄")
    }

    @Test func aCarriageReturnAndLineFeedAreTwoEscapesThoughSwiftSeesOneCharacter() {
        #expect("\r\n".count == 1)
        #expect(LogText.escaped("/tmp/evil\r\n<2>forged") == "/tmp/evil\\r\\n<2>forged")
    }

    @Test(arguments: [
        ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\u{0}", "\\x00"), ("\u{1b}", "\\x1b"), ("\u{7f}", "\\x7f"),
        ("\u{85}", "\\u0085"), ("\u{9f}", "\\u009f"), ("\u{2028}", "\\u2028"), ("\u{2029}", "\\u2029"), ("\\", "\\\\"),
    ])
    func everyControlCharacterIsEscaped(_ text: String, _ escaped: String) {
        #expect(LogText.escaped("a\(text)b") == "a\(escaped)b")
    }

    @Test func longTextIsCutSayingHowMuch() {
        let cut = LogText.escaped(String(repeating: "x", count: 10_000))
        #expect(cut == String(repeating: "x", count: 4096) + "… [5904 bytes cut]")
    }

    @Test func theCutNeverSplitsAnEscapeOrACharacter() {
        #expect(LogText.escaped("ab\ncd", limit: 3) == "ab… [3 bytes cut]")
        #expect(LogText.escaped("aé", limit: 2) == "a… [2 bytes cut]")
    }

    @Test func anAuditRecordHasOneLinePerFieldWithItsValueEscaped() {
        let datagram = AuditLog.datagram([("MESSAGE", "started by /tmp/a\r\n<2>b"), ("PRIORITY", "5")])
        #expect(String(decoding: datagram, as: UTF8.self) == "MESSAGE=started by /tmp/a\\r\\n<2>b\nPRIORITY=5\n")
    }
}
