import BrowserLayer
import GuidedAccessCore

/// The browser layer beside the desktop: which features it realises, what
/// it adds to `SupportedFeatures` and `Desktop`, and the session's look
/// handed to it (spec: "Browser layer").
extension GuidedAccessService {
    /// The features the browser layer realises here: those it can, except
    /// what the desktop realises for the whole screen (gnome-shell).
    var browserFeatures: Set<Feature> {
        guard browser != nil else { return [] }
        let realisation = self.realisation
        return BrowserLook.realisable.subtracting(realisation.wholeScreen ? realisation.byKeys : [])
    }

    func startBrowserLayer() async {
        guard let browser else { return }
        let loop = connection.loop
        await browser.start { [weak self] in
            Task(executorPreference: loop) { await self?.browserChanged() }
        }
        await showInBrowser()
    }

    /// The browser came or went: `SupportedFeatures` and `Desktop` say so.
    func browserChanged() async {
        guard let browser else { return }
        let connected = await browser.isConnected
        guard connected != browserConnected else { return }
        browserConnected = connected
        updateSupport()
        logSupport()
        await announce()
    }

    /// Hands the session's browser features to the layer; returns once the
    /// pages show them (or the layer stopped waiting for a slow page).
    func showInBrowser() async {
        guard let browser else { return }
        var look: BrowserLook?
        if let session {
            let features = session.features.intersection(browserFeatures)
            if !features.isEmpty {
                look = BrowserLook(features: features, zoomFactor: session.zoomFactor, textScale: session.textScale)
            }
        }
        await browser.show(look)
    }

    /// A call asks for features only the browser would give while it is not
    /// connected: try it now, so a browser that came up since is used.
    func connectBrowser(for features: Set<Feature>) async {
        guard let browser, !browserConnected, !features.subtracting(supported).isDisjoint(with: browserFeatures) else {
            return
        }
        _ = await browser.connectIfAbsent()
        await browserChanged()
    }

    /// `Desktop`, with `+browser` while the browser layer is connected.
    func desktopProperty() -> String {
        desktop.rawValue + (browserConnected ? "+browser" : "")
    }

    /// For `SupportedFeatures` and `Desktop`: a client reading them while
    /// the browser is not connected makes the layer look for it (at most
    /// once a second) — how a browser started after the service is found
    /// without a timer. nil without a browser layer.
    nonisolated var browserLookout: (@Sendable () -> Void)? {
        guard let browser else { return nil }
        let loop = connection.loop
        return { Task(executorPreference: loop) { await browser.lookIfAbsent() } }
    }
}
