import DBus

/// A connection to the `org.guidedaccess.GuidedAccess1` service, for kiosk
/// apps and tools. Every method is one D-Bus call; errors are
/// `GuidedAccessError`.
///
///     let guidedAccess = try await GuidedAccessClient.connect()
///     try await guidedAccess.requestSession(enabled: [.screenReader])
public final class GuidedAccessClient: Sendable {
    public static let busName = "org.guidedaccess.GuidedAccess1"
    public static let path: ObjectPath = "/org/guidedaccess/GuidedAccess1"
    public static let interfaceName = "org.guidedaccess.GuidedAccess1"

    public let connection: Connection
    /// Calls carry ALLOW_INTERACTIVE_AUTHORIZATION (polkit may ask a password).
    public let allowInteractiveAuthorization: Bool

    init(connection: Connection, allowInteractiveAuthorization: Bool) {
        self.connection = connection
        self.allowInteractiveAuthorization = allowInteractiveAuthorization
    }

    /// Connects to the bus the service is on: the session bus in user mode,
    /// the system bus in system mode.
    public static func connect(
        bus: Bus = .session, allowInteractiveAuthorization: Bool = false
    ) async throws(GuidedAccessError) -> GuidedAccessClient {
        do {
            let connection = try await Connection.connect(to: bus)
            return GuidedAccessClient(connection: connection, allowInteractiveAuthorization: allowInteractiveAuthorization)
        } catch {
            throw .serviceUnavailable(error.message)
        }
    }

    /// Closes the connection; streams of `changes()` then end.
    public func close() async {
        await connection.close()
    }

    // MARK: Calls

    @discardableResult
    func call(_ member: String, _ arguments: [DBusValue] = [], interface: String = interfaceName)
        async throws(GuidedAccessError) -> [DBusValue]
    {
        do {
            return try await connection.call(
                destination: Self.busName, path: Self.path, interface: interface, member: member, arguments,
                allowInteractiveAuthorization: allowInteractiveAuthorization)
        } catch {
            throw GuidedAccessError(error)
        }
    }

    func decode<T: DBusRepresentable>(_ value: DBusValue?, _: T.Type = T.self) throws(GuidedAccessError) -> T {
        guard let value else { throw .other(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "missing reply value") }
        do {
            return try value.decode(T.self)
        } catch {
            throw .other(name: error.name, message: "unexpected reply: \(error.message)")
        }
    }

    func state(_ text: String) throws(GuidedAccessError) -> RestrictionState {
        guard let state = RestrictionState(rawValue: text) else {
            throw .other(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "unknown restriction state '\(text)'")
        }
        return state
    }

    // MARK: Sessions

    /// Starts a session owned by this connection, with `enabled` turned on
    /// (all or nothing).
    public func requestSession(enabled: Set<GuidedAccessFeature> = [], options: SessionOptions = .init())
        async throws(GuidedAccessError)
    {
        try await requestSession(featureNames: enabled.map(\.rawValue), options: options)
    }

    /// Like `requestSession(enabled:options:)` with features by wire name, for
    /// names this library does not know yet (the service judges them).
    public func requestSession(featureNames: [String], options: SessionOptions = .init())
        async throws(GuidedAccessError)
    {
        var dictionary = try options.dictionary()
        if !featureNames.isEmpty { dictionary["features"] = Variant(featureNames.sorted()) }
        try await call("StartSession", [dictionary.dbusValue])
    }

    /// Turns features on or off in the session (like Apple's
    /// `configureForGuidedAccess(features:enabled:)`).
    public func configure(features: Set<GuidedAccessFeature>, enabled: Bool) async throws(GuidedAccessError) {
        try await configure(featureNames: features.map(\.rawValue), enabled: enabled)
    }

    public func configure(featureNames: [String], enabled: Bool) async throws(GuidedAccessError) {
        try await call("ConfigureForSession", [featureNames.dbusValue, .bool(enabled)])
    }

    public func endSession() async throws(GuidedAccessError) {
        try await call("EndSession")
    }

    // MARK: Properties

    func property(_ name: String) async throws(GuidedAccessError) -> DBusValue {
        let reply = try await call(
            "Get", [.string(Self.interfaceName), .string(name)], interface: "org.freedesktop.DBus.Properties")
        return try decode(reply.first, Variant.self).value
    }

    public var isSessionActive: Bool {
        get async throws(GuidedAccessError) { try decode(try await property("SessionActive")) }
    }

    /// The features on in this session (names this library does not know are left out).
    public var enabledFeatures: Set<GuidedAccessFeature> {
        get async throws(GuidedAccessError) {
            let names: [String] = try decode(try await property("EnabledFeatures"))
            return Set(names.compactMap(GuidedAccessFeature.init(rawValue:)))
        }
    }

    public var supportedFeatures: Set<GuidedAccessFeature> {
        get async throws(GuidedAccessError) {
            let names: [String] = try decode(try await property("SupportedFeatures"))
            return Set(names.compactMap(GuidedAccessFeature.init(rawValue:)))
        }
    }

    /// All properties at once (GetAll).
    public func status() async throws(GuidedAccessError) -> GuidedAccessStatus {
        let reply = try await call(
            "GetAll", [.string(Self.interfaceName)], interface: "org.freedesktop.DBus.Properties")
        let all: [String: Variant] = try decode(reply.first)
        func value<T: DBusRepresentable>(_ name: String, _ fallback: T) throws(GuidedAccessError) -> T {
            guard let v = all[name] else { return fallback }
            return try decode(v.value)
        }
        return GuidedAccessStatus(
            sessionActive: try value("SessionActive", false),
            sessionOwner: try value("SessionOwner", ""),
            sessionDeadline: try value("SessionDeadline", UInt64(0)),
            enabledFeatures: try value("EnabledFeatures", [String]()),
            supportedFeatures: try value("SupportedFeatures", [String]()),
            backend: try value("Backend", ""),
            version: try value("Version", ""))
    }

    // MARK: Restrictions

    public func restrictionState(for identifier: String) async throws(GuidedAccessError) -> RestrictionState {
        let reply = try await call("GetRestrictionState", [.string(identifier)])
        return try state(try decode(reply.first, String.self))
    }

    /// Every registered restriction, sorted by identifier.
    public func restrictions() async throws(GuidedAccessError) -> [Restriction] {
        let reply = try await call("ListRestrictions")
        guard case .array(_, let items)? = reply.first else {
            throw .other(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "unexpected reply to ListRestrictions")
        }
        var result: [Restriction] = []
        for item in items {
            guard case .structure(let m) = item, m.count == 4, case .string(let id) = m[0],
                case .string(let text) = m[1], case .string(let detail) = m[2], case .string(let s) = m[3]
            else {
                throw .other(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "unexpected restriction \(item)")
            }
            result.append(Restriction(identifier: id, text: text, detailText: detail, state: try state(s)))
        }
        return result
    }

    /// Operators only, inside a session only.
    public func setRestrictionState(_ state: RestrictionState, for identifier: String) async throws(GuidedAccessError) {
        try await call("SetRestrictionState", [.string(identifier), .string(state.rawValue)])
    }

    /// Registers (or updates the texts of) restrictions; all or none.
    public func registerRestrictions(_ restrictions: [Restriction]) async throws(GuidedAccessError) {
        let items = restrictions.map {
            DBusValue.structure([.string($0.identifier), .string($0.text), .string($0.detailText)])
        }
        try await call("RegisterRestrictions", [.array(.structure([.string, .string, .string]), items)])
    }

    public func unregisterRestrictions(_ identifiers: [String]) async throws(GuidedAccessError) {
        try await call("UnregisterRestrictions", [identifiers.dbusValue])
    }

    // MARK: Signals

    /// The service's SessionChanged and RestrictionChanged signals, in order.
    /// The subscription is in place when this returns; it ends when the
    /// consumer stops iterating.
    public func changes() async throws(GuidedAccessError) -> AsyncStream<GuidedAccessEvent> {
        let messages: AsyncStream<Message>
        do {
            messages = try await connection.signals(
                matching: MatchRule(sender: Self.busName, path: Self.path, interface: Self.interfaceName))
        } catch {
            throw GuidedAccessError(error)
        }
        let (stream, continuation) = AsyncStream<GuidedAccessEvent>.makeStream(bufferingPolicy: .unbounded)
        let task = Task {
            for await message in messages {
                if let event = Self.event(from: message) { continuation.yield(event) }
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
        return stream
    }

    static func event(from message: Message) -> GuidedAccessEvent? {
        guard let args = try? message.arguments() else { return nil }
        switch (message.member, args.count >= 2 ? args[0] : nil, args.count >= 2 ? args[1] : nil) {
        case ("SessionChanged", .bool(let active)?, .string(let reason)?):
            return .session(active: active, reason: reason)
        case ("RestrictionChanged", .string(let id)?, .string(let s)?):
            guard let state = RestrictionState(rawValue: s) else { return nil }
            return .restriction(identifier: id, state: state)
        default:
            return nil
        }
    }

    /// Registers the provider's restrictions and delivers their changes to
    /// it until the returned task is cancelled or the connection closes.
    @discardableResult
    public func register(provider: any GuidedAccessRestrictionProvider) async throws(GuidedAccessError) -> Task<Void, Never> {
        let identifiers = provider.identifiers
        // Subscribed first, so that no change after registering is missed.
        let events = try await changes()
        // On failure, dropping `events` ends the subscription.
        try await registerRestrictions(identifiers.map {
            Restriction(identifier: $0, text: provider.text(for: $0), detailText: provider.detailText(for: $0) ?? "")
        })
        let mine = Set(identifiers)
        return Task {
            for await event in events {
                if case .restriction(let id, let state) = event, mine.contains(id) {
                    provider.didChange(identifier: id, state: state)
                }
            }
        }
    }
}
