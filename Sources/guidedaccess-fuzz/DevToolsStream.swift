import BrowserLayer

/// What the browser layer does with the bytes a browser sends after the
/// WebSocket handshake: frames reassembled into messages, each message read
/// as DevTools JSON. An input starting with "W" (no D-Bus message does) is
/// such a stream; its second byte sets the size of the reads it arrives in.
enum DevToolsStream {
    static let marker = UInt8(ascii: "W")
    /// Small, so that the fuzzer reaches messages that are skipped.
    static let limit = 4096

    static func run(_ input: ArraySlice<UInt8>) {
        guard let chunkByte = input.first else { return }
        let stream = input.dropFirst()
        let chunk = Int(chunkByte % 64) + 1
        var decoder = WebSocket.Decoder(limit: limit)
        var offset = stream.startIndex
        while offset < stream.endIndex {
            let end = min(stream.endIndex, offset + chunk)
            stream[offset..<end].withUnsafeBytes { decoder.feed($0) }
            offset = end
            while true {
                let incoming: WebSocket.Incoming?
                do {
                    incoming = try decoder.next()
                } catch {
                    return  // the client closes the connection
                }
                guard let incoming else { break }
                if case .text(let bytes) = incoming {
                    precondition(bytes.count <= limit, "a message of \(bytes.count) bytes passed the limit of \(limit)")
                    _ = try? DevToolsMessage(bytes)
                }
            }
            // A message being skipped is not kept: at most a frame header
            // and what one read brought.
            precondition(
                decoder.buffered <= limit + 14 + chunk, "\(decoder.buffered) bytes kept with a limit of \(limit)")
        }
    }

    /// Seeds: what Chromium sends, framed as a server frames it.
    static func seeds() -> [(String, [UInt8])] {
        func frame(_ opcode: UInt8, _ text: String, fin: Bool = true) -> [UInt8] {
            let payload = Array(text.utf8)
            var out: [UInt8] = [(fin ? 0x80 : 0) | opcode]
            if payload.count < 126 {
                out.append(UInt8(payload.count))
            } else {
                out += [126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
            }
            return out + payload
        }
        let attached = #"{"method":"Target.attachedToTarget","params":{"sessionId":"9A","targetInfo":{"targetId":"6C","type":"page","title":"Kiosk","url":"file:///kiosk.html","attached":true},"waitingForDebugger":false}}"#
        return [
            ("devtools-reply", [marker, 7] + frame(0x1, #"{"id":1,"result":{}}"#)),
            ("devtools-error", [marker, 63] + frame(0x1, #"{"id":2,"error":{"code":-32000,"message":"No session with given id"}}"#)),
            ("devtools-event", [marker, 1] + frame(0x1, attached) + frame(0x9, "p")),
            ("devtools-fragments", [marker, 3] + frame(0x1, #"{"id":3,"res"#, fin: false) + frame(0x0, #"ult":{"identifier":"1"}}"#)),
            ("devtools-close", [marker, 20] + frame(0x1, #"{"method":"Inspector.detached","params":{"reason":"target_closed"}}"#) + frame(0x8, "")),
        ]
    }

    static let words = [
        "Target.attachedToTarget", "Target.detachedFromTarget", "sessionId", "targetInfo", "type", "page", "id", "result",
        "error", "method", "params", "identifier",
    ]
}
