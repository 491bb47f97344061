import DBus
import Glibc
import GuidedAccessCore
import Logging

/// The session's visual features inside the kiosk browser's pages
/// (`BrowserLayer`, through Chromium's DevTools protocol): zoom, invert,
/// grayscale, high contrast, large text and reduce motion, in every page,
/// wherever no other driver covers the whole screen with them.
///
/// The browsers: each one a launcher attached (`AttachBrowser`, the
/// browser's DevTools pipe relayed by `guidedaccessctl browser`), and the
/// one at `[Browser] DevToolsEndpoint=` if configured. While one is
/// connected the layer delivers the features and `Desktop` ends in
/// `+browser`; both change when browsers come or go. It keeps nothing in
/// the journal: what a service before it left in the pages is cleared when
/// a layer connects.
public final class BrowserPagesDriver: FeatureDriver, BrowserAttaching, PageServing, @unchecked Sendable {
    public let name = "browser"
    /// The browser at `[Browser] DevToolsEndpoint=`; nil: none configured.
    private let endpointLayer: BrowserLayer?
    /// The browsers launchers attached, by the launcher's bus name.
    private var attached: [(owner: String, layer: BrowserLayer)] = []
    private let loop: EventLoop
    /// The attachments' log lines, rate-limited together (a caller that
    /// attaches a hundred sockets in a row gets the log a few lines).
    private let attachmentLog: PeerLog
    /// The look the session wants, as last applied (a browser attached
    /// later is shown it).
    private var look: BrowserLook?
    /// Whether a browser is connected, as `capabilities` last said.
    private var connected = false
    private var events: (@Sendable (DriverEvent) -> Void)?
    /// (1.2) `[Browser] AllowOrigins=`: the origins whose pages get the page API.
    private let allowedOrigins: Set<String>
    /// What the service answers pages with, once it serves them.
    private var pageHandlers: PageHandlers?

    /// Browsers attached at once: a second launcher is a second browser,
    /// but no caller may make the service hold more than this.
    static let attachmentLimit = 8

    public init(endpoint: DevToolsEndpoint?, allowedOrigins: [String] = [], loop: EventLoop, logger: Logger) {
        endpointLayer = endpoint.map { BrowserLayer(endpoint: $0, loop: loop, logger: logger) }
        self.allowedOrigins = Set(allowedOrigins)
        self.loop = loop
        attachmentLog = PeerLog(logger)
    }

    /// `[Browser] DevToolsEndpoint=`: the kiosk browser's
    /// `--remote-debugging-port`, a loopback `http://` address; empty (the
    /// default): none (a browser is attached by its launcher).
    package static let configurationKey = DriverConfigurationKey(group: "Browser", key: "DevToolsEndpoint") { value in
        guard !value.isEmpty, case .failure(let problem) = DevToolsEndpoint.parse(value) else { return nil }
        return problem.description
    }

    /// (1.2) `[Browser] AllowOrigins=`: the exact origins
    /// (`scheme://host[:port]`, `;`-separated) whose top-level documents
    /// get `window.guidedAccess`; empty (the default): none.
    package static let originsKey = DriverConfigurationKey(group: "Browser", key: "AllowOrigins") { value in
        for origin in origins(value) {
            if let problem = BrowserOrigin.problem(origin) { return "'\(origin)': \(problem)" }
        }
        return nil
    }

    /// The items of `[Browser] AllowOrigins=` (checked by `originsKey`).
    package static func origins(_ value: String?) -> [String] {
        (value ?? "").split(separator: ";").map { String($0.trimmingASCIIWhitespace) }.filter { !$0.isEmpty }
    }

    /// The endpoint a checked `[Browser] DevToolsEndpoint=` names; nil: none.
    package static func configured(_ value: String?) -> DevToolsEndpoint? {
        guard let value, !value.isEmpty, case .success(let endpoint) = DevToolsEndpoint.parse(value) else { return nil }
        return endpoint
    }

    package var capabilities: [Feature: FeatureCapability] {
        let reason =
            endpointLayer.map { "no browser is attached (guidedaccessctl browser) or connected \($0.source)" }
            ?? "no browser is attached: start the kiosk browser with guidedaccessctl browser"
        var capabilities: [Feature: FeatureCapability] = [:]
        for feature in BrowserLook.realisable {
            capabilities[feature] = connected ? .delivers(.part) : .notActing(reason)
        }
        return capabilities
    }

    package var desktopPart: DesktopPart? { connected ? .layer("browser") : nil }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {
        self.events = events
        await endpointLayer?.start(onChange: changeHandler())
    }

    private func changeHandler() -> @Sendable () -> Void {
        let loop = self.loop
        return { [self] in Task(executorPreference: loop) { await self.connectionChanged() } }
    }

    /// A browser connected or went: attachments that ended are let go of.
    private func connectionChanged() async {
        var now = await endpointLayer?.isConnected ?? false
        var ended: [BrowserLayer] = []
        for entry in attached {
            if await entry.layer.finished {
                ended.append(entry.layer)
            } else if await entry.layer.isConnected {
                now = true
            }
        }
        // In place: one attached meanwhile stays.
        attached.removeAll { entry in ended.contains { $0 === entry.layer } }
        guard now != connected else { return }
        connected = now
        events?(.changed)
    }

    /// `AttachBrowser`: a launcher's socket becomes a browser of the layer,
    /// shown the session's look once it has answered.
    package nonisolated(nonsending) func attach(_ caller: BusCaller, descriptor: Int32) async throws(GuidedAccessError)
        -> String
    {
        func option(_ name: Int32) -> Int32? {
            var value: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            return getsockopt(descriptor, SOL_SOCKET, name, &value, &length) == 0 ? value : nil
        }
        guard option(SO_DOMAIN) == AF_UNIX, option(SO_TYPE) == Int32(SOCK_STREAM.rawValue), option(SO_ACCEPTCONN) == 0
        else {
            UnixFD.close(descriptor)
            throw .invalidArgs(
                "the descriptor is not a connected Unix stream socket: pass one end of socketpair(AF_UNIX, SOCK_STREAM) relaying the browser's --remote-debugging-pipe")
        }
        // The other end is the caller's own (the kernel says whose, as it
        // does for the bus): the service sends what is at the other end
        // the power to run script in the browser's pages, and takes no
        // socket of another user's browser, or to one.
        var credentials = (pid: Int32(0), uid: UInt32(0), gid: UInt32(0))
        var length = socklen_t(MemoryLayout.size(ofValue: credentials))
        guard getsockopt(descriptor, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 else {
            UnixFD.close(descriptor)
            throw .invalidArgs("cannot tell whose the socket's other end is: \(String(cString: strerror(errno)))")
        }
        guard credentials.uid == caller.identity.uid else {
            UnixFD.close(descriptor)
            throw .invalidArgs(
                "the socket's other end belongs to uid \(credentials.uid), not to uid \(caller.identity.uid) that attaches it: the launcher relays its own browser")
        }
        // One browser per launcher: its earlier attachment gives way.
        if let earlier = attached.first(where: { $0.owner == caller.uniqueName }) {
            attached.removeAll { $0.owner == caller.uniqueName }
            await earlier.layer.stop()
        }
        guard attached.count < Self.attachmentLimit else {
            UnixFD.close(descriptor)
            throw .limitExceeded("\(Self.attachmentLimit) browsers are attached already")
        }
        let layer = BrowserLayer(
            attachedBy: "\(caller.uniqueName) (uid \(caller.identity.uid))", descriptor: descriptor,
            loop: loop, log: attachmentLog)
        attached.append((caller.uniqueName, layer))
        // Its pages call as the launcher (its name and identity).
        if let pageHandlers { await layer.serve(PageAPI(allowed: allowedOrigins, caller: caller, handlers: pageHandlers)) }
        await layer.start(onChange: changeHandler())
        guard await layer.connectIfAbsent() else {
            attached.removeAll { $0.layer === layer }
            throw .invalidArgs(
                "no DevTools at the other end of the socket: \(await layer.lastProblem ?? "it closed")")
        }
        // The same launcher attached again meanwhile: this one gave way.
        guard attached.contains(where: { $0.layer === layer }) else {
            await layer.stop()
            throw .invalidArgs("replaced by a later AttachBrowser of the same connection before the browser answered")
        }
        await layer.show(look)
        await connectionChanged()
        return await layer.browserName
    }

    /// A caller asks for features only the browser would give while it is
    /// not connected: try the endpoint now, so that a browser started since is used.
    package nonisolated(nonsending) func lookAgain(for features: Set<Feature>) async {
        guard !connected, let endpointLayer, !features.isDisjoint(with: BrowserLook.realisable) else { return }
        _ = await endpointLayer.connectIfAbsent()
        await connectionChanged()
    }

    /// A client reading what is supported while no browser is connected
    /// makes the layer look for the endpoint's (at most once a second): how
    /// a browser started after the service is found without a timer.
    package func supportWasRead() {
        guard !connected, let endpointLayer else { return }
        Task(executorPreference: loop) { await endpointLayer.lookIfAbsent() }
    }

    package var followsReads: Bool { endpointLayer != nil }

    /// Shows the target's features in every page of every browser; returns
    /// once the pages show them, or after the layers' bound (a page that
    /// does not answer is left out). Not connected: shown once it is.
    package nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool {
        let features = target.forPart.intersection(BrowserLook.realisable)
        let look = features.isEmpty ? nil : BrowserLook(features: features, zoomFactor: target.zoomFactor, textScale: target.textScale)
        self.look = look
        // The browsers side by side: each waits for its pages within its own bound.
        let shows = ([endpointLayer].compactMap { $0 } + attached.map { $0.layer }).map { layer in
            Task(executorPreference: loop) { await layer.show(look) }
        }
        for show in shows { await show.value }
        return false
    }

    // MARK: The page API (1.2)

    package var servesPages: Bool { !allowedOrigins.isEmpty }

    package func servePages(endpointCaller: BusCaller, _ handlers: PageHandlers) {
        guard servesPages else { return }
        pageHandlers = handlers
        guard let endpointLayer else { return }
        let api = PageAPI(allowed: allowedOrigins, caller: endpointCaller, handlers: handlers)
        Task(executorPreference: loop) { await endpointLayer.serve(api) }
    }

    package func tellPages(_ event: PageEvent) {
        let layers = [endpointLayer].compactMap { $0 } + attached.map { $0.layer }
        Task(executorPreference: loop) {
            for layer in layers { await layer.tell(event) }
        }
    }

    package var record: JSON? { nil }

    package nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote] {
        if let target, !endsNow { _ = try? await apply(target) }
        return []
    }
}
