import DBus
import Glibc
import GuidedAccessCore
import Logging

/// The programs the service runs in the kiosk's session for features the
/// desktop does not deliver from their keys (user mode): Orca where nothing
/// starts a screen reader from `screen-reader-enabled`, wvkbd for the
/// on-screen keyboard on sway, labwc and wayfire (`Desktop.realisation`).
///
/// Each runs as a `SessionProgram`: started when its feature goes on, once
/// the settings are written (the driver comes after the settings driver),
/// supervised during the session, stopped when the feature goes off or the
/// session ends. The journal keeps each run (`record`), so that a restarted
/// service adopts it for the resumed session, or stops it when the session
/// is over; units it started and never journaled are stopped at start.
public final class SessionProgramsDriver: FeatureDriver, @unchecked Sendable {
    public let name = "session-programs"
    private let desktop: SessionDesktopDriver
    private let owner: ProgramOwner
    private let programs: [Feature: SessionProgram]
    private let logger: Logger
    /// The runs of the session's programs, by feature.
    private var runs: [Feature: ProgramRecord] = [:]
    /// The displays the runs were started in: moved (a compositor
    /// restarted), they start again in the new ones.
    private var startedIn: SessionDisplay?
    package private(set) var capabilities: [Feature: FeatureCapability] = [:]
    package var desktopPart: DesktopPart? { nil }
    private var events: (@Sendable (DriverEvent) -> Void)?

    /// `bus`: the session bus, where the user's systemd manager runs the
    /// programs as units when it is there. `owner`: the user-mode service
    /// or the session agent, whose units are named apart.
    public init(
        desktop: SessionDesktopDriver, owner: ProgramOwner = .service, loop: EventLoop, bus: Connection, logger: Logger
    ) {
        self.desktop = desktop
        self.owner = owner
        self.logger = logger
        var programs: [Feature: SessionProgram] = [:]
        for feature in Feature.allCases {
            guard let kind = ProgramKind(feature) else { continue }
            programs[feature] = SessionProgram(kind, owner: owner, loop: loop, bus: bus, logger: logger)
        }
        self.programs = programs
    }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {
        self.events = events
        for (feature, program) in programs {
            program.onEvent { [self] event in
                // On the loop, like everything of the driver's.
                self.programEvent(feature, event)
            }
        }
        desktop.follow { [self] in updateCapabilities() }
        updateCapabilities()
    }

    /// The features a program delivers on the desktop now, and why not where it cannot.
    private func updateCapabilities() {
        let installation = SessionProbe(environment: desktop.environment).installation
        let display = desktop.display
        var capabilities: [Feature: FeatureCapability] = [:]
        for feature in desktop.desktop.realisation(desktop.facts).byProgram {
            guard let kind = ProgramKind(feature) else { continue }
            if let why = kind.unavailableReason(
                installed: installation, x11Display: display.x11Display, waylandDisplay: display.waylandDisplay)
            {
                capabilities[feature] = .unavailable(why)
            } else {
                capabilities[feature] = .delivers(.wholeScreen)
            }
        }
        self.capabilities = capabilities
    }

    /// The features whose programs run for `target` now.
    private func wanted(_ target: DriverTarget) -> Set<Feature> {
        target.features.filter { capabilities[$0] == .delivers(.wholeScreen) }
    }

    // MARK: The transaction

    package nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool {
        let wanted = wanted(target)
        let moved = startedIn.map { !$0.isSameDisplays(as: desktop.display) } ?? false
        for feature in runs.keys.sorted() where !wanted.contains(feature) || moved {
            programs[feature]?.stop()
            runs[feature] = nil
        }
        var started = false
        // The displays the programs are given, as one snapshot: one that
        // changes while they start (await) is seen as moved at the next
        // apply (the desktop's change reapplies), which restarts them with
        // the new displays.
        let display = desktop.display
        let environment = desktop.programEnvironment
        for feature in wanted.sorted() where runs[feature] == nil {
            guard let program = programs[feature] else { continue }
            do throws(ProgramError) {
                runs[feature] = try await program.start(try executable(program.kind), environment: environment)
                started = true
                startedIn = display
            } catch {
                throw DriverFailure(.failed, "\(feature): \(error.message); nothing was changed")
            }
        }
        if runs.isEmpty { startedIn = nil }
        return started
    }

    private func executable(_ kind: ProgramKind) throws(ProgramError) -> String {
        guard let path = SessionProbe(environment: desktop.environment).executable(kind.executable) else {
            throw ProgramError("\(kind.executable) is not installed")
        }
        return path
    }

    private func programEvent(_ feature: Feature, _ event: SessionProgram.Event) {
        guard runs[feature] != nil else { return }
        switch event {
        case .restarted(let record):
            runs[feature] = record
            events?(.recordChanged)
        case .gaveUp(let exits, let lastExit):
            runs[feature] = nil
            events?(.recordChanged)
            events?(
                .featureLost(
                    feature,
                    message: "\(feature): its program exited \(exits) times within a minute (last: \(lastExit)); it is not started again",
                    fields: ["FEATURE": feature.wireName, "EXITS": String(exits), "LAST_EXIT": lastExit]))
        }
    }

    // MARK: The journal

    package var record: JSON? {
        guard !runs.isEmpty else { return nil }
        return .object([("programs", .array(runs.sorted { $0.key < $1.key }.map { feature, record in
            .object([("feature", .string(feature.wireName))] + record.journalFields)
        }))])
    }

    package func validate(_ record: JSON) throws(DriverRecordError) {
        _ = try Self.runs(of: record, owner: owner)
    }

    /// The runs a record names, checked: a unit only of the names the
    /// service gives its units, a pid that can be a process.
    static func runs(of record: JSON, owner: ProgramOwner) throws(DriverRecordError) -> [Feature: ProgramRecord] {
        guard case .array(let items)? = record["programs"] else { throw DriverRecordError("'programs' is not an array") }
        var runs: [Feature: ProgramRecord] = [:]
        for item in items {
            guard case .string(let name)? = item["feature"] else { throw DriverRecordError("a program without a feature") }
            guard let feature = Feature(rawValue: name), let kind = ProgramKind(feature) else {
                throw DriverRecordError("'\(name)' is not a feature the service runs a program for")
            }
            guard runs[feature] == nil else { throw DriverRecordError("two programs for '\(name)'") }
            runs[feature] = try ProgramRecord(journal: item, kind: kind, owner: owner)
        }
        return runs
    }

    // MARK: Recovery

    /// Units the journal does not name are stopped (a service killed between
    /// starting one and journaling it left them). For a session that goes
    /// on, the journal's runs of its features are adopted, or started anew;
    /// the rest stop.
    package nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote] {
        let recorded = (try? record.map { record throws(DriverRecordError) in try Self.runs(of: record, owner: owner) }) ?? [:]
        for (feature, program) in programs.sorted(by: { $0.key < $1.key }) {
            await program.stopUnknownUnits(keeping: recorded[feature])
        }
        // Taken after the calls above: the display may have appeared
        // meanwhile (an agent started with the compositor at login).
        let display = desktop.display
        let environment = desktop.programEnvironment
        var notes: [DriverNote] = []
        let wanted = target.map { endsNow ? [] : self.wanted($0) } ?? []
        for (feature, program) in programs.sorted(by: { $0.key < $1.key }) {
            if wanted.contains(feature) {
                do throws(ProgramError) {
                    runs[feature] = try await program.resume(
                        recorded[feature], try executable(program.kind), environment: environment)
                    startedIn = display
                } catch {
                    notes.append(DriverNote(.error, "\(feature): cannot start it for the resumed session: \(error)"))
                }
            } else if let leftOver = recorded[feature] {
                await program.stopLeftOver(leftOver, environment: environment)
            }
        }
        return notes
    }
}

extension SessionDisplay {
    /// The same displays, served by the same compositor.
    func isSameDisplays(as other: SessionDisplay) -> Bool {
        x11Display == other.x11Display && waylandDisplay == other.waylandDisplay && compositorPID == other.compositorPID
    }
}

extension ProgramRecord {
    /// How a driver's journal record keeps a run: a unit by name, a process
    /// by pid, start time, boot id and token.
    var journalFields: [(String, JSON)] {
        switch self {
        case .process(let pid, let startTime, let bootID, let token):
            return [
                ("bootID", .string(bootID)), ("pid", .number(String(pid))), ("startTime", .number(String(startTime))),
                ("token", .string(token)),
            ]
        case .unit(let name):
            return [("unit", .string(name))]
        }
    }

    /// The run `journalFields` kept in `item`, checked: a unit only of the
    /// names the service gives `kind`'s units, a pid that can be a process.
    init(journal item: JSON, kind: ProgramKind, owner: ProgramOwner) throws(DriverRecordError) {
        if let unit = item["unit"] {
            guard case .string(let unit) = unit, kind.isUnitName(unit, owner: owner) else {
                throw DriverRecordError("'\(unit)' is not a unit the service runs for '\(kind.name)'")
            }
            self = .unit(unit)
        } else {
            guard case .number(let pidText)? = item["pid"], let pid = Int32(pidText), pid > 0,
                case .number(let startText)? = item["startTime"], let startTime = UInt64(startText),
                case .string(let bootID)? = item["bootID"]
            else { throw DriverRecordError("the process of '\(kind.name)' is not a pid, a start time and a boot id") }
            // A journal of a version before the token: "" never matches,
            // so that process is neither adopted nor stopped.
            var token = ""
            if case .string(let text)? = item["token"] { token = text }
            self = .process(pid: pid, startTime: startTime, bootID: bootID, token: token)
        }
    }
}
