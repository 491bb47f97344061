import CDBus
import Testing

@testable import DBus

/// libdbus validates every message it receives, and then our parser reads
/// the body's signature: a message libdbus accepts must read.
@Suite struct SignaturesAsLibdbusChecksThem {
    /// libdbus limits runs of array codes, open parentheses and dict
    /// entries to 32 each, counted apart (found by the fuzzer's check that
    /// what libdbus accepts reads).
    @Test func signaturesAreLimitedAsLibdbusLimitsThem() {
        let arraysBetweenStructs = String(repeating: "a(", count: 31) + "aay" + String(repeating: ")", count: 31)
        let dictsAndStructs = String(repeating: "a{s", count: 17) + String(repeating: "(", count: 16) + "y"
            + String(repeating: ")", count: 16) + String(repeating: "}", count: 17)
        let signatures = [
            arraysBetweenStructs, dictsAndStructs,
            String(repeating: "a", count: 32) + "y", String(repeating: "a", count: 33) + "y",
            String(repeating: "(", count: 32) + "y" + String(repeating: ")", count: 32),
            String(repeating: "(", count: 33) + "y" + String(repeating: ")", count: 33),
            String(repeating: "a{s", count: 32) + "y" + String(repeating: "}", count: 32),
            String(repeating: "a{s", count: 33) + "y" + String(repeating: "}", count: 33),
            String(repeating: "a(", count: 33) + "y" + String(repeating: ")", count: 33),
        ]
        for signature in signatures {
            let ours = (try? DBusType.parse(signature: signature)) != nil
            let libdbus = dbus_signature_validate(signature, nil) != 0
            #expect(ours == libdbus, "'\(signature)': ours \(ours), libdbus \(libdbus)")
        }
    }

    @Test func aBodyLibdbusAcceptsReads() throws {
        var type = DBusType.array(.array(.byte))
        for _ in 0..<31 { type = .array(.structure([type])) }
        #expect(try roundTrip([.array(.structure([type]), [])]) == [.array(.structure([type]), [])])
    }
}
