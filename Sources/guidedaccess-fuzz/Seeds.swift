import CDBus
import DBus
import Glibc
import GuidedAccessWire

/// The seed corpus: each of the service's calls as a client marshals it and
/// the bus delivers it (a sender, a serial), a few the checks refuse, the
/// standard interfaces' calls, and the other kinds of message a connection
/// reads (a reply, an error, the service's and the bus's signals). Written
/// with the types the service and the client use, so the corpus follows the
/// API; committed under Sources/guidedaccess-fuzz/corpus.
enum Seeds {
    static func write(to directory: String, dictionary: String) throws {
        mkdir(directory, 0o755)
        for (name, message) in try messages() {
            try Files.write(try delivered(message), to: "\(directory)/\(name)")
        }
        for (name, bytes) in DevToolsStream.seeds() { try Files.write(bytes, to: "\(directory)/\(name)") }
        try Files.write(Array(dictionaryText().utf8), to: dictionary)
    }

    static let service = GuidedAccessBus.name
    static let path = GuidedAccessBus.objectPath
    static let interface = GuidedAccessBus.interface

    static func call(_ member: String, interface: String = Seeds.interface, _ values: [DBusValue] = []) throws -> Message {
        let message = try Message.methodCall(destination: service, path: path, interface: interface, member: member)
        try message.append(values)
        return message
    }

    static func options(_ entries: [String: Variant]) -> DBusValue { entries.dbusValue }

    static func messages() throws -> [(String, Message)] {
        let properties = "org.freedesktop.DBus.Properties"
        let payments = "org.example.kiosk.payments"
        var seeds: [(String, Message)] = [
            ("StartSession-empty", try call("StartSession", [options([:])])),
            ("StartSession-all-options", try call("StartSession", [options([
                "features": Variant(["screen-reader", "zoom", "large-text"]),
                "time-limit": Variant(UInt64(600)), "zoom-factor": Variant(3.0), "text-scale": Variant(1.5),
                "inhibit-sleep": Variant(false),
            ])])),
            ("StartSession-unknown-feature", try call("StartSession", [options(["features": Variant(["teleport"])])])),
            ("StartSession-wrong-type", try call("StartSession", [options(["zoom-factor": Variant("big")])])),
            ("StartSession-out-of-range", try call("StartSession", [options(["time-limit": Variant(UInt64.max)])])),
            ("StartSession-nested-variant", try call("StartSession", [options([
                "features": Variant(.variant(.variant(.array(.string, [.string("zoom")])))),
            ])])),
            ("EndSession", try call("EndSession")),
            ("ConfigureForSession-on", try call("ConfigureForSession", [["invert-colors"].dbusValue, .bool(true)])),
            ("ConfigureForSession-off", try call(
                "ConfigureForSession", [["grayscale", "reduce-motion"].dbusValue, .bool(false)])),
            ("ConfigureForSession-empty", try call("ConfigureForSession", [[String]().dbusValue, .bool(true)])),
            ("ConfigureForSession-unknown", try call("ConfigureForSession", [["zoom", "x-ray"].dbusValue, .bool(true)])),
            ("RegisterRestrictions", try call("RegisterRestrictions", [[
                RestrictionRegistration(identifier: payments, text: "Payments"),
                RestrictionRegistration(identifier: "org.example.kiosk.camera", text: "Camera", detail: "Photos"),
            ].dbusValue])),
            ("RegisterRestrictions-bad-identifier", try call("RegisterRestrictions", [[
                RestrictionRegistration(identifier: "no spaces/allowed", text: "Bad"),
            ].dbusValue])),
            // Past the bounds the dispatcher reads within (CallBounds).
            ("ConfigureForSession-past-bounds", try call(
                "ConfigureForSession", [(Feature.allCases.map(\.rawValue) + ["zoom"]).dbusValue, .bool(true)])),
            ("RegisterRestrictions-past-bounds", try call("RegisterRestrictions", [[
                RestrictionRegistration(
                    identifier: payments, text: "Payments",
                    detail: String(repeating: "d", count: RestrictionRegistration.maxDetailBytes + 1)),
            ].dbusValue])),
            ("UnregisterRestrictions", try call("UnregisterRestrictions", [[payments].dbusValue])),
            ("SetRestrictionState-deny", try call("SetRestrictionState", [.string(payments), .string("deny")])),
            ("SetRestrictionState-bad-state", try call("SetRestrictionState", [.string(payments), .string("maybe")])),
            ("GetRestrictionState", try call("GetRestrictionState", [.string(payments)])),
            ("ListRestrictions", try call("ListRestrictions")),
            ("Properties-Get", try call("Get", interface: properties, [.string(interface), .string("SessionActive")])),
            ("Properties-GetAll", try call("GetAll", interface: properties, [.string(interface)])),
            ("Properties-Set", try call(
                "Set", interface: properties, [.string(interface), .string("SessionActive"), .variant(.bool(true))])),
            ("Introspect", try call("Introspect", interface: "org.freedesktop.DBus.Introspectable")),
            ("Ping", try call("Ping", interface: "org.freedesktop.DBus.Peer")),
        ]
        // Found by the check that what libdbus accepts reads: signatures
        // within libdbus's limits that the DBus layer's parser refused
        // (arrays between structs, dict entries counted as structs).
        var arraysBetweenStructs = DBusType.array(.array(.byte))
        for _ in 0..<31 { arraysBetweenStructs = .array(.structure([arraysBetweenStructs])) }
        var dictsAndStructs = DBusType.byte
        for _ in 0..<16 { dictsAndStructs = .structure([dictsAndStructs]) }
        for _ in 0..<16 { dictsAndStructs = .dictionary(key: .string, value: dictsAndStructs) }
        seeds.append((
            "signature-arrays-between-structs",
            try call("ConfigureForSession", [.array(.structure([arraysBetweenStructs]), [])])))
        seeds.append((
            "signature-dicts-and-structs",
            try call("ConfigureForSession", [.dictionary(key: .string, value: dictsAndStructs, [])])))
        // What a connection reads besides calls: a reply, an error, signals.
        let list = try call("ListRestrictions")
        _ = try list.marshal()  // gives it a serial, as sending does: libdbus replies only to one that has it
        let reply = try list.makeReturn()
        try reply.append([[Restriction(identifier: payments, text: "Payments", detail: "", state: .deny)].dbusValue])
        seeds.append(("reply-ListRestrictions", reply))
        seeds.append(("error-NotInSession", try list.makeError(DBusError(
            name: GuidedAccessBus.errorPrefix + "NotInSession", message: "no session is active"))))
        let changed = try Message.signal(path: path, interface: interface, member: "SessionChanged")
        try changed.append([.bool(true), .string("started")])
        seeds.append(("signal-SessionChanged", changed))
        let owner = try Message.signal(
            path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged")
        try owner.append([.string(":1.42"), .string(":1.42"), .string("")])
        seeds.append(("signal-NameOwnerChanged", owner))
        return seeds
    }

    /// The message as the bus daemon passes it on: with the sender's unique
    /// name and a serial.
    static func delivered(_ message: Message) throws -> [UInt8] {
        let bytes = try message.marshal()
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        guard let raw = bytes.withUnsafeBufferPointer({ buffer in
            buffer.withMemoryRebound(to: CChar.self) { dbus_message_demarshal($0.baseAddress, Int32($0.count), &error) }
        }) else { throw DBusError.failed("cannot parse a seed") }
        defer { dbus_message_unref(raw) }
        let sender = message.kind == .signal && message.path == "/org/freedesktop/DBus" ? "org.freedesktop.DBus" : ":1.42"
        dbus_message_set_sender(raw, sender)
        dbus_message_set_serial(raw, 7)
        var buffer: UnsafeMutablePointer<CChar>?
        var length: Int32 = 0
        guard dbus_message_marshal(raw, &buffer, &length) != 0, let buffer else { throw DBusError.noMemory() }
        defer { dbus_free(buffer) }
        return buffer.withMemoryRebound(to: UInt8.self, capacity: Int(length)) {
            Array(UnsafeBufferPointer(start: $0, count: Int(length)))
        }
    }

    /// Words libFuzzer may splice into inputs: names it cannot find by
    /// comparing bytes, since Swift compares strings in its own code.
    static func dictionaryText() -> String {
        var words = [GuidedAccessBus.name, GuidedAccessBus.path, GuidedAccessBus.interface, GuidedAccessBus.errorPrefix]
        words += ["org.freedesktop.DBus.Properties", "org.freedesktop.DBus.Introspectable", "org.freedesktop.DBus.Peer"]
        words += ["Get", "GetAll", "Set", "Introspect", "Ping", "GetMachineId", "NameOwnerChanged", "org.freedesktop.DBus"]
        words += GuidedAccessMethod.allCases.map(\.rawValue) + GuidedAccessProperty.allCases.map(\.rawValue)
        words += GuidedAccessSignal.allCases.map(\.rawValue) + Feature.allCases.map(\.rawValue)
        words += SessionOptionKey.allCases.map(\.rawValue) + RestrictionState.allCases.map(\.rawValue)
        words += ["org.example.kiosk.payments", "a{sv}", "a(sss)", "a(ssss)", "asb", "ss", "ssv", "(sss)", "as", "v"]
        words += DevToolsStream.words
        return "# libFuzzer dictionary, written by guidedaccess-fuzz --write-seeds\n"
            + words.reduce(into: [String]()) { if !$0.contains($1) { $0.append($1) } }.map { "\"\($0)\"\n" }.joined()
    }
}

/// The few file operations the program needs, on Glibc (no Foundation).
enum Files {
    /// FILE itself, or the regular files in DIR, sorted.
    static func list(_ path: String) -> [String] {
        guard let dir = opendir(path) else { return [path] }
        defer { closedir(dir) }
        var files: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if entry.pointee.d_type == DT_REG { files.append("\(path)/\(name)") }
        }
        return files.sorted()
    }

    static func read(_ path: String) -> [UInt8]? {
        guard let file = fopen(path, "rb") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&chunk, 1, chunk.count, file)
            bytes += chunk[0..<n]
            if n < chunk.count { return ferror(file) == 0 ? bytes : nil }
        }
    }

    static func write(_ bytes: [UInt8], to path: String) throws {
        guard let file = fopen(path, "wb") else { throw DBusError.failed("cannot create \(path)") }
        defer { fclose(file) }
        guard fwrite(bytes, 1, bytes.count, file) == bytes.count else { throw DBusError.failed("cannot write \(path)") }
    }
}
