import Testing

@testable import BrowserLayer

@Suite struct PipeFramingTests {
    /// The messages of `bytes` fed `chunk` bytes at a time.
    func decode(_ bytes: [UInt8], limit: Int = 1 << 20, chunk: Int = .max) -> [WebSocket.Incoming] {
        var decoder = PipeFraming.Decoder(limit: limit)
        var out: [WebSocket.Incoming] = []
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + chunk)
            bytes[offset..<end].withUnsafeBytes { decoder.feed($0) }
            offset = end
            while let message = decoder.next() { out.append(message) }
        }
        return out
    }

    @Test func messagesAreCutAtEachNULHoweverTheReadsFall() {
        let stream = PipeFraming.frame(Array(#"{"id":1}"#.utf8)) + PipeFraming.frame(Array(#"{"method":"a"}"#.utf8))
            + PipeFraming.frame([])
        let expected: [WebSocket.Incoming] = [.text(Array(#"{"id":1}"#.utf8)), .text(Array(#"{"method":"a"}"#.utf8)), .text([])]
        for chunk in [1, 2, 3, 7, 100] {
            #expect(decode(stream, chunk: chunk) == expected, "reads of \(chunk) bytes")
        }
    }

    @Test func aMessageNotYetEndedIsNotGiven() {
        #expect(decode(Array(#"{"id":1}"#.utf8)).isEmpty)
    }

    @Test func aMessageOverTheLimitIsSkippedWholeAndTheStreamStaysInStep() {
        let long = [UInt8](repeating: UInt8(ascii: "x"), count: 100)
        let stream = PipeFraming.frame(long) + PipeFraming.frame(Array("ok".utf8))
        for chunk in [1, 10, 64, 1000] {
            #expect(decode(stream, limit: 64, chunk: chunk) == [.skipped(100), .text(Array("ok".utf8))], "reads of \(chunk) bytes")
        }
        // At the limit exactly: kept.
        #expect(decode(PipeFraming.frame(Array(long.prefix(64))), limit: 64) == [.text(Array(long.prefix(64)))])
    }
}
