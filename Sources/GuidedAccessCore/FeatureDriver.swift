/// One way a feature reaches the person at the kiosk: the settings keys, the
/// desktop acting on them, a program run in the kiosk's session, the kiosk
/// browser's pages. The service holds a list of drivers, built by
/// `guidedaccessd`, and knows none of them by name; the session transaction
/// (`SessionStore`) runs across them in the list's order, journaled, all or
/// nothing.
///
/// A driver says what it can deliver now and why not (`capabilities`),
/// makes a feature set real (`prepare`, then `apply`), keeps in the journal
/// what a restarted service needs (`record`), resumes or undoes from that
/// after a crash (`recover`), and releases everything when the session ends
/// (`apply` of `DriverTarget.none`).
///
/// Used on the service's executor only, like the store: a driver needs no
/// lock of its own, and it must not block. What it waits for in another
/// process it waits for asynchronously, with a bound, so that one stalled
/// peer cannot hold up the service's other callers for long.
package protocol FeatureDriver: AnyObject {
    /// Its name in logs, and the key of its record in the journal: fixed,
    /// lower case (`settings`, `session-programs`).
    var name: String { get }

    /// What it can do for each feature now. A feature it has nothing to do
    /// with here is absent.
    var capabilities: [Feature: FeatureCapability] { get }

    /// What it adds to the `Desktop` property now; nil: nothing.
    var desktopPart: DesktopPart? { get }

    /// Called once, before anything else: starts following what its
    /// capabilities depend on (a desktop, a browser). `events` tells the
    /// service of changes; it may be called at any time afterwards, on the
    /// service's executor.
    nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async

    /// A caller asks for `features`, some of which this driver could deliver
    /// if it looked again (a browser started after the service): look now,
    /// within a bound. Default: nothing.
    nonisolated(nonsending) func lookAgain(for features: Set<Feature>) async

    /// A client read `SupportedFeatures` or `Desktop`: a driver that finds
    /// what it depends on only by looking may look (without waiting).
    /// Default: nothing.
    func supportWasRead()

    /// Whether `supportWasRead` does anything: the service asks only then.
    var followsReads: Bool { get }

    /// Checks a record a journal holds for it, as strictly as a caller's
    /// arguments: a journal with a record it refuses is corrupt.
    func validate(_ record: JSON) throws(DriverRecordError)

    /// Phase one of a change to `target`, before anything changes: checks it
    /// (a value the system refuses is `.unsupported`, and nothing changed)
    /// and makes `record` what the journal must hold before `apply` acts —
    /// enough for a restarted service to undo whatever `apply` may do.
    /// `cancel()` undoes it if the journal cannot be written. Default:
    /// nothing to check or to record ahead.
    func prepare(_ target: DriverTarget) throws(DriverFailure)

    /// Forgets what `prepare` set up; nothing was applied.
    func cancel()

    /// Phase two: makes exactly `target` real — what it should deliver and
    /// does not yet starts, what it delivers beyond it stops. Returns once
    /// that is done, or after its own bound. Returns whether its `record`
    /// now holds something the journal must learn at once (a program it
    /// started); a record that only dropped what it no longer needs may wait
    /// for the next journal write. Throws when a feature cannot be made
    /// real; the store then applies the previous target to every driver
    /// that took part, this one included.
    nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool

    /// What the journal keeps of it now; nil: nothing. Outside a session a
    /// record is something still to be put back (`SessionStore.settle`).
    var record: JSON? { get }

    /// Takes up the journal's record after a restart: for a session that
    /// goes on (`target`, `endsNow` false) what it left running is adopted
    /// and made to match; for one about to end (`endsNow`) nothing changes
    /// until its end; without a session (`target` nil) what it left is put
    /// back. Returns what it did and found, for the log.
    nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote]

    /// What it adds to the log line and the audit record of a session's end
    /// (`apply` of `.none`); nil: nothing.
    var endSummary: DriverSummary? { get }
}

extension FeatureDriver {
    package nonisolated(nonsending) func lookAgain(for features: Set<Feature>) async {}
    package func supportWasRead() {}
    package var followsReads: Bool { false }
    package func validate(_ record: JSON) throws(DriverRecordError) {}
    package func prepare(_ target: DriverTarget) throws(DriverFailure) {}
    package func cancel() {}
    package var endSummary: DriverSummary? { nil }
}

/// What one driver can do for a feature now.
package enum FeatureCapability: Hashable, Sendable {
    /// It makes the feature real: for the whole screen (the shell's
    /// magnifier, Orca), or for a part of it (GTK apps reading the keys, the
    /// browser's pages). A driver that reaches only a part leaves a feature
    /// another delivers to the whole screen alone.
    case delivers(Reach)
    /// It would make the feature real here, but cannot now: why (`orca is
    /// not installed`). The most specific reason there is.
    case unavailable(String)
    /// It does not make the feature real here: why (`the desktop 'sway'
    /// does not act on it`), for the reason when no driver does.
    case notActing(String)
    /// The feature cannot be on here at all, whatever else would deliver
    /// it: why (the settings backend lacks its keys).
    case impossible(String)

    package enum Reach: Hashable, Sendable {
        case wholeScreen
        case part
    }
}

/// What a driver adds to the `Desktop` property.
package enum DesktopPart: Hashable, Sendable {
    /// The desktop it found: the property's first part.
    case desktop(String)
    /// A layer over it while it is there: `+name` (`cage+browser`).
    case layer(String)
}

/// What a driver is to make real.
package struct DriverTarget: Hashable, Sendable {
    /// The session's features; none outside a session (and for its end).
    package var features: Set<Feature>
    package var zoomFactor: Double
    package var textScale: Double
    /// Of `features`, those another driver delivers to the whole screen: a
    /// driver that reaches only a part of it leaves them alone.
    package var coveredElsewhere: Set<Feature>

    package init(features: Set<Feature>, zoomFactor: Double, textScale: Double, coveredElsewhere: Set<Feature> = []) {
        self.features = features
        self.zoomFactor = zoomFactor
        self.textScale = textScale
        self.coveredElsewhere = coveredElsewhere
    }

    /// No session: nothing of any driver's stays.
    package static let none = DriverTarget(features: [], zoomFactor: 1, textScale: 1)

    /// The features a driver that reaches only part of the screen acts on.
    package var forPart: Set<Feature> { features.subtracting(coveredElsewhere) }
}

/// Why a driver could not make a target real.
package struct DriverFailure: Error, Hashable, Sendable, CustomStringConvertible {
    package enum Kind: Hashable, Sendable {
        /// A value of the target the system refuses; nothing changed.
        case unsupported
        /// It failed; what it did is undone by the store.
        case failed
        /// A peer did not answer in time: what it asked for may have been
        /// done, or may still be. Its record keeps what a restart needs to
        /// undo it.
        case outcomeUnknown
    }

    package let kind: Kind
    /// Names the feature (or key) and why.
    package let message: String

    package init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    package var description: String { message }

    /// The error a caller gets.
    package var apiError: GuidedAccessError {
        kind == .unsupported ? .unsupportedFeature(message) : .backendFailed(message)
    }
}

/// Why a journal's record of a driver is refused.
package struct DriverRecordError: Error, Hashable, Sendable, CustomStringConvertible {
    package let reason: String
    package init(_ reason: String) { self.reason = reason }
    package var description: String { reason }
}

/// A line for the log from a driver's recovery.
package struct DriverNote: Hashable, Sendable {
    package enum Level: Hashable, Sendable { case info, notice, error }
    package let level: Level
    package let text: String

    package init(_ level: Level, _ text: String) {
        self.level = level
        self.text = text
    }
}

/// What a driver adds to the record of a session's end.
package struct DriverSummary: Hashable, Sendable {
    /// For the log line (`4 keys restored`).
    package var text: String
    /// Audit fields (without the `GUIDEDACCESS_` prefix).
    package var fields: [String: String]

    package init(text: String, fields: [String: String]) {
        self.text = text
        self.fields = fields
    }
}

/// What a driver tells the service, on the service's executor.
package enum DriverEvent: Sendable {
    /// `capabilities` or `desktopPart` changed: what is supported is
    /// computed again and announced, and an active session is applied again.
    case changed
    /// Its record changed outside a transaction (a program started again):
    /// the journal learns it.
    case recordChanged
    /// A feature it delivered for the session failed for good (a program
    /// that kept exiting): for the log and the audit record.
    case featureLost(Feature, message: String, fields: [String: String])
}

/// A configuration key a driver module owns (`[Browser] DevToolsEndpoint=`):
/// the configuration checks its value and keeps it, trimmed, for the driver.
package struct DriverConfigurationKey: Sendable {
    package let group: String
    package let key: String
    /// nil when the value is good; else why not (for the error naming file,
    /// group, key and value).
    package let check: @Sendable (String) -> String?

    package init(group: String, key: String, check: @escaping @Sendable (String) -> String?) {
        self.group = group
        self.key = key
        self.check = check
    }
}
