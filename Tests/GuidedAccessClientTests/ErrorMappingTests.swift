import DBus
import Testing

@testable import GuidedAccessClient

@Suite struct ErrorMappingTests {
    static let fd = "org.freedesktop.DBus.Error."

    /// Every error of the API, once; the switch fails to compile when
    /// `GuidedAccessError` gains a case, so that it is added here.
    static let allErrors: [GuidedAccessError] = {
        let errors: [GuidedAccessError] = [
            .invalidArgs("m"), .notAuthorized("m"), .interactiveAuthorizationRequired("m"), .notInSession("m"),
            .sessionBusy("m"), .unknownFeature("m"), .unsupportedFeature("m"), .unknownRestriction("m"),
            .limitExceeded("m"), .backendFailed("m"), .serviceUnavailable("m"),
            .other(name: "org.example.Error.Bogus", message: "m"),
        ]
        for error in errors {
            switch error {
            case .invalidArgs, .notAuthorized, .interactiveAuthorizationRequired, .notInSession, .sessionBusy,
                .unknownFeature, .unsupportedFeature, .unknownRestriction, .limitExceeded, .backendFailed,
                .serviceUnavailable, .other:
                break
            }
        }
        return errors
    }()

    /// A D-Bus error reply comes back as the error the API names it by.
    @Test(arguments: allErrors)
    func roundTripsByName(_ sent: GuidedAccessError) {
        let received = GuidedAccessError(DBusError(name: sent.dbusErrorName, message: "m"))
        #expect(received == sent)
        #expect(received.message == "m")
    }

    /// The service's own errors are under its prefix; InvalidArgs and
    /// InteractiveAuthorizationRequired are D-Bus's.
    @Test func serviceErrorsAreUnderTheServicePrefix() {
        let own: [GuidedAccessError] = [
            .notAuthorized("m"), .notInSession("m"), .sessionBusy("m"), .unknownFeature("m"),
            .unsupportedFeature("m"), .unknownRestriction("m"), .limitExceeded("m"), .backendFailed("m"),
        ]
        for error in own {
            #expect(error.dbusErrorName.hasPrefix(GuidedAccessBus.errorPrefix), "\(error)")
        }
        #expect(GuidedAccessError.invalidArgs("m").dbusErrorName == Self.fd + "InvalidArgs")
        #expect(
            GuidedAccessError.interactiveAuthorizationRequired("m").dbusErrorName
                == Self.fd + "InteractiveAuthorizationRequired")
    }

    /// Names other than the API's own: the bus's refusals and failures.
    @Test(arguments: [
        (fd + "AccessDenied", GuidedAccessError.notAuthorized("m")),
        (fd + "ServiceUnknown", .serviceUnavailable("m")),
        (fd + "NameHasNoOwner", .serviceUnavailable("m")),
        (fd + "NoReply", .serviceUnavailable("m")),
        (fd + "Disconnected", .serviceUnavailable("m")),
        (fd + "UnknownMethod", .other(name: fd + "UnknownMethod", message: "m")),
        (GuidedAccessBus.errorPrefix + "Bogus", .other(name: GuidedAccessBus.errorPrefix + "Bogus", message: "m")),
    ])
    func mapsOtherNames(name: String, expected: GuidedAccessError) {
        let error = GuidedAccessError(DBusError(name: name, message: "m"))
        #expect(error == expected)
        #expect(error.message == "m")
    }

    @Test func sessionOptions() throws {
        let options = try SessionOptions(timeLimit: .milliseconds(1500), zoomFactor: 3, inhibitSleep: false).dictionary()
        #expect(options[.timeLimit] == Variant(UInt64(2)))
        #expect(options[.zoomFactor] == Variant(3.0))
        #expect(options[.inhibitSleep] == Variant(false))
        #expect(options[.textScale] == nil)
        #expect(throws: GuidedAccessError.self) { try SessionOptions(timeLimit: .seconds(-1)).dictionary() }
    }

    /// Each option goes out with the D-Bus type the API gives its key.
    @Test func sessionOptionTypes() throws {
        let options = try SessionOptions(timeLimit: .seconds(60), zoomFactor: 2, textScale: 1.5, inhibitSleep: true)
            .dictionary()
        #expect(Set(options.keys) == Set(SessionOptionKey.allCases).subtracting([.features]))
        for (key, value) in options {
            #expect(value.value.type.signature == key.signature, "\(key)")
        }
    }

    /// The client names features by the API's wire names: what it sends
    /// parses back to the same features.
    @Test func featureWireNames() throws {
        let all = Set(Feature.allCases)
        #expect(all.sortedWireNames == all.map(\.rawValue).sorted())
        #expect(try Feature.parse(all.sortedWireNames) == all)
    }

    /// A signal with a reason this library does not know still arrives, with
    /// the reason as sent.
    @Test func sessionReasonsPassThrough() throws {
        func event(_ member: String, _ arguments: [DBusValue]) throws -> GuidedAccessEvent? {
            let message = try Message.signal(
                path: GuidedAccessBus.objectPath, interface: GuidedAccessBus.interface, member: member)
            try message.append(arguments)
            return GuidedAccessClient.event(from: message)
        }
        let sessionChanged = GuidedAccessSignal.sessionChanged.rawValue
        let restrictionChanged = GuidedAccessSignal.restrictionChanged.rawValue
        for reason in SessionChangeReason.allCases {
            let received = try event(sessionChanged, [.bool(true), .string(reason.rawValue)])
            #expect(received == .session(active: true, reason: reason.rawValue))
            #expect(received?.sessionChangeReason == reason)
        }
        let newer = try event(sessionChanged, [.bool(false), .string("some-newer-reason")])
        #expect(newer == .session(active: false, reason: "some-newer-reason"))
        #expect(newer?.sessionChangeReason == nil)

        #expect(
            try event(restrictionChanged, [.string("com.example.a"), RestrictionState.deny.dbusValue])
                == .restriction(identifier: "com.example.a", state: .deny))
        #expect(try event(restrictionChanged, [.string("com.example.a"), .string("maybe")]) == nil)
        #expect(try event("SomeNewerSignal", [.bool(true), .string("started")]) == nil)
    }

    @Test func providerRegistrations() {
        #expect(RecordingProvider().registrations == [
            RestrictionRegistration(identifier: "com.example.kiosk.print", text: "Printing", detail: "Print receipts"),
            RestrictionRegistration(identifier: "com.example.kiosk.camera", text: "Camera", detail: ""),
        ])
    }
}
