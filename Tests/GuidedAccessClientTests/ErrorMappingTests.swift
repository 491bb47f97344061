import DBus
import Testing

@testable import GuidedAccessClient

@Suite struct ErrorMappingTests {
    static let ga = "org.guidedaccess.GuidedAccess1.Error."
    static let fd = "org.freedesktop.DBus.Error."

    @Test(arguments: [
        (ga + "NotAuthorized", GuidedAccessError.notAuthorized("m")),
        (ga + "NotInSession", .notInSession("m")),
        (ga + "SessionBusy", .sessionBusy("m")),
        (ga + "UnknownFeature", .unknownFeature("m")),
        (ga + "UnsupportedFeature", .unsupportedFeature("m")),
        (ga + "UnknownRestriction", .unknownRestriction("m")),
        (ga + "LimitExceeded", .limitExceeded("m")),
        (ga + "BackendFailed", .backendFailed("m")),
        (fd + "InvalidArgs", .invalidArguments("m")),
        (fd + "InteractiveAuthorizationRequired", .interactiveAuthorizationRequired("m")),
        (fd + "AccessDenied", .notAuthorized("m")),
        (fd + "ServiceUnknown", .serviceUnavailable("m")),
        (fd + "NoReply", .serviceUnavailable("m")),
        (fd + "UnknownMethod", .other(name: fd + "UnknownMethod", message: "m")),
        (ga + "Bogus", .other(name: ga + "Bogus", message: "m")),
    ])
    func mapsNames(name: String, expected: GuidedAccessError) {
        let error = GuidedAccessError(DBusError(name: name, message: "m"))
        #expect(error == expected)
        #expect(error.message == "m")
    }

    @Test func sessionOptions() throws {
        let options = try SessionOptions(timeLimit: .milliseconds(1500), zoomFactor: 3, inhibitSleep: false).dictionary()
        #expect(options["time-limit"] == Variant(UInt64(2)))
        #expect(options["zoom-factor"] == Variant(3.0))
        #expect(options["inhibit-sleep"] == Variant(false))
        #expect(options["text-scale"] == nil)
        #expect(throws: GuidedAccessError.self) { try SessionOptions(timeLimit: .seconds(-1)).dictionary() }
    }

    @Test func featureWireNames() {
        #expect(GuidedAccessFeature.allCases.map(\.rawValue).sorted() == [
            "grayscale", "high-contrast", "invert-colors", "large-text", "on-screen-keyboard", "reduce-motion",
            "screen-reader", "zoom",
        ])
    }
}
