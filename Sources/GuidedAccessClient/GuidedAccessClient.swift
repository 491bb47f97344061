import DBus
// The API's vocabulary (`Feature`, `Restriction`, `GuidedAccessError`, …) and
// its D-Bus form come with `import GuidedAccessClient`.
@_exported import GuidedAccessWire

/// A connection to the `org.guidedaccess.GuidedAccess1` service, for kiosk
/// apps and tools. Every method is one D-Bus call; errors are
/// `GuidedAccessError`.
///
///     let guidedAccess = try await GuidedAccessClient.connect()
///     try await guidedAccess.requestSession(enabled: [.screenReader])
public final class GuidedAccessClient: Sendable {
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

    static let propertiesInterface = "org.freedesktop.DBus.Properties"

    @discardableResult
    func call(_ method: GuidedAccessMethod, _ arguments: [DBusValue] = []) async throws(GuidedAccessError) -> [DBusValue] {
        try await call(method.rawValue, arguments, interface: GuidedAccessBus.interface)
    }

    func call(_ member: String, _ arguments: [DBusValue], interface: String) async throws(GuidedAccessError)
        -> [DBusValue]
    {
        do {
            return try await connection.call(
                destination: GuidedAccessBus.name, path: GuidedAccessBus.objectPath, interface: interface,
                member: member, arguments, allowInteractiveAuthorization: allowInteractiveAuthorization)
        } catch {
            throw GuidedAccessError(error)
        }
    }

    /// A reply value as `T`; a reply of another shape is the service's fault,
    /// not the caller's, so it is `.other` rather than `.invalidArgs`.
    func decode<T: DBusRepresentable>(_ value: DBusValue?, _: T.Type = T.self) throws(GuidedAccessError) -> T {
        guard let value else {
            throw .other(name: DBusError.invalidArgs("").name, message: "unexpected reply: no value")
        }
        do {
            return try value.decode(T.self)
        } catch {
            throw .other(name: error.name, message: "unexpected reply: \(error.message)")
        }
    }

    // MARK: Sessions

    /// Starts a session owned by this connection, with `enabled` turned on
    /// (all or nothing).
    public func requestSession(enabled: Set<Feature> = [], options: SessionOptions = .init())
        async throws(GuidedAccessError)
    {
        try await requestSession(featureNames: enabled.sortedWireNames, options: options)
    }

    /// Like `requestSession(enabled:options:)` with features by wire name, for
    /// names this library does not know yet (the service judges them).
    public func requestSession(featureNames: [String], options: SessionOptions = .init())
        async throws(GuidedAccessError)
    {
        var dictionary = try options.dictionary()
        if !featureNames.isEmpty { dictionary[.features] = Variant(featureNames.sorted()) }
        let wire = Dictionary(uniqueKeysWithValues: dictionary.map { ($0.key.rawValue, $0.value) })
        try await call(.startSession, [wire.dbusValue])
    }

    /// Turns features on or off in the session (like Apple's
    /// `configureForGuidedAccess(features:enabled:)`).
    public func configure(features: Set<Feature>, enabled: Bool) async throws(GuidedAccessError) {
        try await configure(featureNames: features.sortedWireNames, enabled: enabled)
    }

    /// Like `configure(features:enabled:)` with features by wire name.
    public func configure(featureNames: [String], enabled: Bool) async throws(GuidedAccessError) {
        try await call(.configureForSession, [featureNames.dbusValue, .bool(enabled)])
    }

    public func endSession() async throws(GuidedAccessError) {
        try await call(.endSession)
    }

    // MARK: The kiosk browser

    /// (1.2) Hands the service `socket`, one end of a Unix stream socket
    /// pair over which the caller relays the kiosk browser's DevTools pipe
    /// (`--remote-debugging-pipe`, NUL-delimited JSON) — what
    /// `guidedaccessctl browser` does. The descriptor is copied into the
    /// message: the caller keeps its own and closes it.
    public func attachBrowser(socket: Int32) async throws(GuidedAccessError) {
        try await call(.attachBrowser, [.unixFD(socket)])
    }

    // MARK: Properties

    func property(_ property: GuidedAccessProperty) async throws(GuidedAccessError) -> DBusValue {
        let reply = try await call(
            "Get", [.string(GuidedAccessBus.interface), .string(property.rawValue)], interface: Self.propertiesInterface)
        return try decode(reply.first, Variant.self).value
    }

    public var isSessionActive: Bool {
        get async throws(GuidedAccessError) { try decode(try await property(.sessionActive)) }
    }

    /// The features on in this session (names this library does not know are
    /// left out; `status()` keeps them).
    public var enabledFeatures: Set<Feature> {
        get async throws(GuidedAccessError) { try await features(.enabledFeatures) }
    }

    /// The features this service can make real on this kiosk (names this
    /// library does not know are left out; `status()` keeps them).
    public var supportedFeatures: Set<Feature> {
        get async throws(GuidedAccessError) { try await features(.supportedFeatures) }
    }

    func features(_ name: GuidedAccessProperty) async throws(GuidedAccessError) -> Set<Feature> {
        let names: [String] = try decode(try await property(name))
        return Set(names.compactMap(Feature.init(rawValue:)))
    }

    /// All properties at once (GetAll). A property the service does not have
    /// (an older version) is its zero value.
    public func status() async throws(GuidedAccessError) -> GuidedAccessStatus {
        let reply = try await call("GetAll", [.string(GuidedAccessBus.interface)], interface: Self.propertiesInterface)
        let all: [String: Variant] = try decode(reply.first)
        func value<T: DBusRepresentable>(_ property: GuidedAccessProperty, _ fallback: T) throws(GuidedAccessError) -> T {
            guard let v = all[property.rawValue] else { return fallback }
            return try decode(v.value)
        }
        return GuidedAccessStatus(
            sessionActive: try value(.sessionActive, false),
            sessionOwner: try value(.sessionOwner, ""),
            sessionDeadline: try value(.sessionDeadline, UInt64(0)),
            enabledFeatures: try value(.enabledFeatures, [String]()),
            supportedFeatures: try value(.supportedFeatures, [String]()),
            backend: try value(.backend, ""),
            desktop: try value(.desktop, ""),
            version: try value(.version, ""),
            agent: try value(.agent, ""),
            sessionOwnerOrigin: try value(.sessionOwnerOrigin, ""),
            unsupportedReasons: try value(.unsupportedReasons, [String: String]()))
    }

    // MARK: Restrictions

    public func restrictionState(for identifier: String) async throws(GuidedAccessError) -> RestrictionState {
        try decode(try await call(.getRestrictionState, [.string(identifier)]).first)
    }

    /// Every registered restriction, sorted by identifier.
    public func restrictions() async throws(GuidedAccessError) -> [Restriction] {
        try decode(try await call(.listRestrictions).first)
    }

    /// Operators only, inside a session only.
    public func setRestrictionState(_ state: RestrictionState, for identifier: String) async throws(GuidedAccessError) {
        try await call(.setRestrictionState, [.string(identifier), state.dbusValue])
    }

    /// Registers (or updates the texts of) restrictions; all or none.
    public func registerRestrictions(_ restrictions: [RestrictionRegistration]) async throws(GuidedAccessError) {
        try await call(.registerRestrictions, [restrictions.dbusValue])
    }

    public func unregisterRestrictions(_ identifiers: [String]) async throws(GuidedAccessError) {
        try await call(.unregisterRestrictions, [identifiers.dbusValue])
    }

    // MARK: Signals

    /// The service's SessionChanged and RestrictionChanged signals, in order.
    /// The subscription is in place when this returns; it ends when the
    /// consumer stops iterating.
    public func changes() async throws(GuidedAccessError) -> AsyncStream<GuidedAccessEvent> {
        let messages: AsyncStream<Message>
        do {
            messages = try await connection.signals(
                matching: MatchRule(
                    sender: GuidedAccessBus.name, path: GuidedAccessBus.objectPath, interface: GuidedAccessBus.interface))
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

    /// The event a signal stands for; nil for a signal of another shape (a
    /// newer service's) or a restriction state this library does not know.
    static func event(from message: Message) -> GuidedAccessEvent? {
        guard let member = message.member.flatMap(GuidedAccessSignal.init(rawValue:)),
            let args = try? message.arguments(), args.count >= 2
        else { return nil }
        switch (member, args[0], args[1]) {
        case (.sessionChanged, .bool(let active), .string(let reason)):
            return .session(active: active, reason: reason)
        case (.restrictionChanged, .string(let id), let state):
            guard let state = try? RestrictionState(dbusValue: state) else { return nil }
            return .restriction(identifier: id, state: state)
        default:
            return nil
        }
    }

    /// Registers the provider's restrictions and delivers their changes to
    /// it until the returned task is cancelled or the connection closes.
    @discardableResult
    public func register(provider: any GuidedAccessRestrictionProvider) async throws(GuidedAccessError) -> Task<Void, Never> {
        let registrations = provider.registrations
        // Subscribed first, so that no change after registering is missed.
        let events = try await changes()
        // On failure, dropping `events` ends the subscription.
        try await registerRestrictions(registrations)
        let mine = Set(registrations.map(\.identifier))
        return Task {
            for await event in events {
                if case .restriction(let id, let state) = event, mine.contains(id) {
                    provider.didChange(identifier: id, state: state)
                }
            }
        }
    }
}
