// A libFuzzer target for what guidedaccessd does with the bytes of a message
// before any state or the bus is involved: libdbus's parsing and validation,
// the DBus layer's reading of the body, and the service's typed arguments and
// the checks its handlers make first (ServiceCalls); and what the browser
// layer does with a browser's WebSocket stream (DevToolsStream). No bus, no
// service, no browser.
//
// Built with -sanitize=fuzzer,address by scripts/fuzz, which defines
// GUIDEDACCESS_FUZZER: libFuzzer then provides main. In an ordinary build
// (`swift build`) it is a small program on the same code instead:
//
//   guidedaccess-fuzz FILE|DIR...                  run each input once (a reproducer)
//   guidedaccess-fuzz --write-seeds DIR DICTIONARY the seed corpus and libFuzzer's dictionary

import DBus
import Glibc

enum FuzzTarget {
    /// One input, as the bytes of one message from the bus. A crash or a
    /// failed precondition is a finding; everything else returns.
    static func run(_ bytes: [UInt8]) {
        if bytes.first == DevToolsStream.marker {
            DevToolsStream.run(bytes.dropFirst())
            return
        }
        guard let message = try? Message.demarshal(bytes) else { return }
        readAsReceiver(message)
        guard message.kind == .methodCall else { return }
        _ = ServiceCalls.answer(message)
    }

    /// What any receiver does with a message (a call, a reply, a signal to a
    /// subscription): its headers and its whole body.
    static func readAsReceiver(_ message: Message) {
        _ = (message.path, message.interface, message.member, message.errorName, message.destination, message.sender)
        _ = (message.serial, message.replySerial, message.noReplyExpected, message.allowInteractiveAuthorization)
        // libdbus has validated the message, so the body must read
        // (`Marshal.read`): failing here would refuse a message libdbus
        // accepted. A bound the reading is given on purpose belongs here.
        do {
            let values = try message.arguments()
            precondition(
                values.map { $0.type.signature }.joined() == message.signature,
                "read '\(values.map { $0.type.signature }.joined())' from a body of '\(message.signature)'")
        } catch {
            preconditionFailure("a message libdbus accepted does not read: \(error)")
        }
        // The subscriptions the service makes look at the first argument.
        _ = MatchRule.nameOwnerChanged(for: ":1.42").matches(message)
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    FuzzTarget.run(data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? [])
    return 0
}

#if !GUIDEDACCESS_FUZZER
@main
struct GuidedAccessFuzz {
    static func main() throws {
        let arguments = Array(CommandLine.arguments.dropFirst())
        if arguments.first == "--write-seeds", arguments.count == 3 {
            try Seeds.write(to: arguments[1], dictionary: arguments[2])
            return
        }
        guard !arguments.isEmpty, !arguments.contains(where: { $0.hasPrefix("-") }) else {
            print("usage: guidedaccess-fuzz FILE|DIR... | --write-seeds DIR DICTIONARY")
            exit(2)
        }
        var count = 0
        for path in arguments {
            for file in Files.list(path) {
                guard let bytes = Files.read(file) else {
                    print("guidedaccess-fuzz: cannot read \(file)")
                    exit(1)
                }
                FuzzTarget.run(bytes)
                count += 1
            }
        }
        print("\(count) inputs run")
    }
}
#endif
