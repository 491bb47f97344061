import DBus
import GuidedAccessCore
import Logging

/// The session's visual features inside the kiosk browser's pages
/// (`BrowserLayer`, through Chromium's DevTools protocol): zoom, invert,
/// grayscale, high contrast, large text and reduce motion, in every page,
/// wherever no other driver covers the whole screen with them.
///
/// While the browser is connected it delivers them and `Desktop` ends in
/// `+browser`; both change when it comes or goes. It keeps nothing in the
/// journal: what a service before it left in the pages is cleared when the
/// layer connects.
public final class BrowserPagesDriver: FeatureDriver, @unchecked Sendable {
    public let name = "browser"
    private let layer: BrowserLayer
    private let loop: EventLoop
    /// Whether the layer is connected, as `capabilities` last said.
    private var connected = false
    private var events: (@Sendable (DriverEvent) -> Void)?

    public init(endpoint: DevToolsEndpoint, loop: EventLoop, logger: Logger) {
        layer = BrowserLayer(endpoint: endpoint, loop: loop, logger: logger)
        self.loop = loop
    }

    /// `[Browser] DevToolsEndpoint=`: the kiosk browser's
    /// `--remote-debugging-port`, a loopback `http://` address; empty (the
    /// default): no browser layer.
    package static let configurationKey = DriverConfigurationKey(group: "Browser", key: "DevToolsEndpoint") { value in
        guard !value.isEmpty, case .failure(let problem) = DevToolsEndpoint.parse(value) else { return nil }
        return problem.description
    }

    /// The endpoint a checked `[Browser] DevToolsEndpoint=` names; nil: none.
    package static func configured(_ value: String?) -> DevToolsEndpoint? {
        guard let value, !value.isEmpty, case .success(let endpoint) = DevToolsEndpoint.parse(value) else { return nil }
        return endpoint
    }

    package var capabilities: [Feature: FeatureCapability] {
        var capabilities: [Feature: FeatureCapability] = [:]
        for feature in BrowserLook.realisable {
            capabilities[feature] = connected ? .delivers(.part) : .notActing("no browser is connected at \(layer.endpoint)")
        }
        return capabilities
    }

    package var desktopPart: DesktopPart? { connected ? .layer("browser") : nil }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {
        self.events = events
        let loop = self.loop
        await layer.start { [self] in
            Task(executorPreference: loop) { await self.connectionChanged() }
        }
    }

    /// The layer connected or lost the browser.
    private func connectionChanged() async {
        let now = await layer.isConnected
        guard now != connected else { return }
        connected = now
        events?(.changed)
    }

    /// A caller asks for features only the browser would give while it is
    /// not connected: try now, so that a browser started since is used.
    package nonisolated(nonsending) func lookAgain(for features: Set<Feature>) async {
        guard !connected, !features.isDisjoint(with: BrowserLook.realisable) else { return }
        _ = await layer.connectIfAbsent()
        await connectionChanged()
    }

    /// A client reading what is supported while the browser is not
    /// connected makes the layer look for it (at most once a second): how a
    /// browser started after the service is found without a timer.
    package func supportWasRead() {
        guard !connected else { return }
        let layer = self.layer
        Task(executorPreference: loop) { await layer.lookIfAbsent() }
    }

    package var followsReads: Bool { true }

    /// Shows the target's features in every page; returns once the pages
    /// show them, or after the layer's bound (a page that does not answer is
    /// left out). Not connected: shown once it is.
    package nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool {
        let features = target.forPart.intersection(BrowserLook.realisable)
        await layer.show(
            features.isEmpty ? nil : BrowserLook(features: features, zoomFactor: target.zoomFactor, textScale: target.textScale))
        return false
    }

    package var record: JSON? { nil }

    package nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote] {
        if let target, !endsNow { _ = try? await apply(target) }
        return []
    }
}
