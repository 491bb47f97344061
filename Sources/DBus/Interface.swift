/// One declaration of a D-Bus interface: its methods with their arguments
/// and handlers, its properties with getters (and setters) and change
/// behaviour, and its signals. Dispatch, argument checking, property access
/// and the introspection XML are all derived from it, and every signature
/// from the Swift types its handlers take and return — there is no second
/// place to keep in sync.
public struct Interface: Sendable {
    public let name: String
    public let methods: [Method]
    public let properties: [Property]
    public let signals: [Signal]
    /// What the interface and each of its members are for, in the
    /// introspection XML as `org.gtk.GDBus.DocString` annotations (which
    /// gdbus-codegen reads): the interface's own under "", a member's under
    /// its name.
    public let documentation: [String: String]

    public init(
        _ name: String, documentation: [String: String] = [:], methods: [Method] = [], properties: [Property] = [],
        signals: [Signal] = []
    ) {
        precondition(DBusNames.isValidInterface(name), "'\(name)' is not a valid interface name")
        let members = methods.map({ $0.name }) + properties.map({ $0.name }) + signals.map({ $0.name })
        for member in members {
            precondition(DBusNames.isValidMember(member), "'\(member)' is not a valid member name")
        }
        for key in documentation.keys {
            precondition(key.isEmpty || members.contains(key), "documentation of '\(key)', which \(name) does not have")
        }
        precondition(Set(methods.map { $0.name }).count == methods.count, "duplicate method in \(name)")
        precondition(Set(properties.map { $0.name }).count == properties.count, "duplicate property in \(name)")
        precondition(Set(signals.map { $0.name }).count == signals.count, "duplicate signal in \(name)")
        self.name = name
        self.methods = methods
        self.properties = properties
        self.signals = signals
        self.documentation = documentation
    }

    /// The interface alone as an introspection document, as installed in
    /// /usr/share/dbus-1/interfaces/ for code generators and readers.
    public var introspectionDocument: String {
        Introspection.header + "<node>\n" + Introspection.xml(self) + "</node>\n"
    }

    public func method(_ name: String) -> Method? { methods.first { $0.name == name } }
    public func property(_ name: String) -> Property? { properties.first { $0.name == name } }
    public func signal(_ name: String) -> Signal? { signals.first { $0.name == name } }
}

/// An argument as dispatch and introspection see it: a name, a D-Bus type
/// and what a call may carry in it. `Argument` is the one to write; this is
/// what lists of arguments of mixed types hold.
public protocol ArgumentDeclaration: Sendable {
    var name: String { get }
    var type: DBusType { get }
    var bounds: ArgumentBounds { get }
}

/// A named argument of a method or signal, typed by the Swift value it
/// carries: its D-Bus type is `Value.dbusType`, so the declaration states
/// each type once and a handler receives (or returns) `Value` itself.
public struct Argument<Value: DBusRepresentable>: ArgumentDeclaration {
    public let name: String
    /// What a call may carry in a method's input (see `ArgumentBounds`);
    /// outputs and signal arguments are the service's own and unbounded.
    public let bounds: ArgumentBounds

    /// A `Value` whose type the specification does not allow (an empty
    /// struct, a dict keyed by a container) is a programming error.
    public init(_ name: String, _: Value.Type, bounds: ArgumentBounds = .none) {
        checkDeclared(Value.dbusType, "argument \(name)")
        self.name = name
        self.bounds = bounds
    }

    public var type: DBusType { Value.dbusType }

    /// The argument's value decoded for a handler. The dispatcher has
    /// checked its signature, so what fails here is the content (an unknown
    /// enum value, a struct field out of range): the caller's mistake, so
    /// InvalidArgs naming the argument, whatever error the conformance chose.
    func decode(_ value: DBusValue, of member: String) throws(DBusError) -> Value {
        do {
            return try Value(dbusValue: value)
        } catch {
            throw .invalidArgs("\(member) argument '\(name)': \(error.message)")
        }
    }
}

/// Declared types come from `DBusRepresentable` conformances, which can
/// describe types the specification forbids; catch those when the interface
/// is declared, not when a caller first meets them.
func checkDeclared(_ type: DBusType, _ what: @autoclosure () -> String) {
    do {
        _ = try DBusType.parseSingle(type.signature)
    } catch {
        preconditionFailure("\(what()): \(error.message)")
    }
}

/// What a method handler sees of the call.
public struct MethodCall: Sendable {
    /// The caller's unique bus name.
    public let sender: String
    public let path: ObjectPath
    public let interface: String
    public let member: String
    /// The arguments as received, already checked against the method's
    /// declared types. Typed handlers get them decoded; these are for the
    /// ones that need the raw values (an `a{sv}` read key by key).
    public let arguments: [DBusValue]
    /// The caller allows polkit to ask its user interactively.
    public let allowInteractiveAuthorization: Bool
    public let noReplyExpected: Bool
    /// The connection the call came in on, for calls of the handler's own.
    public let connection: Connection
}

/// A method: its arguments and the handler that answers it.
///
/// The typed initializers take up to three inputs and at most one output;
/// the handler receives the call and the decoded inputs and returns the
/// output's value. A call whose signature differs from the inputs' is
/// InvalidArgs before the handler runs, and so is one that carries more than
/// an input's bounds (see `ArgumentBounds`, before anything is decoded) or
/// whose values do not decode (see `Argument`). Checks that must answer with another error
/// (`UnknownFeature`) belong in the handler, not in a conformance.
public struct Method: Sendable {
    /// The one form every declaration is kept in, so that dispatch and
    /// introspection have a single path: the call (its arguments checked
    /// against `inputs`) to the reply's values.
    ///
    /// It runs on the dispatcher's executor (`nonisolated(nonsending)`):
    /// entering a nonisolated async function from a job on the loop is a
    /// trip through the loop's queue, so a wrapper of its own would add one
    /// on the way in and one on the way back, and work the handler queued
    /// (a task that closes the connection) would overtake its reply.
    typealias Handler = nonisolated(nonsending) @Sendable (MethodCall) async throws -> [DBusValue]

    public let name: String
    public let inputs: [any ArgumentDeclaration]
    public let outputs: [any ArgumentDeclaration]
    /// The signatures the dispatcher checks calls and replies against.
    public let inputSignature: String
    public let outputSignature: String
    let handler: Handler

    init(
        name: String, inputs: [any ArgumentDeclaration], outputs: [any ArgumentDeclaration],
        handler: @escaping Handler
    ) {
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.inputSignature = inputs.map { $0.type.signature }.joined()
        self.outputSignature = outputs.map { $0.type.signature }.joined()
        self.handler = handler
    }

    /// The untyped form, for what the typed ones cannot say: more than three
    /// inputs or more than one output, or values passed through without
    /// decoding. The handler reads `call.arguments` and returns the reply's
    /// values, which must match `outputs` (a reply that does not is Failed).
    public init(
        _ name: String, inputs: [any ArgumentDeclaration], outputs: [any ArgumentDeclaration],
        handler: @escaping @Sendable (MethodCall) async throws -> [DBusValue]
    ) {
        self.init(name: name, inputs: inputs, outputs: outputs, handler: handler)
    }

    // MARK: Typed forms

    public init(_ name: String, handler: @escaping @Sendable (MethodCall) async throws -> Void) {
        self.init(name: name, inputs: [], outputs: []) { call in
            try await handler(call)
            return []
        }
    }

    public init<R>(
        _ name: String, returns output: Argument<R>, handler: @escaping @Sendable (MethodCall) async throws -> R
    ) {
        self.init(name: name, inputs: [], outputs: [output]) { call in
            [try await handler(call).dbusValue]
        }
    }

    public init<A>(
        _ name: String, _ a: Argument<A>, handler: @escaping @Sendable (MethodCall, A) async throws -> Void
    ) {
        self.init(name: name, inputs: [a], outputs: []) { call in
            let values = try Method.values(call, count: 1)
            try await handler(call, try a.decode(values[0], of: name))
            return []
        }
    }

    public init<A, R>(
        _ name: String, _ a: Argument<A>, returns output: Argument<R>,
        handler: @escaping @Sendable (MethodCall, A) async throws -> R
    ) {
        self.init(name: name, inputs: [a], outputs: [output]) { call in
            let values = try Method.values(call, count: 1)
            return [try await handler(call, try a.decode(values[0], of: name)).dbusValue]
        }
    }

    public init<A, B>(
        _ name: String, _ a: Argument<A>, _ b: Argument<B>,
        handler: @escaping @Sendable (MethodCall, A, B) async throws -> Void
    ) {
        self.init(name: name, inputs: [a, b], outputs: []) { call in
            let values = try Method.values(call, count: 2)
            try await handler(call, try a.decode(values[0], of: name), try b.decode(values[1], of: name))
            return []
        }
    }

    public init<A, B, R>(
        _ name: String, _ a: Argument<A>, _ b: Argument<B>, returns output: Argument<R>,
        handler: @escaping @Sendable (MethodCall, A, B) async throws -> R
    ) {
        self.init(name: name, inputs: [a, b], outputs: [output]) { call in
            let values = try Method.values(call, count: 2)
            let result = try await handler(call, try a.decode(values[0], of: name), try b.decode(values[1], of: name))
            return [result.dbusValue]
        }
    }

    public init<A, B, C>(
        _ name: String, _ a: Argument<A>, _ b: Argument<B>, _ c: Argument<C>,
        handler: @escaping @Sendable (MethodCall, A, B, C) async throws -> Void
    ) {
        self.init(name: name, inputs: [a, b, c], outputs: []) { call in
            let values = try Method.values(call, count: 3)
            try await handler(
                call, try a.decode(values[0], of: name), try b.decode(values[1], of: name),
                try c.decode(values[2], of: name))
            return []
        }
    }

    public init<A, B, C, R>(
        _ name: String, _ a: Argument<A>, _ b: Argument<B>, _ c: Argument<C>, returns output: Argument<R>,
        handler: @escaping @Sendable (MethodCall, A, B, C) async throws -> R
    ) {
        self.init(name: name, inputs: [a, b, c], outputs: [output]) { call in
            let values = try Method.values(call, count: 3)
            let result = try await handler(
                call, try a.decode(values[0], of: name), try b.decode(values[1], of: name),
                try c.decode(values[2], of: name))
            return [result.dbusValue]
        }
    }

    /// The call's arguments, as many as the typed form decodes. The
    /// dispatcher has checked the signature; this keeps a handler run any
    /// other way from indexing past them.
    private static func values(_ call: MethodCall, count: Int) throws(DBusError) -> [DBusValue] {
        guard call.arguments.count == count else {
            throw .invalidArgs("\(call.member) expects \(count) arguments, got \(call.arguments.count)")
        }
        return call.arguments
    }
}

public struct Property: Sendable {
    /// How clients learn of changes (the `EmitsChangedSignal` annotation).
    public enum ChangeBehaviour: String, Sendable {
        /// `PropertiesChanged` carries the new value. `Properties.Get`
        /// answers with the value last announced, without the getter: a
        /// service announces every change (`Connection.propertiesChanged`).
        case emitsValue = "true"
        /// `PropertiesChanged` lists the property as invalidated.
        case invalidates = "invalidates"
        /// The value never changes: the getter runs until it has answered
        /// once, and `Properties.Get` answers with that value from then on.
        case constant = "const"
        /// No signal; clients must poll.
        case silent = "false"
    }

    /// The stored forms of getter and setter, whatever the property's type;
    /// on the caller's executor for the reason `Method.Handler` is.
    typealias Getter = nonisolated(nonsending) @Sendable () async throws -> DBusValue
    typealias Setter = nonisolated(nonsending) @Sendable (DBusValue, MethodCall) async throws -> Void

    public let name: String
    public let type: DBusType
    public let changes: ChangeBehaviour
    let getter: Getter
    let setter: Setter?
    /// Runs on the connection's loop each time a client reads the property
    /// (`Get`, `GetAll`), also when the held value answers: for a service
    /// whose value depends on something it looks at only when asked.
    let onRead: (@Sendable () -> Void)?

    /// A property of type `T`: the getter returns the value, the setter (a
    /// writable property's) receives it decoded. `Properties.Set` with a
    /// value of another type, or one that does not decode, is InvalidArgs
    /// before the setter runs.
    public init<T: DBusRepresentable>(
        _ name: String, _: T.Type, changes: ChangeBehaviour = .emitsValue,
        get: @escaping @Sendable () async throws -> T, set: (@Sendable (T, MethodCall) async throws -> Void)? = nil,
        onRead: (@Sendable () -> Void)? = nil
    ) {
        checkDeclared(T.dbusType, "property \(name)")
        self.name = name
        self.type = T.dbusType
        self.changes = changes
        self.onRead = onRead
        self.getter = { try await get().dbusValue }
        if let set {
            self.setter = { value, call in try await set(Property.decode(value, of: name), call) }
        } else {
            self.setter = nil
        }
    }

    /// A value for a setter. `Properties.Set` has checked its type, so what
    /// fails here is the content: InvalidArgs, as for method arguments.
    private static func decode<T: DBusRepresentable>(_ value: DBusValue, of name: String) throws(DBusError) -> T {
        do {
            return try T(dbusValue: value)
        } catch {
            throw .invalidArgs("property '\(name)': \(error.message)")
        }
    }

    public var isWritable: Bool { setter != nil }
}

public struct Signal: Sendable {
    public let name: String
    public let arguments: [any ArgumentDeclaration]
    /// The signature `Connection.emit` checks the values against.
    public let signature: String

    public init<each Value: DBusRepresentable>(_ name: String, _ arguments: repeat Argument<each Value>) {
        var list: [any ArgumentDeclaration] = []
        for argument in repeat each arguments { list.append(argument) }
        self.name = name
        self.arguments = list
        self.signature = list.map { $0.type.signature }.joined()
    }
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
        func doc(_ member: String, indent: String) -> String {
            guard let text = interface.documentation[member] else { return "" }
            return indent + "<annotation name=\"org.gtk.GDBus.DocString\" value=\"\(escape(text))\"/>\n"
        }
        /// Qt's type name of each argument whose type Qt does not know, as
        /// `QtTypeName.<direction><index>`, for each of `directions`.
        func qtTypes(_ arguments: [any ArgumentDeclaration], _ directions: [String]) -> String {
            var out = ""
            for (index, argument) in arguments.enumerated() {
                guard let name = qtTypeName(argument.type.signature) else { continue }
                for direction in directions {
                    out += "      <annotation name=\"\(qtTypeNameAnnotation).\(direction)\(index)\" value=\"\(name)\"/>\n"
                }
            }
            return out
        }
        var out = "  <interface name=\"\(escape(interface.name))\">\n" + doc("", indent: "    ")
        for method in interface.methods {
            var inner = doc(method.name, indent: "      ") + qtTypes(method.inputs, ["In"]) + qtTypes(method.outputs, ["Out"])
            inner += method.inputs.map { argument($0, direction: "in") }.joined()
                + method.outputs.map { argument($0, direction: "out") }.joined()
            out += element("method", method.name, inner)
        }
        for signal in interface.signals {
            // Qt 5's qdbusxml2cpp reads a signal's argument types as Out<N>, Qt 6's as In<N>: both.
            var inner = doc(signal.name, indent: "      ") + qtTypes(signal.arguments, ["Out", "In"])
            inner += signal.arguments.map { argument($0, direction: nil) }.joined()
            out += element("signal", signal.name, inner)
        }
        for property in interface.properties {
            let access = property.isWritable ? "readwrite" : "read"
            var inner = doc(property.name, indent: "      ")
            if let name = qtTypeName(property.type.signature) {
                inner += "      <annotation name=\"\(qtTypeNameAnnotation)\" value=\"\(name)\"/>\n"
            }
            if property.changes != .emitsValue {
                inner += "      <annotation name=\"org.freedesktop.DBus.Property.EmitsChangedSignal\" value=\"\(property.changes.rawValue)\"/>\n"
            }
            out += element(
                "property", property.name, inner,
                attributes: " type=\"\(escape(property.type.signature))\" access=\"\(access)\"")
        }
        return out + "  </interface>\n"
    }

    /// Qt's annotation naming the C++ type of an argument or property
    /// (`.In0`, `.Out1` for a method's arguments): Qt 5's `qdbusxml2cpp`
    /// stops at a type it does not know without one, so the installed XML
    /// carries it and a Qt kiosk app generates its proxy from that file as
    /// it is.
    static let qtTypeNameAnnotation = "org.qtproject.QtDBus.QtTypeName"

    /// The Qt type for a signature `qdbusxml2cpp` does not know: nil for
    /// the basic types and `as`/`ay` (QStringList, QByteArray), QVariantMap
    /// for `a{sv}`, else QDBusArgument (read with `>>`).
    static func qtTypeName(_ signature: String) -> String? {
        if signature.utf8.count == 1 || signature == "as" || signature == "ay" { return nil }
        return signature == "a{sv}" ? "QVariantMap" : "QDBusArgument"
    }

    /// A member's element, closed at once when it has nothing inside.
    private static func element(_ kind: String, _ name: String, _ inner: String, attributes: String = "") -> String {
        let open = "    <\(kind) name=\"\(escape(name))\"\(attributes)"
        return inner.isEmpty ? open + "/>\n" : open + ">\n" + inner + "    </\(kind)>\n"
    }

    private static func argument(_ arg: any ArgumentDeclaration, direction: String?) -> String {
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
            // Kept through attribute-value normalisation, which makes
            // literal white space other than a space a space.
            case "\n": out += "&#10;"
            case "\r": out += "&#13;"
            case "\t": out += "&#9;"
            default: out.append(c)
            }
        }
        return out
    }
}
