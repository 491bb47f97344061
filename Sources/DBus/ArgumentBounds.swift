import CDBus

/// The most one argument of a method call may carry.
///
/// A handler receives its arguments decoded, and decoded they cost many times
/// their bytes on the wire (a short string in an array: some 100 bytes as a
/// `DBusValue` and a `String`), so a call of a few megabytes could take a
/// hundred. A method declares what its arguments can hold at most — the
/// API's own limits — and the dispatcher checks it while it reads, before it
/// decodes: a call that carries more gets an error naming the argument, what
/// it carries and the bound, and costs little more than libdbus's copy of
/// the message. Each bound must admit every call the API allows.
public struct ArgumentBounds: Hashable, Sendable {
    /// Elements of the argument itself when it is an array or a dictionary,
    /// counted on the wire before any is read.
    public var elements: Int
    /// The error name of a call with more than `elements`: InvalidArgs,
    /// unless the API gives that limit an error of its own.
    public var elementsErrorName: String
    /// Bytes of each string in the argument (object paths and signatures too).
    public var stringBytes: Int
    /// Values in the argument at any depth, itself included: the bound of
    /// what a variant holds, whose type the declaration cannot know.
    public var values: Int

    public init(
        elements: Int = .max, elementsErrorName: String = DBusError.invalidArgs("").name,
        stringBytes: Int = .max, values: Int = .max
    ) {
        precondition(elements >= 0 && stringBytes >= 0 && values >= 1, "bounds must admit some argument")
        self.elements = elements
        self.elementsErrorName = elementsErrorName
        self.stringBytes = stringBytes
        self.values = values
    }

    /// No bound beyond libdbus's own (the bus's maximum message size).
    public static let none = ArgumentBounds()

    /// Reads the argument at `iter` within these bounds; an error names
    /// `argument` of `member`.
    func read(_ iter: inout DBusMessageIter, argument: String, of member: String) throws(DBusError) -> DBusValue {
        if elements < .max, dbus_message_iter_get_arg_type(&iter) == CDBUS_TYPE_ARRAY {
            let count = Int(dbus_message_iter_get_element_count(&iter))
            guard count <= elements else {
                throw DBusError(
                    name: elementsErrorName,
                    message: "\(member) argument '\(argument)': \(count) elements, more than the \(elements) allowed")
            }
        }
        var budget = ReadBudget(values: values, stringBytes: stringBytes)
        do {
            return try Marshal.read(&iter, within: &budget)
        } catch {
            throw DBusError(name: error.name, message: "\(member) argument '\(argument)': \(error.message)")
        }
    }
}

/// What a read may still take: a number of values, and strings of at most
/// so many bytes each.
struct ReadBudget {
    private let valueLimit: Int
    private var valuesLeft: Int
    let stringBytes: Int

    init(values: Int, stringBytes: Int) {
        valueLimit = values
        valuesLeft = values
        self.stringBytes = stringBytes
    }

    static let unlimited = ReadBudget(values: .max, stringBytes: .max)

    mutating func takeValue() throws(DBusError) {
        guard valuesLeft > 0 else { throw .invalidArgs("more than the \(valueLimit) values allowed") }
        valuesLeft -= 1
    }

    func take(stringOf length: Int) throws(DBusError) {
        guard length <= stringBytes else {
            throw .invalidArgs("a string of \(length) bytes, more than the \(stringBytes) allowed")
        }
    }
}

extension Message {
    /// The arguments of a call to `method`: its signature checked, then each
    /// argument read within the bounds its declaration gives. Public for the
    /// fuzzer (Sources/guidedaccess-fuzz), which reads calls as the
    /// dispatcher does.
    public func arguments(of method: Method) throws(DBusError) -> [DBusValue] {
        try check(signature: method.inputSignature)
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(raw, &iter) != 0 else { return [] }
        var values: [DBusValue] = []
        for input in method.inputs {
            values.append(try input.bounds.read(&iter, argument: input.name, of: method.name))
            dbus_message_iter_next(&iter)
        }
        return values
    }
}
