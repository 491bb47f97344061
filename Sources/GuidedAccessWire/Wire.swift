import DBus
@_exported import GuidedAccessAPI

// The API's types in their D-Bus form. Both sides of the bus use these: the
// service's interface declaration takes its signatures from them, and the
// client decodes replies with them. A value of another shape is InvalidArgs.

extension GuidedAccessBus {
    /// `path` as an object path.
    public static let objectPath = ObjectPath(stringLiteral: path)
}

extension AgentBus {
    /// `path` as an object path.
    public static let objectPath = ObjectPath(stringLiteral: path)
}

extension GuidedAccessError: DBusErrorConvertible {
    /// Thrown from a handler, the error reaches the caller under its D-Bus name.
    public var dbusError: DBusError { DBusError(name: dbusErrorName, message: message) }

    /// The error of a D-Bus error reply, by its name.
    public init(_ error: DBusError) {
        self.init(dbusErrorName: error.name, message: error.message)
    }
}

extension RestrictionState: DBusRepresentable {
    public static var dbusType: DBusType { .string }
    public var dbusValue: DBusValue { .string(rawValue) }
    /// Anything but `allow` or `deny` is InvalidArgs naming the value.
    public init(dbusValue v: DBusValue) throws(DBusError) {
        let text = try String(dbusValue: v)
        do {
            self = try RestrictionState(wireName: text)
        } catch {
            throw .invalidArgs(error.message)
        }
    }
}

/// `(identifier, text, detail)`, an element of RegisterRestrictions' `a(sss)`.
extension RestrictionRegistration: DBusRepresentable {
    public static var dbusType: DBusType { .structure([.string, .string, .string]) }
    public var dbusValue: DBusValue { .structure([.string(identifier), .string(text), .string(detail)]) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .structure(let fields) = v, fields.count == 3 else {
            throw .invalidArgs("a restriction must be (identifier, text, detail), got '\(v.type.signature)'")
        }
        self.init(
            identifier: try String(dbusValue: fields[0]), text: try String(dbusValue: fields[1]),
            detail: try String(dbusValue: fields[2]))
    }
}

/// `(identifier, text, detail, state)`, an element of ListRestrictions' `a(ssss)`.
extension Restriction: DBusRepresentable {
    public static var dbusType: DBusType { .structure([.string, .string, .string, .string]) }
    public var dbusValue: DBusValue {
        .structure([.string(identifier), .string(text), .string(detail), .string(state.rawValue)])
    }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .structure(let fields) = v, fields.count == 4 else {
            throw .invalidArgs("a restriction must be (identifier, text, detail, state), got '\(v.type.signature)'")
        }
        self.init(
            identifier: try String(dbusValue: fields[0]), text: try String(dbusValue: fields[1]),
            detail: try String(dbusValue: fields[2]), state: try RestrictionState(dbusValue: fields[3]))
    }
}
