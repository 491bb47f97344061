import Testing

@testable import DBus

/// Puts values into a message, through the wire format and back.
func roundTrip(_ values: [DBusValue]) throws -> [DBusValue] {
    let message = try Message.methodCall(
        destination: "org.example.Peer", path: "/org/example", interface: "org.example.Iface", member: "Do")
    try message.append(values)
    let wire = try message.marshal()
    return try Message.demarshal(wire).arguments()
}

/// A message whose body holds `values`, in wire format.
func wireBytes(_ values: [DBusValue]) throws -> [UInt8] {
    let message = try Message.methodCall(
        destination: "org.example.Peer", path: "/org/example", interface: "org.example.Iface", member: "Do")
    try message.append(values)
    return try message.marshal()
}

func replacing(_ needle: [UInt8], with replacement: [UInt8], in bytes: [UInt8]) -> [UInt8] {
    precondition(needle.count == replacement.count)
    for start in 0...(bytes.count - needle.count) where Array(bytes[start..<start + needle.count]) == needle {
        var copy = bytes
        copy.replaceSubrange(start..<start + needle.count, with: replacement)
        return copy
    }
    preconditionFailure("needle not found")
}

@Suite struct RoundTrip {
    @Test func everyBasicTypeRoundTrips() throws {
        let values: [DBusValue] = [
            .byte(0), .byte(255), .bool(true), .bool(false),
            .int16(.min), .int16(.max), .uint16(.max), .int32(.min), .int32(-1), .uint32(.max),
            .int64(.min), .int64(.max), .uint64(.max), .double(-0.5), .double(1e300), .double(.infinity),
            .string(""), .string("héllo wörld ✓"), .objectPath("/"), .objectPath("/org/guidedaccess/GuidedAccess1"),
            .signature(""), .signature("a{sv}(ssss)"),
        ]
        #expect(try roundTrip(values) == values)
    }

    @Test func arraysKeepTheirElementTypeWhenEmpty() throws {
        let values: [DBusValue] = [.array(.string, []), .array(.structure([.string, .string, .string]), [])]
        let back = try roundTrip(values)
        #expect(back == values)
        #expect(back.map(\.type.signature) == ["as", "a(sss)"])
    }

    @Test func dictionariesRoundTripInOrder() throws {
        let asv = DBusValue.dictionary(
            key: .string, value: .variant,
            [
                .init(.string("time-limit"), .variant(.uint64(600))),
                .init(.string("features"), .variant(.array(.string, [.string("zoom"), .string("grayscale")]))),
                .init(.string("zoom-factor"), .variant(.double(2.5))),
                .init(.string("inhibit-sleep"), .variant(.bool(false))),
            ])
        let ass = DBusValue.dictionary(key: .string, value: .string, [.init(.string("a"), .string("b"))])
        let intKeys = DBusValue.dictionary(key: .uint32, value: .array(.byte), [.init(.uint32(7), .array(.byte, [.byte(1)]))])
        #expect(try roundTrip([asv, ass, intKeys]) == [asv, ass, intKeys])
    }

    @Test func structsAndArraysOfStructsRoundTrip() throws {
        let sss = DBusValue.structure([.string("org.example.print"), .string("Printing"), .string("")])
        let ssss = DBusValue.array(
            .structure([.string, .string, .string, .string]),
            [
                .structure([.string("a.b"), .string("A"), .string("detail"), .string("allow")]),
                .structure([.string("c.d"), .string("C"), .string(""), .string("deny")]),
            ])
        #expect(try roundTrip([sss, ssss]) == [sss, ssss])
    }

    @Test func nestedVariantsRoundTrip() throws {
        let value = DBusValue.variant(.variant(.structure([.int32(1), .variant(.array(.string, [.string("x")]))])))
        #expect(try roundTrip([value]) == [value])
    }

    @Test func typedValuesConvertBothWays() throws {
        let options: [String: Variant] = ["time-limit": Variant(UInt64(60)), "features": Variant(["zoom"])]
        let back = try roundTrip([options.dbusValue, ["a", "b"].dbusValue])
        #expect(try back[0].decode([String: Variant].self) == options)
        #expect(try back[1].decode([String].self) == ["a", "b"])
        #expect(back[0].type.signature == "a{sv}")
    }
}

@Suite struct MalformedInput {
    @Test func decodingAsTheWrongTypeNamesBothTypes() {
        #expect(throws: DBusError.invalidArgs("expected a value of type 's', got 'i'")) {
            try DBusValue.int32(3).decode(String.self)
        }
        #expect(throws: DBusError.invalidArgs("expected a value of type 'as', got 'ai'")) {
            try DBusValue.array(.int32, []).decode([String].self)
        }
    }

    @Test func aBodyOfTheWrongSignatureIsInvalidArgs() throws {
        let message = try Message.methodCall(destination: nil, path: "/a", interface: nil, member: "M")
        try message.append([.int32(1), .string("x")])
        #expect(throws: DBusError.invalidArgs("expected arguments of type 'ss', got 'is'")) {
            try message.arguments(expecting: "ss")
        }
    }

    @Test func aTruncatedMessageIsRejected() throws {
        let bytes = try wireBytes([.array(.string, [.string("one"), .string("two"), .string("three")])])
        for cut in [1, 5, 12, bytes.count / 2] {
            let error = #expect(throws: DBusError.self) { try Message.demarshal(Array(bytes.dropLast(cut))) }
            #expect(error?.name == "org.freedesktop.DBus.Error.InvalidArgs")
        }
    }

    @Test func aContainerLongerThanTheBodyIsRejected() throws {
        // The array's length field (just after the 16-byte fixed header and
        // the header fields) claims more bytes than the body has.
        let bytes = try wireBytes([.array(.uint32, [.uint32(0xAAAA_AAAA)])])
        let patched = replacing([4, 0, 0, 0, 0xAA, 0xAA, 0xAA, 0xAA], with: [64, 0, 0, 0, 0xAA, 0xAA, 0xAA, 0xAA], in: bytes)
        let error = #expect(throws: DBusError.self) { try Message.demarshal(patched) }
        #expect(error?.message.isEmpty == false)
    }

    @Test func invalidUTF8IsRejected() throws {
        let bytes = try wireBytes([.string("abcd")])
        let patched = replacing(Array("abcd".utf8), with: [0x61, 0xFF, 0xFE, 0x64], in: bytes)
        let error = #expect(throws: DBusError.self) { try Message.demarshal(patched) }
        #expect(error?.name == "org.freedesktop.DBus.Error.InvalidArgs")
    }

    @Test func aBadObjectPathOnTheWireIsRejected() throws {
        let bytes = try wireBytes([.objectPath("/abc/def")])
        let patched = replacing(Array("/abc/def".utf8), with: Array("/abc//ef".utf8), in: bytes)
        #expect(throws: DBusError.self) { try Message.demarshal(patched) }
    }

    @Test func badObjectPathsAreRefusedByName() {
        for path in ["", "a", "/a/", "//", "/a//b", "/a-b", "/a.b", "/é"] {
            #expect(throws: DBusError.invalidArgs("'\(path)' is not a valid object path")) {
                try ObjectPath(validating: path)
            }
        }
        for path in ["/", "/a", "/a/b_c/D9"] {
            #expect((try? ObjectPath(validating: path)) != nil)
        }
    }

    @Test func badSignaturesAreRefusedWithAReason() {
        let cases: [(String, String)] = [
            ("a", "ends inside a container"),
            ("(", "unclosed struct"),
            ("()", "empty struct"),
            ("a{vs}", "dictionary key 'v' is not a basic type"),
            ("a{sss}", "dictionary entry must hold exactly two types"),
            ("{ss}", "dictionary entry outside an array"),
            ("z", "unknown type code 'z'"),
            (String(repeating: "a", count: 33) + "s", "arrays nested deeper than 32"),
        ]
        for (signature, reason) in cases {
            #expect(throws: DBusError.invalidArgs("invalid signature '\(signature)': \(reason)")) {
                try Signature(validating: signature)
            }
        }
        #expect(throws: DBusError.self) { try Signature(validating: String(repeating: "s", count: 256)) }
    }

    @Test func aStringWithANulByteIsRefusedAndTheMessageStaysUnchanged() throws {
        let message = try Message.methodCall(destination: nil, path: "/a", interface: nil, member: "M")
        try message.append([.string("kept")])
        #expect(throws: DBusError.invalidArgs("string \"a\\0b\" contains a NUL byte")) {
            try message.append([.int32(1), .string("a\0b")])
        }
        #expect(message.signature == "s")
        #expect(try message.arguments() == [.string("kept")])
    }

    @Test func containersMustHoldTheirDeclaredTypes() {
        #expect(throws: DBusError.self) { try DBusValue.array(.string, [.int32(1)]).validate() }
        #expect(throws: DBusError.self) {
            try DBusValue.dictionary(key: .string, value: .variant, [.init(.string("k"), .string("v"))]).validate()
        }
        #expect(throws: DBusError.self) { try DBusValue.dictionary(key: .variant, value: .string, []).validate() }
        #expect(throws: DBusError.self) { try DBusValue.structure([]).validate() }
    }

    @Test func namesAreChecked() {
        #expect(DBusNames.isValidInterface("org.guidedaccess.GuidedAccess1"))
        #expect(!DBusNames.isValidInterface("org"))
        #expect(!DBusNames.isValidInterface("org..x"))
        #expect(!DBusNames.isValidInterface("org.9x"))
        #expect(DBusNames.isValidMember("StartSession"))
        #expect(!DBusNames.isValidMember("Start.Session"))
        #expect(DBusNames.isValidBusName(":1.42"))
        #expect(DBusNames.isValidBusName("org.guidedaccess.GuidedAccess1"))
        #expect(!DBusNames.isValidBusName("org.1guided"))
        #expect(throws: DBusError.self) {
            try Message.methodCall(destination: "not a name", path: "/", interface: nil, member: "M")
        }
    }
}

/// `(ssss)`, as the element of a list of restrictions.
struct Item: DBusRepresentable {
    var fields: [String]
    static var dbusType: DBusType { .structure([.string, .string, .string, .string]) }
    var dbusValue: DBusValue { .structure(fields.map { .string($0) }) }
    init(dbusValue v: DBusValue) throws(DBusError) {
        guard case .structure(let members) = v, members.count == 4 else { throw .invalidArgs("not an item") }
        fields = []
        for member in members { fields.append(try String(dbusValue: member)) }
    }
}

@Suite struct Declarations {
    let interface = Interface(
        "org.example.Thing1",
        methods: [
            Method("Start", Argument("options", [String: Variant].self)) { _, _ in },
            Method("List", returns: Argument("items", [Item].self)) { _ in [] },
        ],
        properties: [
            Property("Active", Bool.self) { false },
            Property("Version", String.self, changes: .constant) { "1" },
            Property("Name", String.self, get: { "" }, set: { _, _ in }),
        ],
        signals: [Signal("Changed", Argument("active", Bool.self), Argument("reason", String.self))])

    @Test func introspectionListsEveryMemberWithItsSignature() {
        let xml = Introspection.xml(interfaces: [interface], children: ["child"])
        #expect(xml.hasPrefix("<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\""))
        #expect(
            xml.contains(
                "<method name=\"Start\">\n      <annotation name=\"org.qtproject.QtDBus.QtTypeName.In0\" value=\"QVariantMap\"/>\n"
                    + "      <arg type=\"a{sv}\" name=\"options\" direction=\"in\"/>"))
        #expect(xml.contains("<arg type=\"a(ssss)\" name=\"items\" direction=\"out\"/>"))
        #expect(xml.contains("<property name=\"Active\" type=\"b\" access=\"read\"/>"))
        #expect(xml.contains("<property name=\"Name\" type=\"s\" access=\"readwrite\"/>"))
        #expect(xml.contains("name=\"org.freedesktop.DBus.Property.EmitsChangedSignal\" value=\"const\""))
        #expect(xml.contains("<signal name=\"Changed\">\n      <arg type=\"b\" name=\"active\"/>"))
        #expect(xml.contains("<node name=\"child\"/>"))
        #expect(xml.contains("<interface name=\"org.freedesktop.DBus.Properties\">"))
    }

    /// The whole text, as it was when signatures were written out as
    /// strings (deriving them from the types changes no byte of it), with
    /// Qt's type names for the containers qdbusxml2cpp does not know.
    @Test func introspectionOfTheDeclarationIsByteForByteTheSame() {
        let xml = Introspection.xml(interfaces: [interface], children: ["child"])
        let expected = """
              <interface name="org.example.Thing1">
                <method name="Start">
                  <annotation name="org.qtproject.QtDBus.QtTypeName.In0" value="QVariantMap"/>
                  <arg type="a{sv}" name="options" direction="in"/>
                </method>
                <method name="List">
                  <annotation name="org.qtproject.QtDBus.QtTypeName.Out0" value="QDBusArgument"/>
                  <arg type="a(ssss)" name="items" direction="out"/>
                </method>
                <signal name="Changed">
                  <arg type="b" name="active"/>
                  <arg type="s" name="reason"/>
                </signal>
                <property name="Active" type="b" access="read"/>
                <property name="Version" type="s" access="read">
                  <annotation name="org.freedesktop.DBus.Property.EmitsChangedSignal" value="const"/>
                </property>
                <property name="Name" type="s" access="readwrite"/>
              </interface>
              <node name="child"/>
            </node>

            """
        #expect(xml == Introspection.header + "<node>\n" + Introspection.standardInterfaces + expected)
    }

    /// Documentation is `org.gtk.GDBus.DocString` annotations, first in
    /// each element, its line breaks kept through attribute normalisation;
    /// `introspectionDocument` is the interface alone, as installed.
    @Test func documentationBecomesDocStringAnnotations() {
        let documented = Interface(
            "org.example.Thing1",
            documentation: ["": "A thing.", "Stop": "Stops <it>.\nAt\tonce.", "Active": "Whether \"on\"."],
            methods: [Method("Stop") { _ in }, Method("Go") { _ in }],
            properties: [Property("Active", Bool.self) { false }])
        let expected = """
            <node>
              <interface name="org.example.Thing1">
                <annotation name="org.gtk.GDBus.DocString" value="A thing."/>
                <method name="Stop">
                  <annotation name="org.gtk.GDBus.DocString" value="Stops &lt;it&gt;.&#10;At&#9;once."/>
                </method>
                <method name="Go"/>
                <property name="Active" type="b" access="read">
                  <annotation name="org.gtk.GDBus.DocString" value="Whether &quot;on&quot;."/>
                </property>
              </interface>
            </node>

            """
        #expect(documented.introspectionDocument == Introspection.header + expected)
    }

    @Test func signaturesDeriveFromTheDeclaration() {
        #expect(interface.method("Start")?.inputSignature == "a{sv}")
        #expect(interface.method("List")?.outputSignature == "a(ssss)")
        #expect(interface.signal("Changed")?.signature == "bs")
        #expect(interface.property("Name")?.isWritable == true)
    }

    @Test func matchRulesQuoteTheirValues() {
        #expect(
            MatchRule.nameOwnerChanged(for: ":1.5").description
                == "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0=':1.5'"
        )
        #expect(MatchRule(member: "It's").description == "type='signal',member='It'\\''s'")
    }

    @Test func theSystemdUnitIsTheFirstUnitOfTheCgroupPath() {
        #expect(ProcessInfo.systemdUnit(fromCgroupFile: "0::/system.slice/kiosk-app.service\n") == "kiosk-app.service")
        #expect(ProcessInfo.systemdUnit(fromCgroupFile: "0::/user.slice/user-1000.slice/session-3.scope\n") == "session-3.scope")
        #expect(ProcessInfo.systemdUnit(fromCgroupFile: "0::/init.scope\n") == "init.scope")
        #expect(ProcessInfo.systemdUnit(fromCgroupFile: "0::/\n") == nil)
        #expect(ProcessInfo.systemdUnit(fromCgroupFile: "12:name=systemd:/system.slice/a.service\n") == "a.service")
        #expect(ProcessInfo.systemdUnit(fromCgroupFile: "0::/system.slice/_cpu.service\n") == "cpu.service")
        #expect(ProcessInfo.systemdUnit(fromCgroupFile: "0::/machine/qemu-1\n") == nil)
    }

    @Test func aUsersOwnUnitsAreTheirUserManagersSystemUnit() {
        // What a user makes in its delegated subtree cannot pass for a system unit.
        #expect(
            ProcessInfo.systemdUnit(
                fromCgroupFile: "0::/user.slice/user-65534.slice/user@65534.service/app.slice/kiosk-app.service\n")
                == "user@65534.service")
        #expect(
            ProcessInfo.systemdUnit(fromCgroupFile: "0::/system.slice/builder.service/payload/kiosk-app.service\n")
                == "builder.service")
    }
}
