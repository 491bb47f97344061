import DBus
import GuidedAccessCore
import GuidedAccessWire

/// (1.2) `AttachBrowser`: the kiosk browser's launcher (`guidedaccessctl
/// browser`) hands over the socket it relays the browser's DevTools pipe
/// on. The launcher is a client like any other: admitted as StartSession's
/// callers are. What is done with the socket is the driver's.
extension GuidedAccessService {
    func attachBrowser(_ call: MethodCall, _ browser: UnixFD) async throws {
        guard let browsers else {
            throw GuidedAccessError.other(
                name: "org.freedesktop.DBus.Error.NotSupported",
                message: "this service drives no browser")
        }
        let caller = try await identify(call)
        try await admit(settings.policy.verdict(for: caller.identity, action: .startSession), caller, .bus(call))
        // The call's descriptor is the dispatcher's: the driver gets its own.
        guard let descriptor = browser.duplicate() else {
            throw GuidedAccessError.backendFailed("cannot take the browser's socket: the service has no file descriptor left")
        }
        let product = try await browsers.attach(caller, descriptor: descriptor)
        // System mode: its pages' calls come through the agent, naming it.
        if agents != nil { launchers.note(caller) }
        settings.audit.record(
            .browserAttached, caller: caller.identity, "browser \(product) attached by \(call.sender)",
            fields: ["BROWSER": product, "LAUNCHER": call.sender])
    }
}
