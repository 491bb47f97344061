import Glibc

/// Chromium's `--remote-debugging-pipe` framing: each DevTools message is
/// its JSON text followed by a NUL byte, no more (the launcher relays the
/// pipe over a Unix socket as it is).
package enum PipeFraming {
    /// A message on the pipe.
    package static func frame(_ text: [UInt8]) -> [UInt8] { text + [0] }

    /// Splits what arrives into messages. A message longer than `limit` is
    /// not kept but skipped up to its NUL (the stream stays in step), as
    /// `WebSocket.Decoder` does: memory held is at most `limit` plus one read.
    package struct Decoder {
        package let limit: Int
        private var message: [UInt8] = []
        private var skipping = false
        private var skipped = 0
        /// Whole messages read and not yet taken, in order.
        private var ready: [WebSocket.Incoming] = []
        private var readyHead = 0

        package init(limit: Int) { self.limit = limit }

        package mutating func feed(_ bytes: UnsafeRawBufferPointer) {
            guard let base = bytes.baseAddress else { return }
            var at = 0
            while at < bytes.count {
                // memchr: a byte-by-byte search costs a flood's every byte.
                let end = memchr(base + at, 0, bytes.count - at).map { base.distance(to: UnsafeRawPointer($0)) }
                let stop = end ?? bytes.count
                let piece = UnsafeRawBufferPointer(rebasing: bytes[at..<stop])
                if skipping {
                    skipped += piece.count
                } else if message.count + piece.count > limit {
                    skipping = true
                    skipped = message.count + piece.count
                    message = []
                } else {
                    message.append(contentsOf: piece)
                }
                guard end != nil else { break }
                ready.append(skipping ? .skipped(skipped) : .text(message))
                message = []
                skipping = false
                skipped = 0
                at = stop + 1
            }
        }

        /// The next whole message, if one has arrived.
        package mutating func next() -> WebSocket.Incoming? {
            guard readyHead < ready.count else { return nil }
            let incoming = ready[readyHead]
            readyHead += 1
            if readyHead == ready.count {
                ready.removeAll(keepingCapacity: ready.capacity <= 64)
                readyHead = 0
            }
            return incoming
        }
    }
}
