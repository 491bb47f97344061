import DBus
import GuidedAccessCore
import GuidedAccessService
import GuidedAccessWire

/// A method call to the service as its dispatcher and handlers take it, up to
/// the first thing that needs the service's state or the bus: the member
/// looked up as `Connection.invoke` does, the signature checked and each
/// argument read within its declared bounds (`Message.arguments(of:)`), then
/// decoded by the Swift type the service declares, then the checks each
/// handler makes before it identifies the caller; and the reply or error
/// reply the dispatcher would build from that.
///
/// The service's table (`GuidedAccessService.interface()`) answers with the
/// service's state and its bus; its arguments (`MethodArguments`) and first
/// checks are the service's own, and a new method is added to `methods` below.
enum ServiceCalls {
    /// One method: its declaration as `Method` (which gives the signature the
    /// dispatcher checks), and its arguments decoded and checked.
    struct ServiceMethod: Sendable {
        let declaration: Method
        /// The reply's values when the checks pass and the reply needs no
        /// more state than the scratch registry; nil where the handler would
        /// go on to identify and admit the caller.
        let check: @Sendable ([DBusValue]) throws -> [DBusValue]?

        init(_ name: GuidedAccessMethod, check: @escaping @Sendable () throws -> [DBusValue]?) {
            declaration = Method(name.rawValue) { _ in }
            self.check = { _ in try check() }
        }

        init<A>(_ name: GuidedAccessMethod, _ a: Argument<A>, check: @escaping @Sendable (A) throws -> [DBusValue]?) {
            declaration = Method(name.rawValue, a) { _, _ in }
            self.check = { values in try check(try ServiceCalls.decode(a, values[0])) }
        }

        init<A, B>(
            _ name: GuidedAccessMethod, _ a: Argument<A>, _ b: Argument<B>,
            check: @escaping @Sendable (A, B) throws -> [DBusValue]?
        ) {
            declaration = Method(name.rawValue, a, b) { _, _, _ in }
            self.check = { values in
                try check(try ServiceCalls.decode(a, values[0]), try ServiceCalls.decode(b, values[1]))
            }
        }
    }

    /// What `Argument.decode` does for the dispatcher (internal to the DBus
    /// layer): the type's own conformance, its failure InvalidArgs naming
    /// the argument.
    static func decode<A>(_ argument: Argument<A>, _ value: DBusValue) throws(DBusError) -> A {
        do {
            return try A(dbusValue: value)
        } catch {
            throw .invalidArgs("argument '\(argument.name)': \(error.message)")
        }
    }

    /// The registry the restriction calls are checked against, with a
    /// restriction the seed corpus names, so that calls naming it get past
    /// the lookup. Each call changes a copy, as the handlers' scratch checks do.
    static let registry: RestrictionRegistry = {
        var registry = RestrictionRegistry()
        try? registry.register([
            RestrictionRegistration(identifier: "org.example.kiosk.payments", text: "Payments"),
            RestrictionRegistration(identifier: "org.example.kiosk.printing", text: "Printing", detail: "Receipts"),
        ])
        return registry
    }()

    /// `GuidedAccessService.interface()`'s methods, with the checks of
    /// Sessions.swift and Restrictions.swift that come before the caller is
    /// identified.
    static let methods: [ServiceMethod] = [
        ServiceMethod(.startSession, MethodArguments.options) { options in
            _ = try GuidedAccessService.sessionParameters(options, defaults: SessionDefaults())
            return nil
        },
        ServiceMethod(.endSession) { nil },
        ServiceMethod(.configureForSession, MethodArguments.features, MethodArguments.enabled) { names, _ in
            _ = try GuidedAccessService.requestedFeatures(names)
            return nil
        },
        ServiceMethod(.registerRestrictions, MethodArguments.restrictions) { batch in
            var scratch = registry
            try scratch.register(batch)
            return nil
        },
        ServiceMethod(.unregisterRestrictions, MethodArguments.identifiers) { identifiers in
            var scratch = registry
            try scratch.unregister(identifiers)
            return nil
        },
        ServiceMethod(.setRestrictionState, MethodArguments.identifier, MethodArguments.state) { identifier, state in
            _ = try registry.state(of: identifier)
            var scratch = registry
            try scratch.setState(state, of: identifier)
            return nil
        },
        ServiceMethod(.getRestrictionState, MethodArguments.identifier) { identifier in
            [try registry.state(of: identifier).dbusValue]
        },
        ServiceMethod(.listRestrictions) { [registry.restrictions.dbusValue] },
    ]

    /// The reply the dispatcher would send, where it is known without the
    /// service's state: an error reply for every call the checks refuse.
    static func answer(_ call: Message) -> Message? {
        do {
            guard let values = try handle(call) else { return nil }
            let reply = try call.makeReturn()
            try reply.append(values)
            return reply
        } catch let error as DBusError {
            return try? call.makeError(error)
        } catch let error as DBusErrorConvertible {
            return try? call.makeError(error.dbusError)
        } catch {
            return try? call.makeError(.failed(String(describing: error)))
        }
    }

    /// `Connection.invoke`'s lookup: a method of the interface the call
    /// names (any, when it names none), else the standard interfaces.
    private static func handle(_ call: Message) throws -> [DBusValue]? {
        let member = call.member ?? ""
        let interfaceName = call.interface
        if interfaceName == nil || interfaceName == GuidedAccessBus.interface,
            let method = methods.first(where: { $0.declaration.name == member })
        {
            let arguments = try call.arguments(of: method.declaration)
            return try method.check(arguments)
        }
        switch (interfaceName ?? "", member) {
        case ("org.freedesktop.DBus.Properties", "Get"), ("", "Get"):
            let args = try call.arguments(expecting: "ss")
            _ = try property(args[0], args[1])
            return nil
        case ("org.freedesktop.DBus.Properties", "GetAll"), ("", "GetAll"):
            let args = try call.arguments(expecting: "s")
            let name = try String(dbusValue: args[0])
            guard name == GuidedAccessBus.interface || name.hasPrefix("org.freedesktop.DBus.") else {
                throw DBusError.unknownInterface("no interface '\(name)' at \(GuidedAccessBus.path)")
            }
            return nil
        case ("org.freedesktop.DBus.Properties", "Set"), ("", "Set"):
            // The dispatcher reads the names only; the value too, here, so
            // that reading variants is fuzzed as well.
            let args = try call.arguments(expecting: "ssv")
            let name = try property(args[0], args[1])
            // Every property of the service is read-only.
            throw DBusError.propertyReadOnly("property '\(name)' of \(GuidedAccessBus.interface) is read-only")
        case ("org.freedesktop.DBus.Introspectable", "Introspect"), ("", "Introspect"),
            ("org.freedesktop.DBus.Peer", "Ping"), ("", "Ping"),
            ("org.freedesktop.DBus.Peer", "GetMachineId"), ("", "GetMachineId"):
            _ = try call.arguments(expecting: "")
            return nil
        default:
            if let interfaceName {
                throw DBusError.unknownMethod(
                    "unknown method '\(member)' or interface '\(interfaceName)' at \(GuidedAccessBus.path)")
            }
            throw DBusError.unknownMethod("unknown method '\(member)' at \(GuidedAccessBus.path)")
        }
    }

    /// `Connection.findProperty`.
    private static func property(_ interfaceArg: DBusValue, _ nameArg: DBusValue) throws(DBusError) -> String {
        let interfaceName = try String(dbusValue: interfaceArg)
        let name = try String(dbusValue: nameArg)
        guard interfaceName == GuidedAccessBus.interface else {
            throw .unknownInterface("no interface '\(interfaceName)' at \(GuidedAccessBus.path)")
        }
        guard GuidedAccessProperty(rawValue: name) != nil else {
            throw .unknownProperty("no property '\(name)' in \(interfaceName)")
        }
        return name
    }
}
