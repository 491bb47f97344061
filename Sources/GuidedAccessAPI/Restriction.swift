/// Whether a restriction's action is allowed right now.
public enum RestrictionState: String, CaseIterable, Hashable, Sendable, CustomStringConvertible {
    case allow
    case deny

    /// Parses the wire form; anything but `allow`/`deny` is InvalidArgs.
    public init(wireName: String) throws(GuidedAccessError) {
        guard let state = RestrictionState(rawValue: wireName) else {
            throw .invalidArgs("restriction state '\(wireName)' is neither 'allow' nor 'deny'")
        }
        self = state
    }

    public var description: String { rawValue }
}

/// A custom restriction as RegisterRestrictions takes it: `(identifier, text, detail)`.
public struct RestrictionRegistration: Hashable, Sendable {
    public var identifier: String
    public var text: String
    public var detail: String

    public init(identifier: String, text: String, detail: String = "") {
        self.identifier = identifier
        self.text = text
        self.detail = detail
    }

    public static let maxIdentifierLength = 255
    public static let maxTextBytes = 200
    public static let maxDetailBytes = 1000

    /// Checks the spec's limits; InvalidArgs names the identifier and what is wrong.
    public func validate() throws(GuidedAccessError) {
        let idLength = identifier.unicodeScalars.count
        guard (1...Self.maxIdentifierLength).contains(idLength) else {
            throw .invalidArgs(
                "restriction identifier '\(identifier)' has \(idLength) characters, expected 1 to \(Self.maxIdentifierLength)")
        }
        if let bad = identifier.unicodeScalars.first(where: { !Self.isIdentifierScalar($0) }) {
            throw .invalidArgs(
                "restriction identifier '\(identifier)' contains '\(bad)'; only A-Z a-z 0-9 . _ - are allowed")
        }
        let textBytes = text.utf8.count
        guard (1...Self.maxTextBytes).contains(textBytes) else {
            throw .invalidArgs(
                "text of restriction '\(identifier)' is \(textBytes) bytes, expected 1 to \(Self.maxTextBytes)")
        }
        let detailBytes = detail.utf8.count
        guard detailBytes <= Self.maxDetailBytes else {
            throw .invalidArgs(
                "detail of restriction '\(identifier)' is \(detailBytes) bytes, at most \(Self.maxDetailBytes) allowed")
        }
    }

    private static func isIdentifierScalar(_ s: Unicode.Scalar) -> Bool {
        switch s {
        case "A"..."Z", "a"..."z", "0"..."9", ".", "_", "-": return true
        default: return false
        }
    }
}

/// A registered restriction and its state; a row of ListRestrictions.
public struct Restriction: Hashable, Sendable {
    public var identifier: String
    public var text: String
    public var detail: String
    public var state: RestrictionState

    public init(identifier: String, text: String, detail: String, state: RestrictionState = .allow) {
        self.identifier = identifier
        self.text = text
        self.detail = detail
        self.state = state
    }
}
