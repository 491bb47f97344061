// "Own framing": a minimal RFC 6455 client on a plain, blocking Glibc socket,
// no library: the HTTP upgrade (Sec-WebSocket-Accept checked: SHA-1 and
// base64 below), one masked text frame out, frames in (fragments, ping, close),
// then idle in read(2), as guidedaccessd would idle in epoll_wait.
import Glibc

func fail(_ message: String) -> Never {
    let text = "ws-baseline: \(message)\n"
    _ = write(2, text, text.utf8.count)
    exit(1)
}

// ws://HOST:PORT/PATH, HOST a dotted IPv4 address (Chromium prints 127.0.0.1).
let arguments = CommandLine.arguments
guard arguments.count == 2, arguments[1].hasPrefix("ws://") else { fail("usage: ws-baseline ws://127.0.0.1:PORT/PATH") }
let rest = arguments[1].dropFirst(5)
let slash = rest.firstIndex(of: "/") ?? rest.endIndex
let authority = rest[..<slash]
let path = slash < rest.endIndex ? String(rest[slash...]) : "/"
guard let colon = authority.lastIndex(of: ":"), let port = UInt16(authority[authority.index(after: colon)...]) else {
    fail("no port in \(arguments[1])")
}
let host = String(authority[..<colon])

let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
var address = sockaddr_in()
address.sin_family = sa_family_t(AF_INET)
address.sin_port = port.bigEndian
guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else { fail("not an IPv4 address: \(host)") }
let connected = withUnsafePointer(to: &address) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
}
guard fd >= 0, connected == 0 else { fail("connect: errno \(errno)") }

func sendAll(_ bytes: [UInt8]) {
    var sent = 0
    while sent < bytes.count {
        let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL)) }
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { fail("send: errno \(errno)") }
        sent += n
    }
}

var inbox: [UInt8] = []
func receive() {
    var chunk = [UInt8](repeating: 0, count: 4096)
    let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, 4096) }
    if n < 0 && errno == EINTR { return }
    guard n > 0 else { fail(n == 0 ? "connection closed" : "read: errno \(errno)") }
    inbox += chunk[..<n]
}

func sha1(_ message: [UInt8]) -> [UInt8] {
    var h: [UInt32] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0]
    var data = message + [0x80]
    while data.count % 64 != 56 { data.append(0) }
    for i in (0..<8).reversed() { data.append(UInt8(truncatingIfNeeded: UInt64(message.count * 8) >> (8 * i))) }
    var w = [UInt32](repeating: 0, count: 80)
    for chunk in stride(from: 0, to: data.count, by: 64) {
        for i in 0..<16 { w[i] = (0..<4).reduce(0) { $0 << 8 | UInt32(data[chunk + 4 * i + $1]) } }
        for i in 16..<80 { let x = w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]; w[i] = x << 1 | x >> 31 }
        var (a, b, c, d, e) = (h[0], h[1], h[2], h[3], h[4])
        for i in 0..<80 {
            let (f, k): (UInt32, UInt32) =
                i < 20 ? ((b & c) | (~b & d), 0x5A82_7999) : i < 40 ? (b ^ c ^ d, 0x6ED9_EBA1)
                : i < 60 ? ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC) : (b ^ c ^ d, 0xCA62_C1D6)
            (e, d, c, b, a) = (d, c, b << 30 | b >> 2, a, (a << 5 | a >> 27) &+ f &+ e &+ k &+ w[i])
        }
        for (i, v) in [a, b, c, d, e].enumerated() { h[i] &+= v }
    }
    return h.flatMap { v in (0..<4).map { UInt8(truncatingIfNeeded: v >> (24 - 8 * $0)) } }
}

func base64(_ bytes: [UInt8]) -> String {
    let table = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    var out: [UInt8] = []
    for i in stride(from: 0, to: bytes.count, by: 3) {
        let n = min(3, bytes.count - i)
        let v = (0..<3).reduce(UInt32(0)) { $0 << 8 | ($1 < n ? UInt32(bytes[i + $1]) : 0) }
        for j in 0..<4 { out.append(j <= n ? table[Int(v >> (18 - 6 * j) & 63)] : UInt8(ascii: "=")) }
    }
    return String(decoding: out, as: UTF8.self)
}

// The upgrade.
let key = base64((0..<16).map { _ in UInt8.random(in: 0...255) })
sendAll(Array("GET \(path) HTTP/1.1\r\nHost: \(authority)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n".utf8))
var headEnd: Int? = nil
while headEnd == nil {
    receive()
    headEnd = inbox.count < 4 ? nil : (3..<inbox.count).first { inbox[$0 - 3...$0].elementsEqual("\r\n\r\n".utf8) }
}
let head = String(decoding: inbox[...headEnd!], as: UTF8.self)
inbox.removeFirst(headEnd! + 1)
let accept = base64(sha1(Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8)))
let lines = head.split(separator: "\r\n")  // "\r\n" is one Character
let accepted = lines.contains { line in
    guard let c = line.firstIndex(of: ":") else { return false }
    return line[..<c].lowercased() == "sec-websocket-accept" && line[line.index(after: c)...].drop { $0 == " " } == accept[...]
}
guard lines.first?.hasPrefix("HTTP/1.1 101") == true, accepted else { fail("upgrade refused: \(head)") }

// Frames: client frames masked; server frames never.
func sendFrame(_ opcode: UInt8, _ payload: [UInt8]) {
    var frame: [UInt8] = [0x80 | opcode]
    switch payload.count {
    case ..<126: frame.append(0x80 | UInt8(payload.count))
    case ..<65536: frame += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
    default: frame.append(0x80 | 127); frame += (0..<8).reversed().map { UInt8(truncatingIfNeeded: payload.count >> (8 * $0)) }
    }
    let mask = (0..<4).map { _ in UInt8.random(in: 0...255) }
    frame += mask
    frame += payload.enumerated().map { $0.element ^ mask[$0.offset & 3] }
    sendAll(frame)
}

func nextFrame() -> (fin: Bool, opcode: UInt8, payload: [UInt8])? {
    guard inbox.count >= 2 else { return nil }
    guard inbox[1] & 0x80 == 0 else { fail("masked frame from the server") }
    var length = Int(inbox[1] & 0x7F), offset = 2
    if length >= 126 {
        offset = length == 126 ? 4 : 10
        guard inbox.count >= offset else { return nil }
        length = inbox[2..<offset].reduce(0) { $0 << 8 | Int($1) }
    }
    guard inbox.count >= offset + length else { return nil }
    let frame = (inbox[0] & 0x80 != 0, inbox[0] & 0x0F, Array(inbox[offset..<offset + length]))
    inbox.removeFirst(offset + length)
    return frame
}

// One whole text or binary message; answers pings, ends on close.
func readMessage() -> [UInt8] {
    var message: [UInt8] = []
    while true {
        while let frame = nextFrame() {
            switch frame.opcode {
            case 0x9: sendFrame(0xA, frame.payload)
            case 0xA: break
            case 0x8: sendFrame(0x8, Array(frame.payload.prefix(2))); fail("closed by the server")
            default:
                message += frame.payload
                if frame.fin { return message }
            }
        }
        receive()
    }
}

sendFrame(0x1, Array(#"{"id":1,"method":"Target.getTargets"}"#.utf8))
let reply = String(decoding: readMessage(), as: UTF8.self)
guard reply.hasPrefix(#"{"id":1,"result":"#) else { fail("unexpected reply: \(reply)") }
let ready = "reply: \(reply.utf8.count) bytes\nready pid=\(getpid())\n"
_ = write(1, ready, ready.utf8.count)
while true { _ = readMessage() }
