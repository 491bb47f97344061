import GuidedAccessCore
import Testing

@testable import BrowserLayer

/// `[Browser] DevToolsEndpoint=`, the browser driver's key, as the
/// configuration checks it.
@Suite struct DevToolsEndpointTests {
    func endpoint(_ value: String) throws(ConfigurationError) -> DevToolsEndpoint? {
        var configuration = ServiceConfiguration(defaultsFor: .user, driverKeys: [BrowserPagesDriver.configurationKey])
        try configuration.apply(group: "Browser", key: "DevToolsEndpoint", value: value, file: "/etc/ga.conf")
        return BrowserPagesDriver.configured(configuration.driverValue(group: "Browser", key: "DevToolsEndpoint"))
    }

    @Test func loopbackAddressesAreTaken() throws {
        #expect(try endpoint("http://127.0.0.1:9222")?.description == "http://127.0.0.1:9222")
        #expect(try endpoint(" http://127.0.0.1:9222/ ")?.authority == "127.0.0.1:9222")
        #expect(try endpoint("http://127.3.2.1:1")?.address == .ipv4(127, 3, 2, 1))
        #expect(try endpoint("http://localhost:9222")?.description == "http://127.0.0.1:9222")
        #expect(try endpoint("HTTP://127.0.0.1:9222")?.description == "http://127.0.0.1:9222")
        #expect(try endpoint("http://[::1]:9222")?.address == .ipv6Loopback)
        #expect(try endpoint("http://[::1]:9222")?.authority == "[::1]:9222")
        #expect(try endpoint("") == nil)
        #expect(BrowserPagesDriver.configured(nil) == nil)
    }

    @Test(arguments: [
        ("http://10.0.0.1:9222", "host '10.0.0.1' is not a loopback address"),
        ("http://example.com:9222", "host 'example.com' is not a loopback address"),
        ("http://127.1:9222", "host '127.1' is not a loopback address"),
        ("http://127.000.0.1:9222", "host '127.000.0.1' is not a loopback address"),
        ("http://[::2]:9222", "host '[::2]' is not a loopback address"),
        ("http://0.0.0.0:9222", "host '0.0.0.0' is not a loopback address"),
        ("https://127.0.0.1:9222", "expected a loopback http:// address"),
        ("ws://127.0.0.1:9222", "expected a loopback http:// address"),
        ("127.0.0.1:9222", "expected a loopback http:// address"),
        ("http://127.0.0.1", "expected ':PORT' after the host"),
        ("http://127.0.0.1:", "port '' is not a number from 1 to 65535"),
        ("http://127.0.0.1:0", "port '0' is not a number from 1 to 65535"),
        ("http://127.0.0.1:99999", "port '99999' is not a number from 1 to 65535"),
        ("http://127.0.0.1:+80", "port '+80' is not a number from 1 to 65535"),
        ("http://127.0.0.1:9222/json", "expected only a host and a port after http://, found '/'"),
        ("http://user@127.0.0.1:9222", "expected only a host and a port after http://, found '@'"),
        ("http://127.0.0.1:9222?x", "expected only a host and a port after http://, found '?'"),
    ])
    func anythingElseIsAStartUpErrorNamingTheValue(value: String, reason: String) {
        do {
            _ = try endpoint(value)
            Issue.record("\(value) was taken")
        } catch {
            #expect(error.file == "/etc/ga.conf" && error.group == "Browser" && error.key == "DevToolsEndpoint")
            #expect(error.value == value)
            #expect(error.reason.hasPrefix(reason), "\(error.reason)")
            #expect(error.description.hasPrefix("/etc/ga.conf: [Browser] DevToolsEndpoint=\(value): "))
        }
    }
}
