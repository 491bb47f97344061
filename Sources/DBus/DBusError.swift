/// An error with a D-Bus error name and a human-readable message. Handlers
/// throw it to reply with that error; calls to other services throw it when
/// they answer with one.
public struct DBusError: Error, Hashable, Sendable, CustomStringConvertible {
    public let name: String
    public let message: String

    public init(name: String, message: String) {
        self.name = name
        self.message = message
    }

    public var description: String { "\(name): \(message)" }

    static let prefix = "org.freedesktop.DBus.Error."

    public static func invalidArgs(_ message: String) -> DBusError {
        DBusError(name: prefix + "InvalidArgs", message: message)
    }
    public static func unknownMethod(_ message: String) -> DBusError {
        DBusError(name: prefix + "UnknownMethod", message: message)
    }
    public static func unknownInterface(_ message: String) -> DBusError {
        DBusError(name: prefix + "UnknownInterface", message: message)
    }
    public static func unknownObject(_ message: String) -> DBusError {
        DBusError(name: prefix + "UnknownObject", message: message)
    }
    public static func unknownProperty(_ message: String) -> DBusError {
        DBusError(name: prefix + "UnknownProperty", message: message)
    }
    public static func propertyReadOnly(_ message: String) -> DBusError {
        DBusError(name: prefix + "PropertyReadOnly", message: message)
    }
    public static func accessDenied(_ message: String) -> DBusError {
        DBusError(name: prefix + "AccessDenied", message: message)
    }
    public static func interactiveAuthorizationRequired(_ message: String) -> DBusError {
        DBusError(name: prefix + "InteractiveAuthorizationRequired", message: message)
    }
    public static func failed(_ message: String) -> DBusError {
        DBusError(name: prefix + "Failed", message: message)
    }
    public static func noMemory() -> DBusError {
        DBusError(name: prefix + "NoMemory", message: "out of memory")
    }
    public static func noReply(_ message: String) -> DBusError {
        DBusError(name: prefix + "NoReply", message: message)
    }
    public static func disconnected(_ message: String) -> DBusError {
        DBusError(name: prefix + "Disconnected", message: message)
    }
    public static func timedOut(_ message: String) -> DBusError {
        DBusError(name: prefix + "Timeout", message: message)
    }
}

/// An error of a service's own that a handler may throw: it reaches the
/// caller as the D-Bus error it converts to.
public protocol DBusErrorConvertible: Error {
    var dbusError: DBusError { get }
}
