/// RFC 6455 as a client needs it, and no more: the opening handshake's key
/// and its check, masked frames out, unmasked frames in. Pure functions
/// over bytes; `DevToolsClient` moves them on the service's loop.
///
/// Why not a WebSocket library: see docs/internals.md, "Why a WebSocket client of our own"
/// (measured with scripts/bench-websocket-footprint). `package`: the fuzz
/// target reads byte streams through it.
package enum WebSocket {
    static let acceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    enum Opcode: UInt8 {
        case continuation = 0x0, text = 0x1, binary = 0x2, close = 0x8, ping = 0x9, pong = 0xA
    }

    /// A new `Sec-WebSocket-Key`: 16 random bytes in base64.
    static func newKey() -> String {
        var generator = SystemRandomNumberGenerator()
        return base64((0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    /// The `Sec-WebSocket-Accept` a server must answer `key` with.
    static func accept(for key: String) -> String {
        base64(sha1(Array((key + acceptGUID).utf8)))
    }

    /// One frame from the client: FIN set, masked with a fresh key.
    static func frame(_ opcode: Opcode, _ payload: [UInt8]) -> [UInt8] {
        var out: [UInt8] = [0x80 | opcode.rawValue]
        out.reserveCapacity(payload.count + 14)
        switch payload.count {
        case ..<126: out.append(0x80 | UInt8(payload.count))
        case ..<65536:
            out.append(0x80 | 126)
            out.append(UInt8(payload.count >> 8))
            out.append(UInt8(payload.count & 0xFF))
        default:
            out.append(0x80 | 127)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((UInt64(payload.count) >> UInt64(shift)) & 0xFF)) }
        }
        var generator = SystemRandomNumberGenerator()
        let mask = generator.next() as UInt32
        let maskBytes = [UInt8(mask >> 24), UInt8((mask >> 16) & 0xFF), UInt8((mask >> 8) & 0xFF), UInt8(mask & 0xFF)]
        out.append(contentsOf: maskBytes)
        for (i, byte) in payload.enumerated() { out.append(byte ^ maskBytes[i & 3]) }
        return out
    }

    package struct ProtocolError: Error, CustomStringConvertible {
        package let description: String
        init(_ description: String) { self.description = description }
    }

    /// What the server sent, message by message.
    package enum Incoming: Equatable {
        case text([UInt8])
        /// A text message longer than the limit, skipped whole (its length).
        case skipped(Int)
        case ping([UInt8])
        case pong
        case close
    }

    /// Reassembles the server's frames into messages. Feed it bytes as they
    /// arrive; it keeps what does not yet make a frame. A message longer
    /// than `limit` is not kept but skipped (the stream stays in step);
    /// anything RFC 6455 forbids a server is a `ProtocolError`.
    package struct Decoder {
        package let limit: Int
        private var buffer: [UInt8] = []
        private var start = 0
        /// The text message being reassembled from continuation frames.
        private var message: [UInt8] = []
        private var inMessage = false
        private var messageLength = 0
        private var skipping = false

        package init(limit: Int) { self.limit = limit }

        /// The longest frame taken at all (64 MiB).
        static let frameLengthLimit: UInt64 = 1 << 26

        /// Bytes kept, not yet a whole frame.
        package var buffered: Int { buffer.count - start }

        package mutating func feed(_ bytes: UnsafeRawBufferPointer) {
            if start > 0, start == buffer.count {
                buffer.removeAll(keepingCapacity: buffer.capacity <= 1 << 16)
                start = 0
            } else if start >= 1 << 16, start >= buffer.count - start {
                // What was handled goes also when reads rarely end where a
                // frame does (a steady stream of events): no more is moved
                // than was dropped.
                buffer.removeSubrange(..<start)
                start = 0
            }
            buffer.append(contentsOf: bytes)
        }

        /// The next complete message, or nil until more bytes come.
        package mutating func next() throws(ProtocolError) -> Incoming? {
            while true {
                let available = buffer.count - start
                guard available >= 2 else { return nil }
                let b0 = buffer[start], b1 = buffer[start + 1]
                guard b0 & 0x70 == 0 else { throw ProtocolError("a frame with reserved bits set (no extension was agreed)") }
                guard b1 & 0x80 == 0 else { throw ProtocolError("a masked frame from the server") }
                var header = 2
                var length = Int(b1 & 0x7F)
                if length == 126 {
                    guard available >= 4 else { return nil }
                    length = Int(buffer[start + 2]) << 8 | Int(buffer[start + 3])
                    header = 4
                } else if length == 127 {
                    guard available >= 10 else { return nil }
                    var value: UInt64 = 0
                    for i in 0..<8 { value = value << 8 | UInt64(buffer[start + 2 + i]) }
                    // Skipped messages are not kept, but one that claims to be
                    // this long would be waited out for ever: not DevTools.
                    guard value <= Self.frameLengthLimit else {
                        throw ProtocolError("a frame length of \(value) bytes (at most \(Self.frameLengthLimit))")
                    }
                    length = Int(value)
                    header = 10
                }
                let fin = b0 & 0x80 != 0
                guard let opcode = Opcode(rawValue: b0 & 0x0F) else {
                    throw ProtocolError("a frame of unknown opcode \(b0 & 0x0F)")
                }
                if opcode.rawValue >= 0x8 {
                    guard fin, length <= 125 else { throw ProtocolError("a fragmented or long control frame") }
                }
                // A data frame that will be skipped need not be buffered whole.
                let skipsPayload = skipping || (!opcodeIsControl(opcode) && messageLength + length > limit)
                if skipsPayload, !opcodeIsControl(opcode) {
                    guard available >= header else { return nil }
                    try beginOrContinue(opcode)
                    skipping = true
                    message = []
                    let here = min(length, available - header)
                    messageLength += here
                    if here < length {
                        // Rewrite the header to what is left of the payload.
                        buffer.replaceSubrange(start..<(start + header + here), with: Self.header(b0, remaining: length - here))
                        return nil
                    }
                    start += header + length
                    if fin {
                        let skipped = messageLength
                        endMessage()
                        return .skipped(skipped)
                    }
                    continue
                }
                guard available >= header + length else { return nil }
                let payload = Array(buffer[(start + header)..<(start + header + length)])
                start += header + length
                switch opcode {
                case .ping: return .ping(payload)
                case .pong: return .pong
                case .close: return .close
                case .binary: throw ProtocolError("a binary message (DevTools sends text)")
                case .text, .continuation:
                    try beginOrContinue(opcode)
                    message.append(contentsOf: payload)
                    messageLength += length
                    if fin {
                        let text = message
                        endMessage()
                        return .text(text)
                    }
                }
            }
        }

        private func opcodeIsControl(_ opcode: Opcode) -> Bool { opcode.rawValue >= 0x8 }

        private mutating func beginOrContinue(_ opcode: Opcode) throws(ProtocolError) {
            if opcode == .continuation {
                guard inMessage else { throw ProtocolError("a continuation frame with no message begun") }
            } else {
                guard !inMessage else { throw ProtocolError("a new message before the last one ended") }
                guard opcode == .text else { throw ProtocolError("a binary message (DevTools sends text)") }
                inMessage = true
            }
        }

        private mutating func endMessage() {
            message = []
            inMessage = false
            messageLength = 0
            skipping = false
        }

        /// A frame header for `remaining` more payload bytes of a frame
        /// being skipped (as a continuation of itself).
        private static func header(_ b0: UInt8, remaining: Int) -> [UInt8] {
            // Keep FIN; the opcode becomes continuation (the message is under way).
            let first = (b0 & 0x80)
            if remaining < 126 { return [first, UInt8(remaining)] }
            if remaining < 65536 { return [first, 126, UInt8(remaining >> 8), UInt8(remaining & 0xFF)] }
            var out: [UInt8] = [first, 127]
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((UInt64(remaining) >> UInt64(shift)) & 0xFF)) }
            return out
        }
    }

    // MARK: Base64 and SHA-1 (the handshake only; no secrecy rests on SHA-1 here)

    static func base64(_ bytes: [UInt8]) -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        var out: [UInt8] = []
        var i = 0
        while i < bytes.count {
            let n = min(3, bytes.count - i)
            let chunk = (UInt32(bytes[i]) << 16) | (n > 1 ? UInt32(bytes[i + 1]) << 8 : 0) | (n > 2 ? UInt32(bytes[i + 2]) : 0)
            for j in 0..<4 {
                out.append(j <= n ? alphabet[Int((chunk >> UInt32(18 - 6 * j)) & 63)] : UInt8(ascii: "="))
            }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func sha1(_ message: [UInt8]) -> [UInt8] {
        var h: [UInt32] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0]
        var data = message
        data.append(0x80)
        while data.count % 64 != 56 { data.append(0) }
        let bits = UInt64(message.count) * 8
        for shift in stride(from: 56, through: 0, by: -8) { data.append(UInt8((bits >> UInt64(shift)) & 0xFF)) }
        var w = [UInt32](repeating: 0, count: 80)
        for block in stride(from: 0, to: data.count, by: 64) {
            for t in 0..<16 {
                w[t] = (0..<4).reduce(0) { $0 << 8 | UInt32(data[block + 4 * t + $1]) }
            }
            for t in 16..<80 {
                let x = w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16]
                w[t] = x << 1 | x >> 31
            }
            var (a, b, c, d, e) = (h[0], h[1], h[2], h[3], h[4])
            for t in 0..<80 {
                let f: UInt32, k: UInt32
                switch t {
                case ..<20: (f, k) = ((b & c) | (~b & d), 0x5A82_7999)
                case ..<40: (f, k) = (b ^ c ^ d, 0x6ED9_EBA1)
                case ..<60: (f, k) = ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC)
                default: (f, k) = (b ^ c ^ d, 0xCA62_C1D6)
                }
                let temp = (a << 5 | a >> 27) &+ f &+ e &+ k &+ w[t]
                (e, d, c, b, a) = (d, c, b << 30 | b >> 2, a, temp)
            }
            h[0] &+= a
            h[1] &+= b
            h[2] &+= c
            h[3] &+= d
            h[4] &+= e
        }
        return h.flatMap { word in (0..<4).map { UInt8((word >> UInt32(24 - 8 * $0)) & 0xFF) } }
    }
}
