/// The registered restrictions and their states.
///
/// The registry does not know whether a session is active. The service keeps
/// the invariant "outside a session every state is allow": it refuses
/// SetRestrictionState outside a session before reaching the registry, calls
/// `resetAll()` when a session ends, and when it loads a journal without a
/// session. So `state(of:)` is already "allow" outside a session and one
/// source of truth serves GetRestrictionState and ListRestrictions.
public struct RestrictionRegistry: Hashable, Sendable {
    public static let defaultLimit = 256

    public let limit: Int
    private var byIdentifier: [String: Restriction]

    public init(limit: Int = RestrictionRegistry.defaultLimit, restrictions: [Restriction] = []) {
        self.limit = limit
        self.byIdentifier = Dictionary(restrictions.map { ($0.identifier, $0) }, uniquingKeysWith: { _, last in last })
    }

    /// All restrictions, sorted by identifier (ListRestrictions).
    public var restrictions: [Restriction] {
        byIdentifier.values.sorted { $0.identifier < $1.identifier }
    }

    public var count: Int { byIdentifier.count }

    /// Registers the whole batch or none of it. New restrictions start at
    /// allow; registering an identifier again updates its texts and keeps its
    /// state.
    public mutating func register(_ batch: [RestrictionRegistration]) throws(GuidedAccessError) {
        guard !batch.isEmpty else { throw .invalidArgs("the list of restrictions to register is empty") }
        // More than can exist is too many, whatever they hold: the bound a
        // caller's batch is held to before it is read.
        guard batch.count <= limit else {
            throw .limitExceeded("a batch of \(batch.count) restrictions is more than the \(limit) that may exist")
        }
        var seen: Set<String> = []
        for registration in batch {
            try registration.validate()
            guard seen.insert(registration.identifier).inserted else {
                throw .invalidArgs("restriction identifier '\(registration.identifier)' appears twice in the batch")
            }
        }
        let newCount = seen.subtracting(byIdentifier.keys).count
        guard byIdentifier.count + newCount <= limit else {
            throw .limitExceeded(
                "registering \(newCount) new restrictions to the \(byIdentifier.count) registered would exceed the limit of \(limit)")
        }
        for r in batch {
            let state = byIdentifier[r.identifier]?.state ?? .allow
            byIdentifier[r.identifier] = Restriction(identifier: r.identifier, text: r.text, detail: r.detail, state: state)
        }
    }

    /// Removes the whole batch or none of it. The list is checked first:
    /// longer than the limit, or an identifier named twice, is InvalidArgs
    /// (no valid list is longer than the limit: the bound a caller's list is
    /// held to before it is read).
    public mutating func unregister(_ identifiers: [String]) throws(GuidedAccessError) {
        guard !identifiers.isEmpty else { throw .invalidArgs("the list of restrictions to unregister is empty") }
        guard identifiers.count <= limit else {
            throw .invalidArgs("\(identifiers.count) identifiers to unregister, more than the \(limit) that may exist")
        }
        var seen: Set<String> = []
        for id in identifiers where !seen.insert(id).inserted {
            throw .invalidArgs("restriction identifier '\(id)' appears twice in the list")
        }
        for id in identifiers where byIdentifier[id] == nil { throw Self.unknown(id) }
        for id in identifiers { byIdentifier[id] = nil }
    }

    /// Sets a state; returns whether it changed (RestrictionChanged is sent
    /// only then).
    @discardableResult
    public mutating func setState(_ state: RestrictionState, of identifier: String) throws(GuidedAccessError) -> Bool {
        guard let old = byIdentifier[identifier]?.state else { throw Self.unknown(identifier) }
        byIdentifier[identifier]?.state = state
        return old != state
    }

    public func state(of identifier: String) throws(GuidedAccessError) -> RestrictionState {
        guard let restriction = byIdentifier[identifier] else { throw Self.unknown(identifier) }
        return restriction.state
    }

    /// Sets every state to allow; returns the identifiers that were deny,
    /// sorted (one RestrictionChanged each, in this order).
    public mutating func resetAll() -> [String] {
        let denied = byIdentifier.values.filter { $0.state == .deny }.map { $0.identifier }.sorted()
        for id in denied { byIdentifier[id]?.state = .allow }
        return denied
    }

    private static func unknown(_ identifier: String) -> GuidedAccessError {
        .unknownRestriction("no restriction '\(identifier)' is registered")
    }
}
