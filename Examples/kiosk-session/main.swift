// A small kiosk program on GuidedAccessClient: starts a Guided Access
// session with the screen reader and zoom, registers one restriction,
// prints the service's changes as they come, waits, ends the session.
//
//     swift run kiosk-session [--address ADDR] [--seconds N]

import DBus
import GuidedAccessClient

#if canImport(Glibc)
    import Glibc
#endif

/// The kiosk's own restriction: whether payments are allowed.
struct PaymentsProvider: GuidedAccessRestrictionProvider {
    static let payments = "org.example.kiosk.payments"

    var identifiers: [String] { [Self.payments] }
    func text(for identifier: String) -> String { "Payments" }
    func detailText(for identifier: String) -> String? { "Allow purchases at this kiosk" }
    func didChange(identifier: String, state: RestrictionState) {
        print("provider: \(identifier) is now \(state.rawValue)")
    }
}

/// Writes a line to stderr (file descriptor 2).
func printError(_ text: String) {
    var line = text + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}

func usage() -> Never {
    printError("usage: kiosk-session [--address ADDR] [--seconds N]")
    exit(2)
}

var bus = Bus.session
var seconds = 5.0
var arguments = CommandLine.arguments.dropFirst()
while let argument = arguments.popFirst() {
    switch argument {
    case "--address":
        guard let value = arguments.popFirst() else { usage() }
        bus = .address(value)
    case "--seconds":
        guard let value = arguments.popFirst(), let n = Double(value), n >= 0 else { usage() }
        seconds = n
    case "-h", "--help":
        print("usage: kiosk-session [--address ADDR] [--seconds N]")
        exit(0)
    default:
        usage()
    }
}

func describe(_ event: GuidedAccessEvent) -> String {
    switch event {
    case .session(let active, let reason):
        return "session \(active ? "active" : "inactive") (\(reason))"
    case .restriction(let identifier, let state):
        return "restriction \(identifier) \(state.rawValue)"
    }
}

do {
    let guidedAccess = try await GuidedAccessClient.connect(bus: bus)

    // Subscribed before the session starts, so its start is seen.
    let events = try await guidedAccess.changes()
    let printer = Task {
        for await event in events {
            print("event: \(describe(event))")
        }
    }

    try await guidedAccess.requestSession(enabled: [.screenReader, .zoom])
    let provider = try await guidedAccess.register(provider: PaymentsProvider())
    let enabled = try await guidedAccess.enabledFeatures
    print("session started: \(enabled.sortedWireNames.joined(separator: ", "))")

    try await Task.sleep(for: .seconds(seconds))

    try await guidedAccess.endSession()
    // Let the stream deliver the end of the session before closing.
    try await Task.sleep(for: .milliseconds(200))
    provider.cancel()
    printer.cancel()
    await guidedAccess.close()
    print("done")
} catch let error as GuidedAccessError {
    printError("kiosk-session: \(error.message)")
    exit(1)
} catch {
    printError("kiosk-session: \(error)")
    exit(1)
}
