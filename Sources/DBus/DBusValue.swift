import Glibc

/// One D-Bus value of any type. Containers carry their element types so that
/// empty arrays and dictionaries keep their signature.
public indirect enum DBusValue: Hashable, Sendable {
    case byte(UInt8)
    case bool(Bool)
    case int16(Int16)
    case uint16(UInt16)
    case int32(Int32)
    case uint32(UInt32)
    case int64(Int64)
    case uint64(UInt64)
    case double(Double)
    case string(String)
    case objectPath(ObjectPath)
    case signature(Signature)
    /// A file descriptor. A received one is a new descriptor the receiver owns
    /// and must close (an exported object's method call: the dispatcher
    /// closes it after the handler; see `UnixFD`).
    case unixFD(Int32)
    case array(DBusType, [DBusValue])
    case dictionary(key: DBusType, value: DBusType, [DictEntry])
    case structure([DBusValue])
    case variant(DBusValue)

    public struct DictEntry: Hashable, Sendable {
        public var key: DBusValue
        public var value: DBusValue
        public init(_ key: DBusValue, _ value: DBusValue) {
            self.key = key
            self.value = value
        }
    }

    /// The value's complete type.
    public var type: DBusType {
        switch self {
        case .byte: return .byte
        case .bool: return .bool
        case .int16: return .int16
        case .uint16: return .uint16
        case .int32: return .int32
        case .uint32: return .uint32
        case .int64: return .int64
        case .uint64: return .uint64
        case .double: return .double
        case .string: return .string
        case .objectPath: return .objectPath
        case .signature: return .signature
        case .unixFD: return .unixFD
        case .array(let element, _): return .array(element)
        case .dictionary(let key, let value, _): return .dictionary(key: key, value: value)
        case .structure(let members): return .structure(members.map { $0.type })
        case .variant: return .variant
        }
    }

    /// Checks what libdbus would otherwise abort the process for: strings
    /// with NUL bytes, container elements of another type than declared,
    /// empty structs, non-basic dict keys, nesting deeper than the spec's 32
    /// levels, and variant signatures over 255 bytes.
    public func validate() throws(DBusError) {
        try validate(depth: 0)
    }

    private func validate(depth: Int) throws(DBusError) {
        guard depth <= 64 else { throw .invalidArgs("value nested deeper than 64 containers") }
        switch self {
        case .string(let s):
            guard !s.utf8.contains(0) else {
                throw .invalidArgs("string \(String(reflecting: s)) contains a NUL byte")
            }
        case .array(let element, let values):
            for v in values {
                guard v.type == element else {
                    throw .invalidArgs(
                        "array of '\(element.signature)' holds an element of type '\(v.type.signature)'")
                }
                try v.validate(depth: depth + 1)
            }
        case .dictionary(let keyType, let valueType, let entries):
            guard keyType.isBasic else {
                throw .invalidArgs("dictionary key type '\(keyType.signature)' is not basic")
            }
            for e in entries {
                guard e.key.type == keyType, e.value.type == valueType else {
                    throw .invalidArgs(
                        "dictionary 'a{\(keyType.signature)\(valueType.signature)}' holds an entry of types '\(e.key.type.signature)', '\(e.value.type.signature)'"
                    )
                }
                try e.key.validate(depth: depth + 1)
                try e.value.validate(depth: depth + 1)
            }
        case .structure(let members):
            guard !members.isEmpty else { throw .invalidArgs("a struct must have at least one member") }
            for m in members { try m.validate(depth: depth + 1) }
        case .variant(let inner):
            guard inner.type.signature.utf8.count <= 255 else {
                throw .invalidArgs("variant signature longer than 255 bytes")
            }
            try inner.validate(depth: depth + 1)
        default:
            break
        }
        // Containers: check the spec's limits on the whole signature once.
        if depth == 0, !type.isBasic {
            _ = try DBusType.parse(signature: type.signature)
        }
    }
}

extension DBusValue: CustomStringConvertible {
    public var description: String {
        switch self {
        case .byte(let v): return String(v)
        case .bool(let v): return String(v)
        case .int16(let v): return String(v)
        case .uint16(let v): return String(v)
        case .int32(let v): return String(v)
        case .uint32(let v): return String(v)
        case .int64(let v): return String(v)
        case .uint64(let v): return String(v)
        case .double(let v): return String(v)
        case .string(let v): return String(reflecting: v)
        case .objectPath(let v): return v.rawValue
        case .signature(let v): return v.rawValue
        case .unixFD(let v): return "fd \(v)"
        case .array(_, let values): return "[" + values.map { $0.description }.joined(separator: ", ") + "]"
        case .dictionary(_, _, let entries):
            return "{" + entries.map { "\($0.key): \($0.value)" }.joined(separator: ", ") + "}"
        case .structure(let members): return "(" + members.map { $0.description }.joined(separator: ", ") + ")"
        case .variant(let inner): return "<\(inner)>"
        }
    }
}

// MARK: - Typed conversion

/// A Swift type with a fixed D-Bus type.
public protocol DBusRepresentable: Sendable {
    static var dbusType: DBusType { get }
    var dbusValue: DBusValue { get }
    /// Throws InvalidArgs naming the expected and the actual type.
    init(dbusValue: DBusValue) throws(DBusError)
}

extension DBusValue {
    /// Decodes the value as `T`, or throws InvalidArgs naming both types.
    public func decode<T: DBusRepresentable>(_: T.Type = T.self) throws(DBusError) -> T {
        try T(dbusValue: self)
    }
}

func typeMismatch(_ expected: DBusType, _ got: DBusValue) -> DBusError {
    .invalidArgs("expected a value of type '\(expected.signature)', got '\(got.type.signature)'")
}

extension Bool: DBusRepresentable {
    public static var dbusType: DBusType { .bool }
    public var dbusValue: DBusValue { .bool(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .bool(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension UInt8: DBusRepresentable {
    public static var dbusType: DBusType { .byte }
    public var dbusValue: DBusValue { .byte(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .byte(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension Int16: DBusRepresentable {
    public static var dbusType: DBusType { .int16 }
    public var dbusValue: DBusValue { .int16(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .int16(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension UInt16: DBusRepresentable {
    public static var dbusType: DBusType { .uint16 }
    public var dbusValue: DBusValue { .uint16(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .uint16(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension Int32: DBusRepresentable {
    public static var dbusType: DBusType { .int32 }
    public var dbusValue: DBusValue { .int32(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .int32(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension UInt32: DBusRepresentable {
    public static var dbusType: DBusType { .uint32 }
    public var dbusValue: DBusValue { .uint32(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .uint32(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension Int64: DBusRepresentable {
    public static var dbusType: DBusType { .int64 }
    public var dbusValue: DBusValue { .int64(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .int64(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension UInt64: DBusRepresentable {
    public static var dbusType: DBusType { .uint64 }
    public var dbusValue: DBusValue { .uint64(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .uint64(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension Double: DBusRepresentable {
    public static var dbusType: DBusType { .double }
    public var dbusValue: DBusValue { .double(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .double(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension String: DBusRepresentable {
    public static var dbusType: DBusType { .string }
    public var dbusValue: DBusValue { .string(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .string(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension ObjectPath: DBusRepresentable {
    public static var dbusType: DBusType { .objectPath }
    public var dbusValue: DBusValue { .objectPath(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .objectPath(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

extension Signature: DBusRepresentable {
    public static var dbusType: DBusType { .signature }
    public var dbusValue: DBusValue { .signature(self) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .signature(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        self = x
    }
}

/// A file descriptor passed in a method call (`h`), lent to the handler:
/// the dispatcher closes what a call carried once its handler returns, so
/// a handler that keeps one dups it (`duplicate()`), and a call refused
/// before or by its handler leaks none.
public struct UnixFD: DBusRepresentable, Hashable {
    public let rawValue: Int32
    public init(_ rawValue: Int32) { self.rawValue = rawValue }
    public static var dbusType: DBusType { .unixFD }
    public var dbusValue: DBusValue { .unixFD(rawValue) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .unixFD(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        rawValue = x
    }

    /// A descriptor of the handler's own for the same file (close-on-exec);
    /// nil when the process has no descriptor left.
    public func duplicate() -> Int32? {
        let fd = fcntl(rawValue, F_DUPFD_CLOEXEC, 0)
        return fd >= 0 ? fd : nil
    }

    /// Closes a descriptor a peer passed without waiting: a socket the peer
    /// set to linger (`SO_LINGER`) would otherwise hold the last `close`
    /// — the loop's thread — until its unsent data went or the linger time
    /// passed. Linger belongs to the socket: turned off just before the
    /// close, it cannot be turned on again by a peer whose own copy is
    /// closed (and while the peer's copy is open, this close is not the last).
    public static func close(_ fd: Int32) {
        guard fd >= 0 else { return }
        defuseLinger(fd)
        Glibc.close(fd)
    }

    /// Turns `SO_LINGER` off (nothing for a descriptor that is not a socket).
    public static func defuseLinger(_ fd: Int32) {
        var off = linger(l_onoff: 0, l_linger: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_LINGER, &off, socklen_t(MemoryLayout<linger>.size))
    }
}

extension DBusValue {
    /// Closes every descriptor in the value (received ones are the receiver's).
    func closeDescriptors() {
        switch self {
        case .unixFD(let fd): UnixFD.close(fd)
        case .array(_, let values), .structure(let values): for value in values { value.closeDescriptors() }
        case .dictionary(_, _, let entries):
            for entry in entries {
                entry.key.closeDescriptors()
                entry.value.closeDescriptors()
            }
        case .variant(let value): value.closeDescriptors()
        default: break
        }
    }
}

/// A variant: a value that carries its own type (`v`).
public struct Variant: DBusRepresentable, Hashable {
    public var value: DBusValue
    public init(_ value: DBusValue) { self.value = value }
    public init<T: DBusRepresentable>(_ value: T) { self.value = value.dbusValue }
    public static var dbusType: DBusType { .variant }
    public var dbusValue: DBusValue { .variant(value) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .variant(let x) = v else { throw typeMismatch(Self.dbusType, v) }
        value = x
    }
}

extension Array: DBusRepresentable where Element: DBusRepresentable {
    public static var dbusType: DBusType { .array(Element.dbusType) }
    public var dbusValue: DBusValue { .array(Element.dbusType, map { $0.dbusValue }) }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .array(let element, let values) = v, element == Element.dbusType else {
            throw typeMismatch(Self.dbusType, v)
        }
        var result: [Element] = []
        result.reserveCapacity(values.count)
        for value in values { result.append(try Element(dbusValue: value)) }
        self = result
    }
}

extension Dictionary: DBusRepresentable where Key: DBusRepresentable, Value: DBusRepresentable {
    public static var dbusType: DBusType { .dictionary(key: Key.dbusType, value: Value.dbusType) }
    /// Entries are sorted by their keys' text so the wire form is stable.
    public var dbusValue: DBusValue {
        let entries = map { DBusValue.DictEntry($0.key.dbusValue, $0.value.dbusValue) }
            .sorted { $0.key.description < $1.key.description }
        return .dictionary(key: Key.dbusType, value: Value.dbusType, entries)
    }
    public init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .dictionary(let k, let val, let entries) = v, k == Key.dbusType, val == Value.dbusType
        else { throw typeMismatch(Self.dbusType, v) }
        var result: [Key: Value] = [:]
        for e in entries {
            result[try Key(dbusValue: e.key)] = try Value(dbusValue: e.value)
        }
        self = result
    }
}
