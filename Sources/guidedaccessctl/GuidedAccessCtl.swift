import ArgumentParser
import DBus
// FoundationEssentials (JSONEncoder, Date and its ISO 8601 style), not
// Foundation: the whole of Foundation and ICU's data, linked statically, made
// the release binary 75 MB.
import FoundationEssentials
import GuidedAccessClient
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// Exit codes, one per kind of error.
enum Exit: Int32 {
    case ok = 0
    case generic = 1
    case usage = 2
    case notAuthorized = 3
    case notInSession = 4
    case sessionBusy = 5
    case feature = 6
    case restriction = 7
    case limitExceeded = 8
    case backendFailed = 9
    case serviceUnavailable = 10

    init(_ error: GuidedAccessError) {
        switch error {
        case .notAuthorized, .interactiveAuthorizationRequired: self = .notAuthorized
        case .notInSession: self = .notInSession
        case .sessionBusy: self = .sessionBusy
        case .unknownFeature, .unsupportedFeature: self = .feature
        case .unknownRestriction: self = .restriction
        case .limitExceeded: self = .limitExceeded
        case .backendFailed: self = .backendFailed
        case .invalidArgs: self = .usage
        case .serviceUnavailable: self = .serviceUnavailable
        case .other: self = .generic
        }
    }
}

let exitCodeHelp = """
    Exit codes:
      0   success
      1   any other error
      2   usage error, or arguments the service rejected (InvalidArgs)
      3   not authorized (NotAuthorized, InteractiveAuthorizationRequired)
      4   no session is active (NotInSession)
      5   a session is already active (SessionBusy)
      6   unknown or unsupported feature (UnknownFeature, UnsupportedFeature)
          doctor: a required feature is not supported
      7   unknown restriction (UnknownRestriction)
      8   too many restrictions (LimitExceeded)
      9   the settings backend failed (BackendFailed)
      10  no bus, or no service on it (ServiceUnavailable)
          doctor: no service answered
    """

struct GlobalOptions: ParsableArguments {
    @Flag(name: .long, help: "Talk to the service on the system bus (system mode).")
    var system = false

    @Flag(name: .long, help: "Talk to the service on the session bus (user mode; the default).")
    var user = false

    @Option(name: .long, help: ArgumentHelp("Connect to this bus address instead.", valueName: "ADDR"))
    var address: String?

    @Flag(
        name: .customLong("no-ask-password"),
        help: "Never ask for a password: no interactive polkit authorization, no pkttyagent.")
    var noAskPassword = false

    func validate() throws {
        if [system, user, address != nil].filter({ $0 }).count > 1 {
            throw ValidationError("--system, --user and --address exclude each other")
        }
    }

    var bus: Bus {
        if let address { return .address(address) }
        return system ? .system : .session
    }
}

/// An error already reported on stderr; exits with its code.
struct Failure: Error {
    let code: Exit
}

func fail(_ message: String, _ code: Exit) -> Failure {
    printToStderr("guidedaccessctl: \(message)")
    return Failure(code: code)
}

/// One line on stderr, unbuffered.
func printToStderr(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    var offset = 0
    while offset < bytes.count {
        let written = bytes.withUnsafeBytes { write(2, $0.baseAddress! + offset, $0.count - offset) }
        if written < 0 && errno == EINTR { continue }
        guard written > 0 else { return }
        offset += written
    }
}

extension String {
    /// Followed by spaces up to `width` characters (never cut).
    func padded(to width: Int) -> String {
        self + String(repeating: " ", count: max(0, width - count))
    }
}

/// Connects, runs `body`, and turns a GuidedAccessError into its message and
/// exit code. When stdin is a terminal (and not --no-ask-password), calls
/// allow interactive authorization; for a call that may need authorization
/// (`mayAuthorize`) on the system bus, pkttyagent runs meanwhile to ask for
/// the password on the terminal.
func withClient<T>(
    _ options: GlobalOptions, mayAuthorize: Bool = false,
    _ body: (GuidedAccessClient) async throws(GuidedAccessError) -> T
) async throws -> T {
    let interactive = !options.noAskPassword && isatty(STDIN_FILENO) != 0
    let agent = interactive && mayAuthorize && PolkitAgent.isUseful(for: options.bus) ? PolkitAgent.open() : nil
    defer { agent?.close() }
    do {
        let client = try await GuidedAccessClient.connect(bus: options.bus, allowInteractiveAuthorization: interactive)
        return try await body(client)
    } catch {
        throw fail(error.message, Exit(error))
    }
}

func printLine(_ text: String) {
    print(text)
    fflush(nil)
}

@main
struct GuidedAccessCtl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "guidedaccessctl",
        abstract: "Control GuidedAccess sessions, features and restrictions.",
        discussion: exitCodeHelp,
        subcommands: [
            Status.self, Start.self, End.self, Enable.self, Disable.self, Restrictions.self, Restrict.self,
            Monitor.self, Doctor.self, BrowserLauncher.self,
        ])

    @OptionGroup var global: GlobalOptions

    /// Usage errors exit with 2 (ArgumentParser's default is 64).
    static func main() async {
        // The bus layer's notices (a connection closed) are not the tool's
        // output; its warnings and errors are.
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .warning
            return handler
        }
        do {
            var command = try parseAsRoot()
            if var command = command as? AsyncParsableCommand {
                try await command.run()
            } else {
                try command.run()
            }
        } catch let failure as Failure {
            Glibc.exit(failure.code.rawValue)
        } catch {
            let code = exitCode(for: error)
            if code == .validationFailure {
                printToStderr(fullMessage(for: error))
                Glibc.exit(Exit.usage.rawValue)
            }
            self.exit(withError: error)
        }
    }
}

// MARK: - status

struct StatusJSON: Encodable {
    var sessionActive: Bool
    var sessionOwner: String
    var sessionOwnerOrigin: String
    var sessionDeadline: UInt64
    var enabledFeatures: [String]
    var supportedFeatures: [String]
    var backend: String
    var desktop: String
    var agent: String
    var version: String
}

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the session and the service's state.")

    @OptionGroup var global: GlobalOptions

    @Flag(help: "Print the properties as one JSON object (sessionDeadline: microseconds since the epoch, 0 = none).")
    var json = false

    func run() async throws {
        let status = try await withClient(global) { client throws(GuidedAccessError) in try await client.status() }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            let data = try encoder.encode(
                StatusJSON(
                    sessionActive: status.sessionActive, sessionOwner: status.sessionOwner,
                    sessionOwnerOrigin: status.sessionOwnerOrigin, sessionDeadline: status.sessionDeadline, enabledFeatures: status.enabledFeatures,
                    supportedFeatures: status.supportedFeatures, backend: status.backend, desktop: status.desktop,
                    agent: status.agent, version: status.version))
            printLine(String(decoding: data, as: UTF8.self))
            return
        }
        var session = status.sessionActive ? "active" : "inactive"
        if status.sessionActive {
            session +=
                status.sessionOwner.isEmpty
                ? " (owner gone)"
                : status.sessionOwnerOrigin.isEmpty
                    ? " (owner \(status.sessionOwner))"
                    : " (owner: the page \(status.sessionOwnerOrigin) in the browser of \(status.sessionOwner))"
        }
        var deadline = "none"
        if status.sessionDeadline > 0 {
            let date = Date(timeIntervalSince1970: Double(status.sessionDeadline) / 1_000_000)
            let left = Int(max(0, date.timeIntervalSinceNow).rounded())
            deadline = "\(date.formatted(.iso8601)) (\(left / 3600)h \(left / 60 % 60)m \(left % 60)s left)"
        }
        let rows = [
            ("Session", session),
            ("Time limit", deadline),
            ("Enabled", status.enabledFeatures.isEmpty ? "-" : status.enabledFeatures.joined(separator: ", ")),
            ("Supported", status.supportedFeatures.isEmpty ? "-" : status.supportedFeatures.joined(separator: ", ")),
            ("Backend", status.backend),
            ("Desktop", status.desktop.isEmpty ? "-" : status.desktop),
        ]
            // The session agent is the system service's (user mode: the service is its own).
            + (global.system || !status.agent.isEmpty
                ? [("Agent", status.agent.isEmpty ? "none registered (guidedaccess-agent.service of the kiosk user)" : status.agent)]
                : [])
            + [("Version", status.version)]
        for (key, value) in rows {
            printLine((key + ":").padded(to: 12) + value)
        }
    }
}

// MARK: - sessions

/// `90s`, `10m`, `1h`, `2d` or plain seconds.
func parseDuration(_ text: String) -> Duration? {
    let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3600, "d": 86400]
    var digits = Substring(text)
    var unit: Int64 = 1
    if let last = text.last, let u = units[last] {
        unit = u
        digits = digits.dropLast()
    }
    guard !digits.isEmpty, digits.allSatisfy(\.isASCII), let n = Int64(digits), n >= 0 else { return nil }
    let (product, overflow) = n.multipliedReportingOverflow(by: unit)
    return overflow ? nil : .seconds(product)
}

struct Start: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Start a session owned by this user and program.")

    @OptionGroup var global: GlobalOptions

    @Option(help: ArgumentHelp("End the session by itself after this long: 90s, 10m, 1h, 2d; 0 = none.", valueName: "TIME"))
    var timeLimit: String?

    @Option(name: .customLong("feature"), help: ArgumentHelp("A feature to turn on as part of starting (repeatable).", valueName: "F"))
    var features: [String] = []

    @Option(help: "Magnification while zoom is on (1.0 to 32.0).")
    var zoomFactor: Double?

    @Option(help: "Text scaling while large-text is on (1.0 to 3.0).")
    var textScale: Double?

    @Option(help: ArgumentHelp("Hold a sleep inhibitor while the session lasts.", valueName: "true|false"))
    var inhibitSleep: Bool?

    func run() async throws {
        var options = SessionOptions(zoomFactor: zoomFactor, textScale: textScale, inhibitSleep: inhibitSleep)
        if let timeLimit {
            guard let limit = parseDuration(timeLimit) else {
                throw fail("invalid time limit '\(timeLimit)': use e.g. 90s, 10m, 1h", .usage)
            }
            options.timeLimit = limit
        }
        let names = features
        try await withClient(global, mayAuthorize: true) { client throws(GuidedAccessError) in
            try await client.requestSession(featureNames: names, options: options)
        }
    }
}

struct End: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "End the session; every setting it changed is restored.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        try await withClient(global, mayAuthorize: true) { client throws(GuidedAccessError) in
            try await client.endSession()
        }
    }
}

/// The features named on the command line, turned on or off in the session.
struct FeatureList: ParsableArguments {
    @ArgumentParser.Argument(help: ArgumentHelp("Features to turn on or off.", valueName: "F"))
    var features: [String]

    func validate() throws {
        if features.isEmpty { throw ValidationError("name at least one feature") }
    }

    func configure(enabled: Bool, _ global: GlobalOptions) async throws {
        let names = features
        try await withClient(global, mayAuthorize: true) { client throws(GuidedAccessError) in
            try await client.configure(featureNames: names, enabled: enabled)
        }
    }
}

private let featureNames = "Features: " + Feature.allCases.map(\.wireName).joined(separator: ", ")

struct Enable: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Turn features on in the session.", discussion: featureNames)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var list: FeatureList

    func run() async throws { try await list.configure(enabled: true, global) }
}

struct Disable: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Turn features off in the session.", discussion: featureNames)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var list: FeatureList

    func run() async throws { try await list.configure(enabled: false, global) }
}

// MARK: - restrictions

struct Restrictions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List the registered restrictions and their states.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let list = try await withClient(global) { client throws(GuidedAccessError) in try await client.restrictions() }
        let width = list.map(\.identifier.count).max() ?? 0
        for r in list {
            var line = r.state.rawValue.padded(to: 6)
                + r.identifier.padded(to: width + 2) + r.text
            if !r.detail.isEmpty { line += " — " + r.detail }
            printLine(line)
        }
    }
}

struct Restrict: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Set a restriction's state (operators only, inside a session).")

    @OptionGroup var global: GlobalOptions

    @ArgumentParser.Argument(help: "The restriction's identifier.")
    var identifier: String

    @ArgumentParser.Argument(help: ArgumentHelp("allow or deny.", valueName: "allow|deny"))
    var state: String

    func validate() throws {
        if RestrictionState(rawValue: state) == nil {
            throw ValidationError("state must be 'allow' or 'deny', not '\(state)'")
        }
    }

    func run() async throws {
        let state = RestrictionState(rawValue: state)!
        let identifier = identifier
        try await withClient(global, mayAuthorize: true) { client throws(GuidedAccessError) in
            try await client.setRestrictionState(state, for: identifier)
        }
    }
}

// MARK: - monitor

struct Monitor: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the service's signals as they happen, until Ctrl-C or SIGTERM.",
        discussion: """
            One line per signal on stdout:
              SessionChanged active=true reason=started
              RestrictionChanged identifier=com.example.kiosk.printing state=deny
            "Monitoring …" goes to stderr once the subscription is in place.
            """)

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        // Ctrl-C and SIGTERM end monitoring normally.
        signal(SIGINT) { _ in _exit(0) }
        signal(SIGTERM) { _ in _exit(0) }
        let bus = global.bus
        let (client, events) = try await withClient(global) { client throws(GuidedAccessError) in
            (client, try await client.changes())
        }
        printToStderr("Monitoring \(GuidedAccessBus.name) on the \(bus)")
        // The stream does not end when the bus goes away: watch for that.
        Task {
            await client.connection.waitUntilDisconnected()
            _ = fail("disconnected from the \(bus)", .serviceUnavailable)
            Glibc.exit(Exit.serviceUnavailable.rawValue)
        }
        for await event in events {
            switch event {
            case .session(let active, let reason):
                printLine("SessionChanged active=\(active) reason=\(reason)")
            case .restriction(let identifier, let state):
                printLine("RestrictionChanged identifier=\(identifier) state=\(state.rawValue)")
            }
        }
        _ = client
        throw fail("disconnected from the \(bus)", .serviceUnavailable)
    }
}
