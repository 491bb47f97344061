import Glibc
import Testing

@testable import BrowserLayer

@Suite struct PeerOwnerTests {
    @Test func addressesAreWrittenAsTheKernelsTablesWriteThem() {
        #expect(LoopbackStream.tableHex([127, 0, 0, 1]) == "0100007F")
        #expect(LoopbackStream.tableHex([127, 1, 2, 3]) == "0302017F")
        #expect(LoopbackStream.tableHex(Array(repeating: 0, count: 15) + [1]) == "00000000000000000000000001000000")
        #expect(LoopbackStream.hex(UInt16(9222), width: 4) == "2406")
    }

    /// The owner is the uid of the socket whose local address is the
    /// endpoint and whose remote address is ours: not the listener's line,
    /// not our own socket's line.
    @Test func theOwnerIsTheFarEndsUid() throws {
        let table = """
              sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
               0: 0100007F:2406 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0
               1: 0100007F:D431 0100007F:2406 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
               2: 0100007F:2406 0100007F:D431 01 00000000:00000000 00:00000000 00000000 65534        0 3 1 0 20 4 30 10 -1

            """
        var template = Array("/tmp/ga-tcp-XXXXXX".utf8CString)
        let fd = mkstemp(&template)
        try #require(fd >= 0)
        let path = String(cString: template)
        defer { unlink(path) }
        _ = Array(table.utf8).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        #expect(LoopbackStream.owner(in: path, local: "0100007F:2406", remote: "0100007F:D431") == 65534)
        #expect(LoopbackStream.owner(in: path, local: "0100007F:2406", remote: "0100007F:D432") == nil)
        #expect(LoopbackStream.owner(in: "/nonexistent/tcp", local: "0100007F:2406", remote: "0100007F:D431") == nil)
    }
}
