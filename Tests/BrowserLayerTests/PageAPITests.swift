import Testing
@testable import BrowserLayer
@testable import GuidedAccessCore

/// (1.2) The page API's pieces that need no browser: the call's id, a
/// URL's origin, what the service hands a page.
@Suite struct PageAPITests {
    @Test func theCallsIdIsReadFromItsStartAsThePageScriptWritesIt() {
        #expect(BrowserLayer.callID(#"{"id":42,"method":"getState","args":[]}"#) == "42")
        #expect(BrowserLayer.callID(#"{"id":1"#) == "1")
        // Not the script's form: no answer can be addressed.
        for bad in [#"{"method":"x","id":1}"#, #"{"id":"1"}"#, #"{"id":-1}"#, #"{"id":}"#, #" {"id":1}"#,
                    #"{"id":1234567890123456}"#, ""] {
            #expect(BrowserLayer.callID(bad) == nil, "\(bad)")
        }
    }

    @Test func aURLsOriginIsItsSchemeHostAndPortAndOnlyHTTPsHaveOne() {
        #expect(BrowserLayer.origin(of: "http://127.0.0.1:8080/kiosk/index.html?x#y") == "http://127.0.0.1:8080")
        #expect(BrowserLayer.origin(of: "https://Kiosk.Example/") == "https://kiosk.example")
        #expect(BrowserLayer.origin(of: "https://kiosk.example?q") == "https://kiosk.example")
        for opaque in ["", "about:blank", "data:text/html,<p>", "file:///srv/kiosk.html", "javascript:1", "blob:http://a/x"] {
            #expect(BrowserLayer.origin(of: opaque) == nil, "\(opaque)")
        }
    }

    @Test func whatThePageIsHandedIsOneCallOfItsReceiverWithJSON() {
        let message = JSON.object([("event", .string("restrictionchange")), ("detail", .object([
            ("id", .string("a\"); alert(1); (\"\u{2028}</script>")), ("state", .string("deny")),
        ]))])
        let expression = PageAPI.delivery(message)
        #expect(expression.hasPrefix("globalThis.__guidedAccessReceive && globalThis.__guidedAccessReceive({"))
        #expect(expression.hasSuffix("})"))
        // The quote is escaped: the id stays one string.
        #expect(expression.contains(#"a\"); alert(1); (\""#))
    }

    @Test func theScriptNamesTheAllowedOriginsAsJSONAndServesTopDocumentsOnly() {
        let script = PageAPI.script(allowed: ["https://b.example", "http://127.0.0.1:8080"])
        #expect(script.contains(#"const allowed = ["http://127.0.0.1:8080","https://b.example"];"#))
        #expect(script.contains("window.top !== window"))
        #expect(script.contains("delete globalThis.__guidedAccessBinding"))
    }
}
