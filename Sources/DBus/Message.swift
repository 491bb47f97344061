import CDBus
import Glibc

/// A D-Bus message: a reference to a libdbus `DBusMessage`.
///
/// `@unchecked Sendable`: libdbus reference-counts messages atomically and
/// locks a message once it is sent or received; after that it is only read,
/// each reader with its own iterator. Messages are built on one task before
/// they are sent.
public final class Message: @unchecked Sendable {
    let raw: OpaquePointer

    /// Takes over a reference the caller owns.
    init(adopting raw: OpaquePointer) {
        self.raw = raw
    }

    /// Adds a reference of its own.
    init(retaining raw: OpaquePointer) {
        self.raw = dbus_message_ref(raw)
    }

    deinit {
        dbus_message_unref(raw)
    }

    public enum Kind: Sendable {
        case methodCall, methodReturn, error, signal, invalid
    }

    // MARK: Construction

    public static func methodCall(
        destination: String?, path: ObjectPath, interface: String?, member: String
    ) throws(DBusError) -> Message {
        if let destination, !DBusNames.isValidBusName(destination) {
            throw .invalidArgs("'\(destination)' is not a valid bus name")
        }
        if let interface, !DBusNames.isValidInterface(interface) {
            throw .invalidArgs("'\(interface)' is not a valid interface name")
        }
        guard DBusNames.isValidMember(member) else {
            throw .invalidArgs("'\(member)' is not a valid member name")
        }
        guard let raw = dbus_message_new_method_call(destination, path.rawValue, interface, member) else {
            throw .noMemory()
        }
        return Message(adopting: raw)
    }

    /// A signal; with `destination`, sent to that connection only (unicast),
    /// not to everyone whose match rules take it.
    public static func signal(
        path: ObjectPath, interface: String, member: String, destination: String? = nil
    ) throws(DBusError) -> Message {
        if let destination, !DBusNames.isValidBusName(destination) {
            throw .invalidArgs("'\(destination)' is not a valid bus name")
        }
        guard DBusNames.isValidInterface(interface) else {
            throw .invalidArgs("'\(interface)' is not a valid interface name")
        }
        guard DBusNames.isValidMember(member) else {
            throw .invalidArgs("'\(member)' is not a valid member name")
        }
        guard let raw = dbus_message_new_signal(path.rawValue, interface, member) else { throw .noMemory() }
        if let destination, dbus_message_set_destination(raw, destination) == 0 {
            dbus_message_unref(raw)
            throw .noMemory()
        }
        return Message(adopting: raw)
    }

    /// A method return for this method call.
    public func makeReturn() throws(DBusError) -> Message {
        guard let raw = dbus_message_new_method_return(raw) else { throw .noMemory() }
        return Message(adopting: raw)
    }

    /// An error reply for this method call. An invalid error name becomes
    /// `org.freedesktop.DBus.Error.Failed` (libdbus would abort on it).
    public func makeError(_ error: DBusError) throws(DBusError) -> Message {
        let name = DBusNames.isValidInterface(error.name) ? error.name : DBusError.failed("").name
        let text = error.message.replacingNULs()
        guard let reply = dbus_message_new_error(raw, name, text) else { throw .noMemory() }
        return Message(adopting: reply)
    }

    // MARK: Headers

    public var kind: Kind {
        switch dbus_message_get_type(raw) {
        case CDBUS_MESSAGE_TYPE_METHOD_CALL: return .methodCall
        case CDBUS_MESSAGE_TYPE_METHOD_RETURN: return .methodReturn
        case CDBUS_MESSAGE_TYPE_ERROR: return .error
        case CDBUS_MESSAGE_TYPE_SIGNAL: return .signal
        default: return .invalid
        }
    }

    public var path: String? { dbus_message_get_path(raw).map { String(cString: $0) } }
    public var interface: String? { dbus_message_get_interface(raw).map { String(cString: $0) } }
    public var member: String? { dbus_message_get_member(raw).map { String(cString: $0) } }
    public var errorName: String? { dbus_message_get_error_name(raw).map { String(cString: $0) } }
    public var destination: String? { dbus_message_get_destination(raw).map { String(cString: $0) } }
    public var sender: String? { dbus_message_get_sender(raw).map { String(cString: $0) } }
    public var signature: String { String(cString: dbus_message_get_signature(raw)) }
    public var serial: UInt32 { dbus_message_get_serial(raw) }
    public var replySerial: UInt32 { dbus_message_get_reply_serial(raw) }

    public var noReplyExpected: Bool {
        get { dbus_message_get_no_reply(raw) != 0 }
        set { dbus_message_set_no_reply(raw, newValue ? 1 : 0) }
    }

    public var allowInteractiveAuthorization: Bool {
        get { dbus_message_get_allow_interactive_authorization(raw) != 0 }
        set { dbus_message_set_allow_interactive_authorization(raw, newValue ? 1 : 0) }
    }

    /// Whether this is a signal with the given interface and member.
    public func isSignal(_ interface: String, _ member: String) -> Bool {
        dbus_message_is_signal(raw, interface, member) != 0
    }

    // MARK: Body

    /// Appends values to the body. Every value is checked first, so a bad
    /// value leaves the message unchanged.
    public func append(_ values: [DBusValue]) throws(DBusError) {
        for value in values { try value.validate() }
        if values.count > 1 || !(values.first?.type.isBasic ?? true) {
            let total = signature + values.map { $0.type.signature }.joined()
            guard total.utf8.count <= 255 else {
                throw .invalidArgs("message signature '\(total)' is longer than 255 bytes")
            }
        }
        var iter = DBusMessageIter()
        dbus_message_iter_init_append(raw, &iter)
        for value in values {
            guard Marshal.append(value, to: &iter) else { throw .noMemory() }
        }
    }

    /// Turns `SO_LINGER` off on every socket the message carries (see
    /// `UnixFD.close`): libdbus closes its own copies when the message is freed.
    func defuseDescriptors() {
        guard let values = try? arguments() else { return }
        func walk(_ value: DBusValue) {
            switch value {
            case .unixFD(let fd):
                UnixFD.defuseLinger(fd)
                Glibc.close(fd)
            case .array(_, let values), .structure(let values): values.forEach(walk)
            case .dictionary(_, _, let entries):
                for entry in entries {
                    walk(entry.key)
                    walk(entry.value)
                }
            case .variant(let value): walk(value)
            default: break
            }
        }
        values.forEach(walk)
    }

    /// Reads the whole body.
    public func arguments() throws(DBusError) -> [DBusValue] {
        try arguments(first: .max)
    }

    /// Reads the first `count` arguments (fewer if the body has fewer).
    func arguments(first count: Int) throws(DBusError) -> [DBusValue] {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(raw, &iter) != 0 else { return [] }
        var values: [DBusValue] = []
        var budget = ReadBudget.unlimited
        while values.count < count, dbus_message_iter_get_arg_type(&iter) != CDBUS_TYPE_INVALID {
            values.append(try Marshal.read(&iter, within: &budget))
            dbus_message_iter_next(&iter)
        }
        return values
    }

    /// Reads the body and checks that its signature is `expected`.
    public func arguments(expecting expected: String) throws(DBusError) -> [DBusValue] {
        try check(signature: expected)
        return try arguments()
    }

    /// InvalidArgs naming both signatures unless the body's is `expected`.
    func check(signature expected: String) throws(DBusError) {
        let actual = signature
        guard actual == expected else {
            throw .invalidArgs("expected arguments of type '\(expected)', got '\(actual)'")
        }
    }

    // MARK: Wire form

    /// The message in wire format (it gets a serial of 1 if it has none).
    public func marshal() throws(DBusError) -> [UInt8] {
        if serial == 0 { dbus_message_set_serial(raw, 1) }
        var buffer: UnsafeMutablePointer<CChar>?
        var length: Int32 = 0
        guard dbus_message_marshal(raw, &buffer, &length) != 0, let buffer else { throw .noMemory() }
        defer { dbus_free(buffer) }
        return buffer.withMemoryRebound(to: UInt8.self, capacity: Int(length)) {
            Array(UnsafeBufferPointer(start: $0, count: Int(length)))
        }
    }

    /// Parses and validates a message in wire format, as libdbus does for
    /// every message that arrives from a bus.
    public static func demarshal(_ bytes: [UInt8]) throws(DBusError) -> Message {
        // libdbus reports a truncated buffer as out of memory: check the
        // length the header announces first.
        guard bytes.count >= 16 else {
            throw .invalidArgs("truncated message: \(bytes.count) bytes, shorter than the 16-byte header")
        }
        let needed = bytes.withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) {
                dbus_message_demarshal_bytes_needed($0.baseAddress, Int32($0.count))
            }
        }
        guard needed >= 0 else { throw .invalidArgs("not a D-Bus message: invalid header") }
        guard Int(needed) <= bytes.count else {
            throw .invalidArgs("truncated message: \(bytes.count) of \(needed) bytes")
        }
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        let raw = bytes.withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) {
                dbus_message_demarshal($0.baseAddress, Int32($0.count), &error)
            }
        }
        guard let raw else { throw DBusError(from: error, default: "cannot parse the message") }
        return Message(adopting: raw)
    }
}

extension DBusError {
    /// Turns a set libdbus error into ours.
    init(from error: CDBus.DBusError, default text: String) {
        if dbus_error_is_set(withUnsafePointer(to: error) { $0 }) != 0, let name = error.name {
            self.init(
                name: String(cString: name),
                message: error.message.map { String(cString: $0) } ?? text)
        } else {
            self = .failed(text)
        }
    }
}

extension String {
    func replacingNULs() -> String {
        utf8.contains(0) ? String(decoding: utf8.map { $0 == 0 ? UInt8(ascii: " ") : $0 }, as: UTF8.self) : self
    }
}

/// Reading and writing values through `DBusMessageIter`.
enum Marshal {
    /// Appends a validated value. Returns false only when out of memory.
    static func append(_ value: DBusValue, to iter: inout DBusMessageIter) -> Bool {
        func basic<T: BitwiseCopyable>(_ type: Int32, _ v: T) -> Bool {
            var copy = v
            return dbus_message_iter_append_basic(&iter, type, &copy) != 0
        }
        func string(_ type: Int32, _ s: String) -> Bool {
            s.withCString { p in
                var pointer: UnsafePointer<CChar>? = p
                return dbus_message_iter_append_basic(&iter, type, &pointer) != 0
            }
        }
        func container(_ type: Int32, _ signature: String?, _ body: (inout DBusMessageIter) -> Bool) -> Bool {
            var sub = DBusMessageIter()
            let opened: Bool
            if let signature {
                opened = dbus_message_iter_open_container(&iter, type, signature, &sub) != 0
            } else {
                opened = dbus_message_iter_open_container(&iter, type, nil, &sub) != 0
            }
            guard opened else { return false }
            guard body(&sub) else {
                dbus_message_iter_abandon_container(&iter, &sub)
                return false
            }
            return dbus_message_iter_close_container(&iter, &sub) != 0
        }

        switch value {
        case .byte(let v): return basic(CDBUS_TYPE_BYTE, v)
        case .bool(let v): return basic(CDBUS_TYPE_BOOLEAN, dbus_bool_t(v ? 1 : 0))
        case .int16(let v): return basic(CDBUS_TYPE_INT16, v)
        case .uint16(let v): return basic(CDBUS_TYPE_UINT16, v)
        case .int32(let v): return basic(CDBUS_TYPE_INT32, v)
        case .uint32(let v): return basic(CDBUS_TYPE_UINT32, v)
        case .int64(let v): return basic(CDBUS_TYPE_INT64, v)
        case .uint64(let v): return basic(CDBUS_TYPE_UINT64, v)
        case .double(let v): return basic(CDBUS_TYPE_DOUBLE, v)
        case .unixFD(let v): return basic(CDBUS_TYPE_UNIX_FD, v)
        case .string(let v): return string(CDBUS_TYPE_STRING, v)
        case .objectPath(let v): return string(CDBUS_TYPE_OBJECT_PATH, v.rawValue)
        case .signature(let v): return string(CDBUS_TYPE_SIGNATURE, v.rawValue)
        case .array(let element, let values):
            return container(CDBUS_TYPE_ARRAY, element.signature) { sub in
                values.allSatisfy { append($0, to: &sub) }
            }
        case .dictionary(let keyType, let valueType, let entries):
            return container(CDBUS_TYPE_ARRAY, "{" + keyType.signature + valueType.signature + "}") { sub in
                entries.allSatisfy { entry in
                    var entryIter = DBusMessageIter()
                    guard dbus_message_iter_open_container(&sub, CDBUS_TYPE_DICT_ENTRY, nil, &entryIter) != 0
                    else { return false }
                    guard append(entry.key, to: &entryIter), append(entry.value, to: &entryIter) else {
                        dbus_message_iter_abandon_container(&sub, &entryIter)
                        return false
                    }
                    return dbus_message_iter_close_container(&sub, &entryIter) != 0
                }
            }
        case .structure(let members):
            return container(CDBUS_TYPE_STRUCT, nil) { sub in
                members.allSatisfy { append($0, to: &sub) }
            }
        case .variant(let inner):
            return container(CDBUS_TYPE_VARIANT, inner.type.signature) { sub in
                append(inner, to: &sub)
            }
        }
    }

    /// Reads the value at the iterator, taking what it reads from `budget`.
    /// libdbus has validated the message, so a type code we do not know and
    /// an exhausted budget are the only failures.
    static func read(_ iter: inout DBusMessageIter, within budget: inout ReadBudget) throws(DBusError) -> DBusValue {
        func basic<T: BitwiseCopyable>(_ zero: T) -> T {
            var v = zero
            dbus_message_iter_get_basic(&iter, &v)
            return v
        }
        func text() throws(DBusError) -> String {
            var p: UnsafePointer<CChar>?
            dbus_message_iter_get_basic(&iter, &p)
            guard let p else { return "" }
            let length = strlen(p)
            try budget.take(stringOf: length)
            return String(decoding: UnsafeRawBufferPointer(start: p, count: length), as: UTF8.self)
        }
        try budget.takeValue()
        let type = dbus_message_iter_get_arg_type(&iter)
        switch type {
        case CDBUS_TYPE_BYTE: return .byte(basic(UInt8(0)))
        case CDBUS_TYPE_BOOLEAN: return .bool(basic(dbus_bool_t(0)) != 0)
        case CDBUS_TYPE_INT16: return .int16(basic(Int16(0)))
        case CDBUS_TYPE_UINT16: return .uint16(basic(UInt16(0)))
        case CDBUS_TYPE_INT32: return .int32(basic(Int32(0)))
        case CDBUS_TYPE_UINT32: return .uint32(basic(UInt32(0)))
        case CDBUS_TYPE_INT64: return .int64(basic(Int64(0)))
        case CDBUS_TYPE_UINT64: return .uint64(basic(UInt64(0)))
        case CDBUS_TYPE_DOUBLE: return .double(basic(Double(0)))
        case CDBUS_TYPE_UNIX_FD: return .unixFD(basic(Int32(-1)))
        case CDBUS_TYPE_STRING: return .string(try text())
        case CDBUS_TYPE_OBJECT_PATH: return .objectPath(try ObjectPath(validating: try text()))
        case CDBUS_TYPE_SIGNATURE: return .signature(try Signature(validating: try text()))
        case CDBUS_TYPE_ARRAY:
            guard let sigPointer = dbus_message_iter_get_signature(&iter) else { throw .noMemory() }
            let arrayType = try DBusType.parseSingle(String(cString: sigPointer))
            dbus_free(sigPointer)
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            switch arrayType {
            case .dictionary(let keyType, let valueType):
                var entries: [DBusValue.DictEntry] = []
                while dbus_message_iter_get_arg_type(&sub) == CDBUS_TYPE_DICT_ENTRY {
                    var entry = DBusMessageIter()
                    dbus_message_iter_recurse(&sub, &entry)
                    let key = try read(&entry, within: &budget)
                    dbus_message_iter_next(&entry)
                    let value = try read(&entry, within: &budget)
                    entries.append(.init(key, value))
                    dbus_message_iter_next(&sub)
                }
                return .dictionary(key: keyType, value: valueType, entries)
            case .array(let element):
                var values: [DBusValue] = []
                while dbus_message_iter_get_arg_type(&sub) != CDBUS_TYPE_INVALID {
                    values.append(try read(&sub, within: &budget))
                    dbus_message_iter_next(&sub)
                }
                return .array(element, values)
            default:
                throw .invalidArgs("array with signature '\(arrayType.signature)'")
            }
        case CDBUS_TYPE_STRUCT:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            var members: [DBusValue] = []
            while dbus_message_iter_get_arg_type(&sub) != CDBUS_TYPE_INVALID {
                members.append(try read(&sub, within: &budget))
                dbus_message_iter_next(&sub)
            }
            return .structure(members)
        case CDBUS_TYPE_VARIANT:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            return .variant(try read(&sub, within: &budget))
        default:
            throw .invalidArgs("unknown D-Bus type code \(type)")
        }
    }
}
