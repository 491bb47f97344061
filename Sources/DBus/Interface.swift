/// One declaration of a D-Bus interface: its methods with their argument
/// types and handlers, its properties with getters (and setters) and change
/// behaviour, and its signals. Dispatch, argument checking, property access
/// and the introspection XML are all derived from it — there is no second
/// place to keep in sync.
public struct Interface: Sendable {
    public let name: String
    public let methods: [Method]
    public let properties: [Property]
    public let signals: [Signal]

    public init(_ name: String, methods: [Method] = [], properties: [Property] = [], signals: [Signal] = []) {
        precondition(DBusNames.isValidInterface(name), "'\(name)' is not a valid interface name")
        for member in methods.map({ $0.name }) + properties.map({ $0.name }) + signals.map({ $0.name }) {
            precondition(DBusNames.isValidMember(member), "'\(member)' is not a valid member name")
        }
        precondition(Set(methods.map { $0.name }).count == methods.count, "duplicate method in \(name)")
        precondition(Set(properties.map { $0.name }).count == properties.count, "duplicate property in \(name)")
        precondition(Set(signals.map { $0.name }).count == signals.count, "duplicate signal in \(name)")
        self.name = name
        self.methods = methods
        self.properties = properties
        self.signals = signals
    }

    public func method(_ name: String) -> Method? { methods.first { $0.name == name } }
    public func property(_ name: String) -> Property? { properties.first { $0.name == name } }
    public func signal(_ name: String) -> Signal? { signals.first { $0.name == name } }
}

/// A named, typed argument of a method or signal.
public struct Argument: Sendable {
    public let name: String
    public let type: DBusType

    /// `signature` must be one complete type; an invalid one is a programming error.
    public init(_ name: String, _ signature: String) {
        do {
            type = try DBusType.parseSingle(signature)
        } catch {
            preconditionFailure("argument \(name): \(error.message)")
        }
        self.name = name
    }
}

/// What a method handler sees of the call.
public struct MethodCall: Sendable {
    /// The caller's unique bus name.
    public let sender: String
    public let path: ObjectPath
    public let interface: String
    public let member: String
    /// The arguments, already checked against the method's declared types.
    public let arguments: [DBusValue]
    /// The caller allows polkit to ask its user interactively.
    public let allowInteractiveAuthorization: Bool
    public let noReplyExpected: Bool
    /// The connection the call came in on, for calls of the handler's own.
    public let connection: Connection

    /// The argument at `index`, decoded. Arguments are type-checked before a
    /// handler runs, so a failure here is a mistake in the declaration.
    public func argument<T: DBusRepresentable>(_ index: Int, as _: T.Type = T.self) throws(DBusError) -> T {
        guard index < arguments.count else {
            throw .invalidArgs("\(member) expects an argument at position \(index)")
        }
        return try arguments[index].decode(T.self)
    }
}

public typealias MethodHandler = @Sendable (MethodCall) async throws -> [DBusValue]

public struct Method: Sendable {
    public let name: String
    public let inputs: [Argument]
    public let outputs: [Argument]
    public let handler: MethodHandler

    public init(_ name: String, inputs: [Argument] = [], outputs: [Argument] = [], handler: @escaping MethodHandler) {
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.handler = handler
    }

    public var inputSignature: String { inputs.map { $0.type.signature }.joined() }
    public var outputSignature: String { outputs.map { $0.type.signature }.joined() }
}

public struct Property: Sendable {
    /// How clients learn of changes (the `EmitsChangedSignal` annotation).
    public enum ChangeBehaviour: String, Sendable {
        /// `PropertiesChanged` carries the new value.
        case emitsValue = "true"
        /// `PropertiesChanged` lists the property as invalidated.
        case invalidates = "invalidates"
        /// The value never changes.
        case constant = "const"
        /// No signal; clients must poll.
        case silent = "false"
    }

    public typealias Getter = @Sendable () async throws -> DBusValue
    public typealias Setter = @Sendable (DBusValue, MethodCall) async throws -> Void

    public let name: String
    public let type: DBusType
    public let changes: ChangeBehaviour
    public let getter: Getter
    public let setter: Setter?

    public init(
        _ name: String, _ signature: String, changes: ChangeBehaviour = .emitsValue,
        get: @escaping Getter, set: Setter? = nil
    ) {
        do {
            type = try DBusType.parseSingle(signature)
        } catch {
            preconditionFailure("property \(name): \(error.message)")
        }
        self.name = name
        self.changes = changes
        self.getter = get
        self.setter = set
    }

    public var isWritable: Bool { setter != nil }
}

public struct Signal: Sendable {
    public let name: String
    public let arguments: [Argument]

    public init(_ name: String, _ arguments: [Argument] = []) {
        self.name = name
        self.arguments = arguments
    }

    public var signature: String { arguments.map { $0.type.signature }.joined() }
}

// MARK: - Introspection

enum Introspection {
    static let header = """
        <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">

        """

    /// The interfaces every exported object implements.
    static let standardInterfaces = """
          <interface name="org.freedesktop.DBus.Peer">
            <method name="Ping"/>
            <method name="GetMachineId">
              <arg type="s" name="machine_uuid" direction="out"/>
            </method>
          </interface>
          <interface name="org.freedesktop.DBus.Introspectable">
            <method name="Introspect">
              <arg type="s" name="xml_data" direction="out"/>
            </method>
          </interface>
          <interface name="org.freedesktop.DBus.Properties">
            <method name="Get">
              <arg type="s" name="interface_name" direction="in"/>
              <arg type="s" name="property_name" direction="in"/>
              <arg type="v" name="value" direction="out"/>
            </method>
            <method name="GetAll">
              <arg type="s" name="interface_name" direction="in"/>
              <arg type="a{sv}" name="props" direction="out"/>
            </method>
            <method name="Set">
              <arg type="s" name="interface_name" direction="in"/>
              <arg type="s" name="property_name" direction="in"/>
              <arg type="v" name="value" direction="in"/>
            </method>
            <signal name="PropertiesChanged">
              <arg type="s" name="interface_name"/>
              <arg type="a{sv}" name="changed_properties"/>
              <arg type="as" name="invalidated_properties"/>
            </signal>
          </interface>

        """

    static func xml(interfaces: [Interface]?, children: [String]) -> String {
        var out = header + "<node>\n"
        if let interfaces {
            out += standardInterfaces
            for interface in interfaces { out += xml(interface) }
        }
        for child in children {
            out += "  <node name=\"\(escape(child))\"/>\n"
        }
        return out + "</node>\n"
    }

    static func xml(_ interface: Interface) -> String {
        var out = "  <interface name=\"\(escape(interface.name))\">\n"
        for method in interface.methods {
            if method.inputs.isEmpty && method.outputs.isEmpty {
                out += "    <method name=\"\(escape(method.name))\"/>\n"
                continue
            }
            out += "    <method name=\"\(escape(method.name))\">\n"
            for arg in method.inputs { out += argument(arg, direction: "in") }
            for arg in method.outputs { out += argument(arg, direction: "out") }
            out += "    </method>\n"
        }
        for signal in interface.signals {
            if signal.arguments.isEmpty {
                out += "    <signal name=\"\(escape(signal.name))\"/>\n"
                continue
            }
            out += "    <signal name=\"\(escape(signal.name))\">\n"
            for arg in signal.arguments { out += argument(arg, direction: nil) }
            out += "    </signal>\n"
        }
        for property in interface.properties {
            let access = property.isWritable ? "readwrite" : "read"
            let open = "    <property name=\"\(escape(property.name))\" type=\"\(escape(property.type.signature))\" access=\"\(access)\""
            if property.changes == .emitsValue {
                out += open + "/>\n"
            } else {
                out += open + ">\n"
                out += "      <annotation name=\"org.freedesktop.DBus.Property.EmitsChangedSignal\" value=\"\(property.changes.rawValue)\"/>\n"
                out += "    </property>\n"
            }
        }
        return out + "  </interface>\n"
    }

    private static func argument(_ arg: Argument, direction: String?) -> String {
        let dir = direction.map { " direction=\"\($0)\"" } ?? ""
        return "      <arg type=\"\(escape(arg.type.signature))\" name=\"\(escape(arg.name))\"\(dir)/>\n"
    }

    static func escape(_ text: String) -> String {
        var out = ""
        for c in text {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&apos;"
            default: out.append(c)
            }
        }
        return out
    }
}
