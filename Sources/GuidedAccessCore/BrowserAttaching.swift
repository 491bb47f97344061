/// (1.2) `AttachBrowser`: the kiosk browser's DevTools pipe, relayed by its
/// launcher (`guidedaccessctl browser`) over a Unix socket whose other end
/// the launcher hands the service. The driver of the browser's pages
/// implements it; the service admits the caller and passes the socket on.
package protocol BrowserAttaching: AnyObject {
    /// Takes `descriptor` (the implementation owns it from here, whatever
    /// happens), attached by `caller`; replaces an earlier attachment of
    /// the same connection. Returns the browser's name and version once it
    /// has answered, or throws why it is not taken (`.invalidArgs`: not a
    /// Unix stream socket, or no DevTools at its other end;
    /// `.limitExceeded`: too many browsers attached).
    nonisolated(nonsending) func attach(_ caller: BusCaller, descriptor: Int32) async throws(GuidedAccessError) -> String
}

/// (1.2) The page API (`window.guidedAccess`): what pages of the allowed
/// origins ask, and what the service tells them. The driver of the
/// browser's pages implements the page side (the binding, the document
/// script, the origin check against the browser's execution context);
/// the service answers the calls as it answers the bus's.
package protocol PageServing: AnyObject {
    /// Whether any origin is allowed (`[Browser] AllowOrigins=`): without,
    /// no page gets the API and this is never called.
    var servesPages: Bool { get }
    /// Starts serving: `endpointCaller` is who a page of the
    /// `DevToolsEndpoint` browser calls as (the service itself); pages of
    /// an attached browser call as the launcher that attached it.
    func servePages(endpointCaller: BusCaller, _ handlers: PageHandlers)
    /// Tells every allowed page, in every browser.
    func tellPages(_ event: PageEvent)
}

/// One call of a page.
package struct PageCall: Sendable {
    /// The tab: the launcher's (or the service's) name and identity with
    /// the page's origin, and the tab's target id.
    package var caller: BusCaller
    /// `startSession`, `configureForSession`, … as the page named it (not
    /// checked yet).
    package var method: String
    package var arguments: [JSON]

    package init(caller: BusCaller, method: String, arguments: [JSON]) {
        self.caller = caller
        self.method = method
        self.arguments = arguments
    }
}

/// What the service hands the driver: its answer to a page's call (a
/// value, or an error by name), and what it does when an owning page is
/// gone.
package struct PageHandlers: Sendable {
    package var call: @Sendable (PageCall) async -> Result<JSON, GuidedAccessError>
    /// The tab `tab` of the browser attached by `launcher` (the service's
    /// own name for the endpoint's) closed or left its origin `origin`
    /// (nil: the tab closed); `tab` nil: the browser's attachment ended.
    package var left: @Sendable (_ launcher: String, _ tab: String?, _ nowAt: String?) -> Void

    package init(
        call: @escaping @Sendable (PageCall) async -> Result<JSON, GuidedAccessError>,
        left: @escaping @Sendable (_ launcher: String, _ tab: String?, _ nowAt: String?) -> Void
    ) {
        self.call = call
        self.left = left
    }
}

/// What pages hear (`guidedAccess` is an `EventTarget`).
package enum PageEvent: Sendable {
    case sessionChanged(active: Bool, reason: String)
    case featuresChanged([String])
    case restrictionChanged(id: String, state: String)

    /// The event's type and `detail`.
    package var dom: (type: String, detail: JSON) {
        switch self {
        case .sessionChanged(let active, let reason):
            ("sessionchange", .object([("active", .bool(active)), ("reason", .string(reason))]))
        case .featuresChanged(let features):
            ("featureschange", .object([("enabledFeatures", .array(features.map(JSON.string)))]))
        case .restrictionChanged(let id, let state):
            ("restrictionchange", .object([("id", .string(id)), ("state", .string(state))]))
        }
    }
}

/// (1.2) The page API's limits.
package enum PageCallLimits {
    /// A page's calls waiting for their answers, at most (more: `LimitExceeded`).
    package static let outstanding = 16
    /// A call's JSON, at most (more: `InvalidArgs`).
    package static let callBytes = 64 << 10
}
