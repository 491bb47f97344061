import CDBus

/// An object this connection serves: its interfaces and the property values
/// the connection holds for them.
final class ExportedObject {
    let path: ObjectPath
    let interfaces: [Interface]
    /// Per interface, the value last announced of each property that
    /// announces changes (`.emitsValue`, `.invalidates`): read at `export`,
    /// updated by `propertiesChanged`, so that `PropertiesChanged` carries
    /// only what really changed.
    var announced: [String: [String: DBusValue]] = [:]
    /// Per interface, the value of each `.constant` property, once read.
    var constants: [String: [String: DBusValue]] = [:]
    /// Calls to this object routed to a task and not yet answered, by
    /// sender: while a sender has any, its `Properties.Get` takes its turn
    /// behind them (D-Bus orders each connection's messages, not those of
    /// different connections).
    var callsInProgress: [String: Int] = [:]

    init(path: ObjectPath, interfaces: [Interface]) {
        self.path = path
        self.interfaces = interfaces
    }

    func interface(_ name: String) -> Interface? {
        interfaces.first { $0.name == name }
    }

    /// The value `Properties.Get` answers with without running the getter:
    /// for an `.emitsValue` property the value last announced, for a
    /// `.constant` one the value first read. Nil when the getter must run
    /// (`.invalidates`, `.silent`, nothing held yet, a value of the wrong
    /// type, which the getter path reports).
    func heldValue(of property: Property, in interface: String) -> DBusValue? {
        let value: DBusValue?
        switch property.changes {
        case .emitsValue: value = announced[interface]?[property.name]
        case .constant: value = constants[interface]?[property.name]
        case .invalidates, .silent: value = nil
        }
        guard let value, value.type == property.type else { return nil }
        return value
    }
}

enum StandardInterface {
    static let properties = "org.freedesktop.DBus.Properties"
    static let introspectable = "org.freedesktop.DBus.Introspectable"
    static let peer = "org.freedesktop.DBus.Peer"
}

extension Connection {
    /// Serves `interfaces` at `path`. Export objects before requesting a bus
    /// name, so that no call reaches a half-built service.
    public func export(_ interfaces: [Interface], at path: ObjectPath) async throws(DBusError) {
        guard objects[path.rawValue] == nil else {
            throw .invalidArgs("an object is already exported at \(path)")
        }
        let names = interfaces.map { $0.name }
        guard Set(names).count == names.count else { throw .invalidArgs("an interface is listed twice for \(path)") }
        let object = ExportedObject(path: path, interfaces: interfaces)
        objects[path.rawValue] = object
        for interface in interfaces {
            var values: [String: DBusValue] = [:]
            for property in interface.properties where property.changes == .emitsValue || property.changes == .invalidates {
                if let value = try? await property.getter() { values[property.name] = value }
            }
            object.announced[interface.name] = values
        }
    }

    /// Re-reads the properties of `interface` at `path` that announce
    /// changes, and emits one `PropertiesChanged` with those whose values
    /// differ from the last announced ones (nothing when none do). Call it
    /// after changing state, before the reply and before other signals.
    public func propertiesChanged(path: ObjectPath, interface: String) async {
        await propertyFlushes.run {
            await self.flushProperties(path: path, interface: interface)
        }
    }

    private func flushProperties(path: ObjectPath, interface name: String) async {
        guard let object = objects[path.rawValue], let interface = object.interface(name) else { return }
        var values = object.announced[name] ?? [:]
        var changed: [DBusValue.DictEntry] = []
        var invalidated: [DBusValue] = []
        for property in interface.properties where property.changes == .emitsValue || property.changes == .invalidates {
            guard let value = try? await property.getter() else { continue }
            if values[property.name] == value { continue }
            values[property.name] = value
            if property.changes == .emitsValue {
                changed.append(.init(.string(property.name), .variant(value)))
            } else {
                invalidated.append(.string(property.name))
            }
        }
        guard !changed.isEmpty || !invalidated.isEmpty else { return }
        // Get answers with these from now on: in the same step as the
        // signal, not property by property across the getters' awaits.
        object.announced[name] = values
        do {
            let message = try Message.signal(path: path, interface: StandardInterface.properties, member: "PropertiesChanged")
            try message.append([
                .string(name), .dictionary(key: .string, value: .variant, changed), .array(.string, invalidated),
            ])
            try send(message)
        } catch {
            logger.error("cannot emit PropertiesChanged for \(name) at \(path): \(error)")
        }
    }

    // MARK: Routing

    func route(_ message: Message) {
        // A sender with `callsPerSender` calls being handled, or calls
        // waiting: this one waits behind them (a sender's calls start in
        // the order it sent them).
        let sender = message.sender ?? ""
        let (running, waiting) = senderCalls[sender].map { ($0.running, $0.waiting.count - $0.head) } ?? (0, 0)
        if running >= Self.callsPerSender || waiting > 0 {
            guard waiting < Self.waitingPerSender else {
                if !message.noReplyExpected {
                    reply(
                        to: message,
                        error: DBusError(
                            name: "org.freedesktop.DBus.Error.LimitsExceeded",
                            message: "\(Self.callsPerSender + Self.waitingPerSender) calls of this connection are already being handled or waiting"))
                }
                return
            }
            senderCalls[sender]?.waiting.append(message)
            return
        }
        start(message, sender: sender)
    }

    /// A sender's call ended: the next of its calls that wait start (one
    /// answered at once, a held property's Get, lets the next start too).
    private func ended(_ sender: String) {
        senderCalls[sender]?.running -= 1
        while (senderCalls[sender]?.running ?? Self.callsPerSender) < Self.callsPerSender,
            let next = senderCalls[sender]?.next()
        {
            start(next, sender: sender)
        }
        if let calls = senderCalls[sender], calls.running == 0, !calls.isWaiting { senderCalls[sender] = nil }
    }

    private func start(_ message: Message, sender: String) {
        // libdbus has validated the path of every call it hands us.
        guard let pathText = message.path, let object = objects[pathText] else {
            routeToNoObject(message)
            return
        }
        // Behind a call of the same sender to the object still being
        // handled, a Get takes the task path too, so that it does not
        // overtake a call sent before it. Another sender's calls do not
        // hold it up: a client flooding calls does not delay everyone's Get.
        if object.callsInProgress[sender] == nil, let values = heldProperties(message, on: object) {
            reply(to: message, values: values)
            return
        }
        // Each call runs as its own task on the loop: a handler that awaits
        // another service does not hold up the calls behind it, and the
        // executor preference keeps nonisolated handler code on the loop's
        // thread too (no hop to the global pool, calls start in order).
        object.callsInProgress[sender, default: 0] += 1
        senderCalls[sender, default: SenderCalls()].running += 1
        Task(executorPreference: loop) { [self] in
            await execute(message, at: pathText, sender: sender)
        }
    }

    /// A call to a path where no object is exported: its ancestors answer
    /// Introspect (listing their children), and every path answers Ping.
    private func routeToNoObject(_ message: Message) {
        guard let pathText = message.path, let path = try? ObjectPath(validating: pathText) else {
            reply(to: message, error: .unknownObject("the call has no valid object path"))
            return
        }
        let member = message.member ?? ""
        let interface = message.interface ?? StandardInterface.introspectable
        let children = childNodes(of: path)
        if interface == StandardInterface.introspectable, member == "Introspect", !children.isEmpty || path == "/" {
            reply(to: message, values: [.string(Introspection.xml(interfaces: nil, children: children))])
        } else if interface == StandardInterface.peer, member == "Ping" {
            reply(to: message, values: [])
        } else {
            reply(to: message, error: .unknownObject("no object at path \(path)"))
        }
    }

    /// `Properties.Get` answered at once, with no task and no getter, from
    /// the value the connection holds (`ExportedObject.heldValue`); `GetAll`
    /// too when it holds the value of every property of the interface. So a
    /// property's value as Get returns it is the value last announced: state
    /// that a handler (or a timer) has changed and not yet announced with
    /// `propertiesChanged` is not seen half-way. Nil for anything else (an
    /// unknown name, another signature, no reply wanted, a property whose
    /// getter must run): the call takes the task path, errors included.
    private func heldProperties(_ message: Message, on object: ExportedObject) -> [DBusValue]? {
        let properties = StandardInterface.properties
        // An object that declares the interface itself answers on its own.
        guard dbus_message_has_interface(message.raw, properties) != 0, !message.noReplyExpected,
            object.interface(properties) == nil
        else { return nil }
        if dbus_message_has_member(message.raw, "Get") != 0 {
            guard dbus_message_has_signature(message.raw, "ss") != 0, let args = try? message.arguments(),
                case .string(let interfaceName) = args[0], case .string(let name) = args[1],
                let property = object.interface(interfaceName)?.property(name),
                let value = object.heldValue(of: property, in: interfaceName)
            else { return nil }
            property.onRead?()
            return [.variant(value)]
        }
        if dbus_message_has_member(message.raw, "GetAll") != 0 {
            guard dbus_message_has_signature(message.raw, "s") != 0, let args = try? message.arguments(),
                case .string(let interfaceName) = args[0], let interface = object.interface(interfaceName)
            else { return nil }
            var entries: [DBusValue.DictEntry] = []
            for property in interface.properties {
                guard let value = object.heldValue(of: property, in: interfaceName) else { return nil }
                entries.append(.init(.string(property.name), .variant(value)))
            }
            for property in interface.properties { property.onRead?() }
            return [.dictionary(key: .string, value: .variant, entries)]
        }
        return nil
    }

    private func execute(_ message: Message, at path: String, sender: String) async {
        defer { ended(sender) }
        guard let object = objects[path] else {
            reply(to: message, error: .unknownObject("no object at path \(path)"))
            return
        }
        defer {
            let left = object.callsInProgress[sender, default: 1] - 1
            object.callsInProgress[sender] = left > 0 ? left : nil
        }
        do {
            let values = try await invoke(message, on: object)
            reply(to: message, values: values)
        } catch let error as DBusError {
            reply(to: message, error: error)
        } catch let error as DBusErrorConvertible {
            reply(to: message, error: error.dbusError)
        } catch {
            logger.error("\(message.interface ?? "").\(message.member ?? "") failed: \(error)")
            reply(to: message, error: .failed(String(describing: error)))
        }
    }

    private func reply(to call: Message, values: [DBusValue]) {
        guard !call.noReplyExpected else { return }
        do {
            let reply = try call.makeReturn()
            try reply.append(values)
            try send(reply)
        } catch {
            logger.error("cannot reply to \(call.member ?? ""): \(error)")
            self.reply(to: call, error: .failed("the service could not encode its reply"))
        }
    }

    private func reply(to call: Message, error: DBusError) {
        guard !call.noReplyExpected, isConnected else { return }
        do {
            try send(call.makeError(error))
        } catch {
            logger.error("cannot send error reply to \(call.member ?? ""): \(error)")
        }
    }

    private func childNodes(of path: ObjectPath) -> [String] {
        let prefix = path.elements
        var children = Set<String>()
        for candidate in objects.values {
            let elements = candidate.path.elements
            if elements.count > prefix.count, Array(elements.prefix(prefix.count)) == prefix {
                children.insert(String(elements[prefix.count]))
            }
        }
        return children.sorted()
    }

    private func invoke(_ message: Message, on object: ExportedObject) async throws -> [DBusValue] {
        let member = message.member ?? ""
        let interfaceName = message.interface

        // A member of the object's own interfaces (the named one, or any when
        // the call names none).
        let candidates = interfaceName.map { name in object.interfaces.filter { $0.name == name } } ?? object.interfaces
        for interface in candidates {
            guard let method = interface.method(member) else { continue }
            let arguments = try message.arguments(of: method)
            // Descriptors the call carried are lent to the handler (`UnixFD`).
            defer { for argument in arguments { argument.closeDescriptors() } }
            let call = makeCall(message, path: object.path, interface: interface.name, arguments: arguments)
            let values = try await method.handler(call)
            guard values.count == method.outputs.count, zip(values, method.outputs).allSatisfy({ $0.type == $1.type })
            else {
                let actual = values.map { $0.type.signature }.joined()
                logger.error(
                    "\(interface.name).\(member) returned '\(actual)', declared '\(method.outputSignature)'")
                throw DBusError.failed("the service returned a reply of the wrong type")
            }
            return values
        }

        switch (interfaceName ?? "", member) {
        case (StandardInterface.properties, "Get"), ("", "Get"):
            let args = try message.arguments(expecting: "ss")
            let property = try findProperty(object, args[0], args[1])
            return [.variant(try await read(property, in: try String(dbusValue: args[0]), of: object))]
        case (StandardInterface.properties, "GetAll"), ("", "GetAll"):
            let args = try message.arguments(expecting: "s")
            let name = try String(dbusValue: args[0])
            var entries: [DBusValue.DictEntry] = []
            if let interface = object.interface(name) {
                for property in interface.properties {
                    let value = try await read(property, in: name, of: object)
                    entries.append(.init(.string(property.name), .variant(value)))
                }
            } else if ![StandardInterface.properties, StandardInterface.introspectable, StandardInterface.peer]
                .contains(name)
            {
                throw DBusError.unknownInterface("no interface '\(name)' at \(object.path)")
            }
            return [.dictionary(key: .string, value: .variant, entries)]
        case (StandardInterface.properties, "Set"), ("", "Set"):
            // The value is read only for a property that takes one: refusing
            // to set a read-only property decodes nothing, whatever was sent.
            try message.check(signature: "ssv")
            let names = try message.arguments(first: 2)
            let property = try findProperty(object, names[0], names[1])
            let interface = try String(dbusValue: names[0])
            guard let setter = property.setter else {
                throw DBusError.propertyReadOnly("property '\(property.name)' of \(interface) is read-only")
            }
            let args = try message.arguments()
            defer { for argument in args { argument.closeDescriptors() } }
            let value = try Variant(dbusValue: args[2]).value
            guard value.type == property.type else {
                throw DBusError.invalidArgs(
                    "property '\(property.name)' has type '\(property.type.signature)', got '\(value.type.signature)'")
            }
            try await setter(value, makeCall(message, path: object.path, interface: interface, arguments: args))
            await propertiesChanged(path: object.path, interface: interface)
            return []
        case (StandardInterface.introspectable, "Introspect"), ("", "Introspect"):
            _ = try message.arguments(expecting: "")
            return [.string(Introspection.xml(interfaces: object.interfaces, children: childNodes(of: object.path)))]
        case (StandardInterface.peer, "Ping"), ("", "Ping"):
            _ = try message.arguments(expecting: "")
            return []
        case (StandardInterface.peer, "GetMachineId"), ("", "GetMachineId"):
            _ = try message.arguments(expecting: "")
            return [.string(try machineID())]
        default:
            if let interfaceName {
                throw DBusError.unknownMethod("unknown method '\(member)' or interface '\(interfaceName)' at \(object.path)")
            }
            throw DBusError.unknownMethod("unknown method '\(member)' at \(object.path)")
        }
    }

    private func makeCall(_ message: Message, path: ObjectPath, interface: String, arguments: [DBusValue]) -> MethodCall {
        MethodCall(
            sender: message.sender ?? "", path: path, interface: interface, member: message.member ?? "",
            arguments: arguments, allowInteractiveAuthorization: message.allowInteractiveAuthorization,
            noReplyExpected: message.noReplyExpected, connection: self)
    }

    private func findProperty(_ object: ExportedObject, _ interfaceArg: DBusValue, _ nameArg: DBusValue) throws
        -> Property
    {
        let interfaceName = try String(dbusValue: interfaceArg)
        let name = try String(dbusValue: nameArg)
        guard let interface = object.interface(interfaceName) else {
            throw DBusError.unknownInterface("no interface '\(interfaceName)' at \(object.path)")
        }
        guard let property = interface.property(name) else {
            throw DBusError.unknownProperty("no property '\(name)' in \(interfaceName)")
        }
        return property
    }

    /// The property's value from its getter; a `.constant` one's getter
    /// runs only until it has answered once.
    private func read(_ property: Property, in interface: String, of object: ExportedObject) async throws
        -> DBusValue
    {
        property.onRead?()
        if property.changes == .constant, let value = object.constants[interface]?[property.name] { return value }
        let value = try await property.getter()
        guard value.type == property.type else {
            logger.error("property \(property.name) returned '\(value.type.signature)', declared '\(property.type.signature)'")
            throw DBusError.failed("the service returned a property of the wrong type")
        }
        if property.changes == .constant { object.constants[interface, default: [:]][property.name] = value }
        return value
    }

    private func machineID() throws(DBusError) -> String {
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        guard let id = dbus_try_get_local_machine_id(&error) else {
            throw DBusError(from: error, default: "no machine id")
        }
        defer { dbus_free(id) }
        return String(cString: id)
    }
}

/// Runs async sections one at a time, in the order they arrive, on the
/// caller's executor — so that property announcements never overtake each
/// other across suspension points.
final class SerialSection {
    private var busy = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    func run(isolation: isolated (any Actor)? = #isolation, _ body: () async -> Void) async {
        while busy {
            await withCheckedContinuation { continuation in
                // The body may run after other jobs: check again.
                if busy {
                    waiters.append(continuation)
                } else {
                    continuation.resume()
                }
            }
        }
        busy = true
        await body()
        busy = false
        if !waiters.isEmpty { waiters.removeFirst().resume() }
    }
}
