import Testing
@testable import BrowserLayer

@Suite struct WebSocketFramingTests {
    /// A server frame (unmasked).
    func serverFrame(_ opcode: UInt8, _ payload: [UInt8], fin: Bool = true) -> [UInt8] {
        var out: [UInt8] = [(fin ? 0x80 : 0) | opcode]
        if payload.count < 126 {
            out.append(UInt8(payload.count))
        } else if payload.count < 65536 {
            out += [126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        } else {
            out.append(127)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((payload.count >> shift) & 0xFF)) }
        }
        return out + payload
    }

    /// The messages of `bytes` fed `chunk` bytes at a time; `afterEach`
    /// sees the decoder after each read's messages are taken.
    func decode(
        _ bytes: [UInt8], limit: Int = 1 << 20, chunk: Int = .max, afterEach: (WebSocket.Decoder) -> Void = { _ in }
    ) throws -> [WebSocket.Incoming] {
        var decoder = WebSocket.Decoder(limit: limit)
        var out: [WebSocket.Incoming] = []
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + chunk)
            bytes[offset..<end].withUnsafeBytes { decoder.feed($0) }
            offset = end
            while let message = try decoder.next() { out.append(message) }
            afterEach(decoder)
        }
        return out
    }

    @Test func theHandshakeAcceptIsRFC6455sExample() {
        // RFC 6455 section 1.3.
        #expect(WebSocket.accept(for: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        #expect(WebSocket.base64(Array("foob".utf8)) == "Zm9vYg==")
        #expect(WebSocket.base64(Array("fooba".utf8)) == "Zm9vYmE=")
        #expect(WebSocket.newKey().count == 24)
    }

    @Test func aClientFrameIsMaskedAndUnmasksToThePayload() {
        for count in [0, 5, 125, 126, 65535, 65536] {
            let payload = (0..<count).map { UInt8($0 & 0xFF) }
            let frame = WebSocket.frame(.text, payload)
            #expect(frame[0] == 0x81)
            #expect(frame[1] & 0x80 != 0)
            let header = count < 126 ? 2 : count < 65536 ? 4 : 10
            let mask = Array(frame[header..<(header + 4)])
            let unmasked = frame[(header + 4)...].enumerated().map { $0.element ^ mask[$0.offset & 3] }
            #expect(unmasked == payload, "length \(count)")
        }
    }

    @Test func messagesComeWholeHoweverTheBytesArrive() throws {
        let text = Array(#"{"id":1,"result":{}}"#.utf8)
        let big = [UInt8](repeating: UInt8(ascii: "x"), count: 70000)
        let stream = serverFrame(0x1, text) + serverFrame(0x9, [1, 2]) + serverFrame(0x1, Array(big[..<30000]), fin: false)
            + serverFrame(0xA, []) + serverFrame(0x0, Array(big[30000...])) + serverFrame(0x8, [])
        for chunk in [1, 7, 4096, .max] {
            let messages = try decode(stream, chunk: chunk)
            #expect(messages == [.text(text), .ping([1, 2]), .pong, .text(big), .close], "chunk \(chunk)")
        }
    }

    @Test func aMessageOverTheLimitIsSkippedAndTheStreamStaysInStep() throws {
        let big = [UInt8](repeating: 0x41, count: 5000)
        let after = Array("{}".utf8)
        let stream = serverFrame(0x1, Array(big[..<3000]), fin: false) + serverFrame(0x0, Array(big[3000...]))
            + serverFrame(0x1, after)
        for chunk in [1, 100, .max] {
            let messages = try decode(stream, limit: 1000, chunk: chunk) { decoder in
                #expect(decoder.buffered <= 1100, "kept \(decoder.buffered) bytes of a message being skipped")
            }
            #expect(messages == [.skipped(5000), .text(after)], "chunk \(chunk)")
        }
    }

    @Test(arguments: [
        ([0x81, 0x82, 0, 0, 0, 0, 0x41, 0x42], "a masked frame from the server"),
        ([0xC1, 0x00], "a frame with reserved bits set"),
        ([0x82, 0x01, 0x00], "a binary message"),
        ([0x83, 0x00], "a frame of unknown opcode 3"),
        ([0x80, 0x00], "a continuation frame with no message begun"),
        ([0x01, 0x01, 0x41, 0x81, 0x00], "a new message before the last one ended"),
        ([0x09, 0x00], "a fragmented or long control frame"),
        ([0x89, 0x7E, 0x00, 0x80] + [UInt8](repeating: 0, count: 128), "a fragmented or long control frame"),
        ([0x81, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF], "a frame length of"),
        // 2^40 bytes: skipped, it would be waited out for ever.
        ([0x81, 0x7F, 0, 0, 1, 0, 0, 0, 0, 0], "a frame length of 1099511627776 bytes (at most 67108864)"),
    ] as [([UInt8], String)])
    func whatAServerMustNotSendIsAnError(bytes: [UInt8], reason: String) {
        do {
            _ = try decode(bytes)
            Issue.record("\(bytes) was taken")
        } catch {
            #expect("\(error)".hasPrefix(reason), "\(error)")
        }
    }
}

@Suite struct BrowserLookTests {
    @Test func eachFeatureHasItsRendering() {
        let all = BrowserLook(features: Set(BrowserLook.realisable).union([.screenReader]), zoomFactor: 2.5, textScale: 1.5)
        #expect(!all.features.contains(.screenReader))
        #expect(all.styleSheet == "html { filter: invert(1) !important; zoom: 2.5 !important; font-size: 150% !important }")
        #expect(all.visionDeficiency == "achromatopsia")
        #expect(all.mediaFeatures.map { "\($0.name): \($0.value)" } == [
            "prefers-contrast: more", "forced-colors: active", "prefers-reduced-motion: reduce",
        ])
        let none = BrowserLook(features: [.screenReader], zoomFactor: 2, textScale: 1.5)
        #expect(none.styleSheet == nil && none.visionDeficiency == "none" && none.mediaFeatures.isEmpty)
    }

    @Test func factorsArePlainCSSNumbers() {
        #expect(BrowserLook.number(2) == "2")
        #expect(BrowserLook.number(1.25) == "1.25")
        #expect(BrowserLook.number(32) == "32")
        #expect(BrowserLook.number(1.0 / 3.0) == "0.333")
        #expect(BrowserLook.number(150.00000001) == "150")
    }

    @Test func thePageScriptCarriesOnlyTheSheetQuoted() {
        let script = PageScript.applying("html { a: \"b\\\" }\n")
        #expect(script.contains(#"const css = "html { a: \"b\\\" }\u{a}";"#))
        #expect(PageScript.applying(nil).contains("const css = null;"))
    }
}

@Suite struct DevToolsMessageTests {
    func read(_ text: String) throws(DevToolsFailure) -> DevToolsMessage { try DevToolsMessage(Array(text.utf8)) }

    @Test func repliesAndEventsAreRead() throws {
        guard case .reply(7, .success(let result)) = try read(#"{"id":7,"result":{"identifier":"3"}}"#) else {
            Issue.record("not a reply")
            return
        }
        #expect(result["identifier"]?.string == "3")
        guard case .reply(8, .failure(let failure)) = try read(#"{"id":8,"error":{"code":-32000,"message":"No target"}}"#)
        else {
            Issue.record("not an error reply")
            return
        }
        #expect(failure.description == "No target")
        guard case .event(let event) = try read(#"{"method":"Target.detachedFromTarget","params":{"sessionId":"A"},"sessionId":"B"}"#)
        else {
            Issue.record("not an event")
            return
        }
        #expect(event.method == "Target.detachedFromTarget" && event.params["sessionId"]?.string == "A" && event.sessionID == "B")
    }

    @Test(arguments: [
        ("<html>", "not a DevTools message: invalid JSON"),
        ("[1]", "not a DevTools message: not a JSON object"),
        (#"{"id":"1","result":{}}"#, "not a DevTools message: an id that is not an integer"),
        (#"{"id":1.5}"#, "not a DevTools message: an id that is not an integer"),
        (#"{"result":{}}"#, "not a DevTools message: neither an id nor a method"),
        (#"{"method":7}"#, "not a DevTools message: neither an id nor a method"),
    ])
    func anythingElseIsNotDevTools(text: String, reason: String) {
        do {
            _ = try read(text)
            Issue.record("\(text) was taken")
        } catch {
            #expect(error.description.hasPrefix(reason), "\(error)")
        }
    }
}
