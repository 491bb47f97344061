import CLinux
import DBus
import Glibc
import GuidedAccessAPI
import GuidedAccessCore
import Logging
import Synchronization

/// The session's features inside the kiosk browser's pages, through
/// Chromium's DevTools protocol (spec: "Browser layer").
///
/// One connection to the browser target: a WebSocket to its DevTools
/// endpoint, or the socket a launcher relays its DevTools pipe on (an
/// attachment: used once, never reconnected — the launcher attaches anew).
/// While no session needs the pages it
/// is attached to none of them, so an idle kiosk sees no DevTools traffic
/// and the service no wake-up; while one does, it auto-attaches to every page
/// (those open, those opened later) and shows the session's `BrowserLook` in
/// each, through a document script that also covers the pages' next
/// documents. When the look goes, every page is put back, then let go.
///
/// Connecting: at start, when a session needs the browser (then again with
/// back-off, 0.1 s doubling to 5 s, for as long as it does; the back-off
/// starts again only after a connection has held `steadyConnection`), and
/// when a client asks what is supported (`lookIfAbsent`, at most once a
/// second). No timer runs while no session needs it.
///
/// Bounded whatever the peer does: only to a socket of the service's own
/// user (`DevToolsClient.open`), a bounded read per wake-up and bounded
/// queues (`LoopbackStream`, `DevToolsClient`), at most `pageLimit` pages,
/// log lines rate-limited (`PeerLog`), and the memory a connection took
/// given back to the system when it goes.
public actor BrowserLayer {
    /// Where the browser is.
    public nonisolated let source: Source
    /// An attachment's socket until it is taken up.
    private var descriptor: Int32?
    /// An attachment whose connection ended (or never was): done for good.
    public private(set) var finished = false
    private nonisolated let loop: EventLoop
    public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private let log: PeerLog
    /// The user the kiosk's browser runs as: this process's.
    private nonisolated let owner = geteuid()

    /// The look the session wants in every page; nil: none.
    private var look: BrowserLook?
    private var client: DevToolsClient?
    /// Whether the layer is connected to the browser now.
    public private(set) var isConnected = false
    private var connecting: Task<Bool, Never>?
    private var lastAttempt: ContinuousClock.Instant?
    /// Why the last attempt to connect failed.
    public private(set) var lastProblem: String?
    private var retry: Task<Void, Never>?
    private var backoff = BrowserLayer.firstBackoff
    private var connectedAt: ContinuousClock.Instant?
    /// Pages may hold a style sheet a service before this one left (it was
    /// killed, or lost the browser mid-session): removed once connected.
    private var leftoversPossible = false
    private var autoAttached = false
    /// The `Target.setAutoAttach` under way: a second change waits for it,
    /// so that it finds the pages attached.
    private var attaching: Task<Void, Never>?
    private var pages: [String: Page] = [:]
    private var onChange: (@Sendable () -> Void)?
    /// (1.2) The page API, when origins are allowed: then the layer stays
    /// attached to every page, session or not.
    private var api: PageAPI?
    /// Refused page API calls, logged apart: a page that floods them must
    /// not take the log lines of the browser's faults.
    private let refusals: PeerLog

    static let firstBackoff: Duration = .milliseconds(100)

    /// When the memory of a lost connection was last given back, or is to
    /// be (loop only).
    nonisolated(unsafe) private static var lastTrim: ContinuousClock.Instant?
    /// At most one give-back every 5 s: one asked for sooner is put off
    /// until then, not dropped — the last connection of a flood of them
    /// must not leave what it took behind.
    private static func trimMemory() {
        let now = ContinuousClock.now
        var delay: Duration = .zero
        if let lastTrim {
            if lastTrim > now { return }  // one is put off already
            if now - lastTrim < .seconds(5) { delay = .seconds(5) - (now - lastTrim) }
        }
        lastTrim = now + delay
        // Off the loop's thread, which callers would wait for (walking a heap
        // a flood fragmented can take tens of milliseconds): on a thread of
        // its own that ends with it, not on Swift's global executor, whose
        // first use would leave the idle service threads, descriptors and
        // wake-ups of its own.
        let micros = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
        micros.pointee = UInt32(delay.components.seconds) * 1_000_000 + UInt32(delay.components.attoseconds / 1_000_000_000_000)
        var thread = pthread_t()
        if pthread_create(&thread, nil, { argument in
            let micros = argument!.assumingMemoryBound(to: UInt32.self)
            if micros.pointee > 0 { usleep(micros.pointee) }
            micros.deallocate()
            malloc_trim(0)
            return nil
        }, micros) == 0 {
            pthread_detach(thread)
        } else {
            micros.deallocate()
            malloc_trim(0)
        }
    }
    /// A connection that held this long resets the back-off: one that
    /// breaks sooner (a browser crashing as it starts, a peer that flaps)
    /// is retried ever more slowly.
    static let steadyConnection: Duration = .seconds(10)
    /// Pages attached at once: the rest are left as they are.
    static let pageLimit = 64
    static let maxBackoff: Duration = .seconds(5)
    static let openTimeout: Duration = .seconds(2)
    static let commandTimeout: Duration = .seconds(3)
    /// How long a change waits for the pages before its caller is answered.
    static let showWait: Duration = .milliseconds(1500)

    /// What the layer knows of one attached page.
    private struct Page {
        let targetID: String
        /// Whether `shown` is known: not until first set (a service before
        /// may have left its sheet there).
        var known = false
        /// The look the page shows (nil: nothing of the layer's).
        var shown: BrowserLook?
        var pageEnabled = false
        var scriptID: String?
        /// The page's changes, one after another.
        var work: Task<Void, Never>?
        /// (1.2) A new tab the browser holds until the page API is in it.
        var waiting = false
        /// The page API's document script is in the page.
        var apiInstalled = false
        /// The Runtime domain (execution contexts, the binding) is on in the
        /// page: only while its top document may be of an allowed origin.
        var runtimeOn = false
        /// The top document of an allowed origin needs the Runtime domain on
        /// again (the tab came back from another origin).
        var runtimeWanted = false
        /// The tab's top document now: its execution context (main world)
        /// and origin, as the browser reports them.
        var top: (id: Int, origin: String)?
        /// The top document's URL, as the browser last reported it
        /// (`Page.frameNavigated`): a document the tab was only given (the
        /// empty one `window.open('')` makes, with its opener's origin) has
        /// none of the origin's.
        var documentURL = ""
        /// The page's calls not answered yet.
        var outstanding = 0
    }

    public enum Source: Sendable, CustomStringConvertible {
        /// `[Browser] DevToolsEndpoint=`.
        case endpoint(DevToolsEndpoint)
        /// `AttachBrowser`: by whom (for the log).
        case attachment(String)

        public var description: String {
            switch self {
            case .endpoint(let endpoint): "at \(endpoint)"
            case .attachment(let who): "attached by \(who)"
            }
        }
    }

    public init(endpoint: DevToolsEndpoint, loop: EventLoop, logger: Logger) {
        self.source = .endpoint(endpoint)
        self.loop = loop
        self.log = PeerLog(logger)
        refusals = PeerLog(logger)
    }

    /// A layer over `descriptor` (which it now owns), the service's end of
    /// the socket a launcher relays the browser's DevTools pipe on. `log`:
    /// shared by every attachment, so that attaching again and again does
    /// not start its rate limit again.
    init(attachedBy who: String, descriptor: Int32, loop: EventLoop, log: PeerLog) {
        self.source = .attachment(who)
        self.descriptor = descriptor
        self.loop = loop
        self.log = log
        refusals = PeerLog(log.logger)
    }

    deinit {
        if let descriptor { UnixFD.close(descriptor) }
    }

    // MARK: What the service asks

    /// Starts: one attempt to connect, and on connecting the pages are
    /// cleared of what a service before this one may have left on them.
    /// `onChange` runs (on the loop) whenever `isConnected` changes.
    public func start(onChange: @escaping @Sendable () -> Void) {
        self.onChange = onChange
        leftoversPossible = true
        attempt()
    }

    /// (1.2) Serves the page API in this browser's pages of the allowed
    /// origins: from now on every page is attached, and each new tab is
    /// held until the API is defined in it.
    public func serve(_ api: PageAPI) async {
        self.api = api
        if client != nil { await reconcile() }
    }

    /// A client asked what is supported: if the browser is not connected,
    /// look again, at most once a second. Does not wait.
    public func lookIfAbsent() {
        guard client == nil, connecting == nil else { return }
        if let lastAttempt, ContinuousClock.now - lastAttempt < .seconds(1) { return }
        attempt()
    }

    /// Connects now if not connected; whether it is.
    public func connectIfAbsent() async -> Bool {
        if client != nil { return true }
        attempt()
        return await connecting?.value ?? (client != nil)
    }

    /// Shows `look` in every page (nil: the pages as they were). Returns once
    /// the pages have it, or after `showWait`: a page that does not answer
    /// does not hold up the caller, and is left out. Not connected: shown
    /// once connected, and connecting is retried while a look is wanted.
    public func show(_ look: BrowserLook?) async {
        guard look != self.look else { return }
        let had = self.look
        self.look = look
        guard client != nil else {
            if look != nil {
                attempt()
            } else {
                retry?.cancel()
                retry = nil
                if had != nil { leftoversPossible = true }
            }
            return
        }
        await reconcile()
    }

    /// The browser's product and version, once connected.
    public var browserName: String {
        get async { await client?.browserVersion ?? "no browser" }
    }

    /// Lets go of an attachment for good (its launcher attached anew):
    /// the connection closes, which the launcher sees, and nothing is retried.
    public func stop() async {
        finished = true
        retry?.cancel()
        retry = nil
        guard let client else { return }
        self.client = nil
        isConnected = false
        pages = [:]
        await client.close()
        api?.handlers.left(api!.caller.uniqueName, nil, nil)
        onChange?()
    }

    // MARK: Connecting

    private func attempt() {
        guard client == nil, connecting == nil, !finished else { return }
        retry?.cancel()
        retry = nil
        lastAttempt = .now
        connecting = Task(executorPreference: loop) { await self.connect() }
    }

    private func connect() async -> Bool {
        do throws(DevToolsFailure) {
            let onEvent: @Sendable (DevToolsEvent) -> Void = { [weak self] event in self?.assumeIsolated { $0.handle(event) } }
            let onClose: @Sendable (DevToolsFailure) -> Void = { [weak self] reason in self?.assumeIsolated { $0.lost(reason) } }
            let client: DevToolsClient
            switch source {
            case .endpoint(let endpoint):
                client = try await DevToolsClient.open(
                    endpoint, loop: loop, timeout: Self.openTimeout, owner: owner, log: log, onEvent: onEvent,
                    onClose: onClose)
            case .attachment:
                guard let descriptor else { throw DevToolsFailure("the attachment's socket was taken up already") }
                self.descriptor = nil
                do throws(DevToolsFailure) {
                    client = try await DevToolsClient.attach(
                        descriptor, loop: loop, timeout: Self.openTimeout, log: log, onEvent: onEvent, onClose: onClose)
                } catch {
                    finished = true
                    throw error
                }
                // Let go of (`stop`) while it was asking: closed, not kept.
                guard !finished else {
                    await client.close()
                    throw DevToolsFailure("let go of before the browser answered")
                }
            }
            connecting = nil
            self.client = client
            isConnected = true
            connectedAt = .now
            lastProblem = nil
            let version = await client.browserVersion
            log.log(.notice, "browser layer: connected to \(version) \(source)")
            onChange?()
            // Not awaited: a call that connected first waits for the pages
            // once, in its own `show`, within its own limit.
            Task(executorPreference: loop) { await self.reconcile() }
            return true
        } catch {
            connecting = nil
            if lastProblem != error.description {
                lastProblem = error.description
                log.log(.info, "browser layer: no browser \(source): \(error)")
            }
            if look != nil, !finished { scheduleRetry() }
            return false
        }
    }

    private func scheduleRetry() {
        guard retry == nil else { return }
        let delay = backoff
        backoff = min(backoff * 2, Self.maxBackoff)
        let loop = self.loop
        retry = Task(executorPreference: loop) {
            do { try await loop.sleep(for: delay) } catch { return }
            await self.retryDue()
        }
    }

    private func retryDue() {
        retry = nil
        if look != nil { attempt() }
    }

    /// The connection ended (the browser went, or sent what is not DevTools).
    private func lost(_ reason: DevToolsFailure) {
        // Ended while still opening: `connect` reports that.
        guard client != nil else { return }
        client = nil
        isConnected = false
        autoAttached = false
        attaching = nil
        pages = [:]
        if let connectedAt, ContinuousClock.now - connectedAt >= Self.steadyConnection { backoff = Self.firstBackoff }
        connectedAt = nil
        log.log(.warning, "browser layer: lost the browser \(source): \(reason)")
        if case .attachment = source { finished = true }
        if let api { api.handlers.left(api.caller.uniqueName, nil, nil) }
        // What the connection took (its buffers, its pages) goes back to the
        // system, not only to malloc's free lists — at most every few
        // seconds: a peer that breaks its connection again and again must
        // not have the heap walked each time.
        Self.trimMemory()
        onChange?()
        if finished {
            return
        } else if look != nil {
            scheduleRetry()
        } else {
            // If the browser is still there, what it shows was not undone.
            leftoversPossible = true
        }
    }

    // MARK: The pages

    /// Brings every page to the look, or — no look — puts every page back
    /// and lets go of them.
    private func reconcile() async {
        guard let client else { return }
        let deadline = ContinuousClock.now + Self.showWait
        if look != nil || leftoversPossible || api != nil {
            if !autoAttached {
                autoAttached = true
                attaching = Task(executorPreference: loop) { await self.attachPages(client) }
            }
            await attaching?.value
            guard self.client === client, autoAttached else { return }
        }
        let updates = pages.keys.sorted().map { update($0) }
        await settle(updates, until: deadline)
        // The page API keeps the pages attached.
        guard look == nil, api == nil else { return }
        // Every page put back — a slow one too, after its caller had its
        // answer: then let go of them, so that nothing more comes.
        Task(executorPreference: loop) {
            for update in updates { await update.value }
            await self.letGo(client)
        }
    }

    /// Attaches to every page, now and to come. The browser attaches to the
    /// pages open now before it answers; `handle` takes each as it comes. A
    /// browser that does not answer within `showWait` is taken for frozen
    /// and let go of, so that the calls of the session do not each wait
    /// for it, and it is no longer claimed.
    private func attachPages(_ client: DevToolsClient) async {
        do throws(DevToolsFailure) {
            _ = try await client.call(
                "Target.setAutoAttach",
                // With the page API, a new tab waits until the API is in it,
                // so that it is there before the page's own scripts.
                [("autoAttach", .bool(true)), ("waitForDebuggerOnStart", .bool(api != nil)), ("flatten", .bool(true))],
                timeout: Self.showWait)
        } catch {
            guard self.client === client else { return }
            lost(DevToolsFailure("cannot attach to the browser's pages: \(error)"))
            await client.close()
            return
        }
        if self.client === client { attaching = nil }
    }

    private func letGo(_ client: DevToolsClient) async {
        // A page attached meanwhile (a tab opened as the session ended) is
        // put back first; one that fails is left out, so this ends.
        for _ in 0..<8 {
            guard look == nil, api == nil, self.client === client, autoAttached else { return }
            guard let session = pages.first(where: { !$0.value.known || $0.value.shown != nil })?.key else { break }
            await update(session).value
        }
        guard look == nil, api == nil, self.client === client, autoAttached else { return }
        leftoversPossible = false
        autoAttached = false
        pages = [:]
        do throws(DevToolsFailure) {
            // Ending auto-attach detaches the pages it attached.
            _ = try await client.call(
                "Target.setAutoAttach",
                [("autoAttach", .bool(false)), ("waitForDebuggerOnStart", .bool(false)), ("flatten", .bool(true))])
        } catch {
            log.log(.warning, "browser layer: letting go of the pages: \(error)")
        }
    }

    /// Waits for `tasks`, or until `deadline`, whichever is first. (A task
    /// group would wait for its children however it is cancelled.)
    private func settle(_ tasks: [Task<Void, Never>], until deadline: ContinuousClock.Instant) async {
        guard !tasks.isEmpty else { return }
        let loop = self.loop
        let first = FirstOf()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            first.arm(continuation)
            let timer = Task(executorPreference: loop) {
                try? await loop.sleep(for: deadline - ContinuousClock.now)
                first.resume()
            }
            Task(executorPreference: loop) {
                for task in tasks { await task.value }
                timer.cancel()
                first.resume()
            }
        }
    }

    /// Queues bringing page `session` up to date after what it is doing.
    private func update(_ session: String) -> Task<Void, Never> {
        let previous = pages[session]?.work
        let task = Task(executorPreference: loop) {
            await previous?.value
            await self.bringUpToDate(session)
        }
        pages[session]?.work = task
        return task
    }

    /// One page brought up to date: the page API put in (or its Runtime
    /// domain turned on again), the look shown, and a held new tab let go
    /// of — every command sent back to back, then the answers awaited. A
    /// held tab answers some commands only once it runs (Chromium's
    /// `Page.enable` in a tab opened with `noopener`), so nothing is
    /// awaited before it is let go of; the browser runs a session's
    /// commands in the order sent, so the API and the look are in place
    /// before its first document.
    private func bringUpToDate(_ session: String) async {
        guard let client, let page = pages[session] else { return }
        let look = self.look
        var batch = Batch(client: client, session: session, loop: loop)
        var checkDocument = false
        if let api, !page.apiInstalled {
            checkDocument = queueInstall(api, page, session, &batch)
        } else if api != nil, page.apiInstalled, page.runtimeWanted, !page.runtimeOn {
            queueRuntime(session, &batch)
            checkDocument = true
        }
        let showing = !page.known || page.shown != look
        if showing { queueShow(look, page, session, &batch) }
        if page.waiting {
            pages[session]?.waiting = false
            batch.send("Runtime.runIfWaitingForDebugger")
        }
        do throws(DevToolsFailure) {
            try await batch.finish { [self] in log.log(.debug, "browser layer: page \(page.targetID): the current document did not take the style: \($0)") }
        } catch {
            guard pages[session] != nil, self.client === client else { return }  // closed, or the connection went
            if error.isTimeout, await client.busy {
                // Late behind what the browser floods the connection with,
                // not hung: kept, and brought up to date at the next change.
                log.log(.warning, "browser layer: page \(page.targetID): \(error) while the browser sends without pause; tried again at the next change")
                pages[session]?.known = false
                return
            }
            log.log(.warning, "browser layer: page \(page.targetID) left out: \(error)")
            pages[session] = nil
            if page.waiting { tell(client, "Runtime.runIfWaitingForDebugger", session: session) }
            detach(session, client)
            return
        }
        if showing, pages[session] != nil {
            pages[session]?.known = true
            pages[session]?.shown = look
        }
        if checkDocument, let api { await reloadIfServedWithout(api, session, client) }
    }

    /// Queues showing `look` in the page.
    private func queueShow(_ look: BrowserLook?, _ page: Page, _ session: String, _ batch: inout Batch) {
        let known = page.known, before = page.shown
        let sheet = look?.styleSheet
        if sheet != nil, pages[session]?.pageEnabled != true {
            // Document scripts run only with the Page domain on.
            pages[session]?.pageEnabled = true
            batch.send("Page.enable")
        }
        let media = (look?.mediaFeatures ?? []).map { JSON.object([("name", .string($0.name)), ("value", .string($0.value))]) }
        let mediaBefore = (before?.mediaFeatures ?? []).map { $0.name + ":" + $0.value }
        if !known || mediaBefore != (look?.mediaFeatures ?? []).map({ $0.name + ":" + $0.value }) {
            batch.send("Emulation.setEmulatedMedia", [("media", .string("")), ("features", .array(media))])
        }
        let deficiency = look?.visionDeficiency ?? "none"
        if !known || (before?.visionDeficiency ?? "none") != deficiency {
            batch.send("Emulation.setEmulatedVisionDeficiency", [("type", .string(deficiency))])
        }
        guard !known || before?.styleSheet != sheet else { return }
        if let old = pages[session]?.scriptID {
            batch.send("Page.removeScriptToEvaluateOnNewDocument", [("identifier", .string(old))])
            pages[session]?.scriptID = nil
        }
        let script = PageScript.applying(sheet)
        if sheet != nil {
            batch.send("Page.addScriptToEvaluateOnNewDocument", [("source", .string(script))]) { [self] result in
                pages[session]?.scriptID = result["identifier"]?.string
            }
        }
        // The document there now. It may be between documents (the next one
        // gets the document script): not an error.
        batch.send("Runtime.evaluate", [("expression", .string(script)), ("silent", .bool(true))], tolerated: true)
    }

    private func detach(_ session: String, _ client: DevToolsClient) {
        Task(executorPreference: loop) {
            _ = try? await client.call("Target.detachFromTarget", [("sessionId", .string(session))])
        }
    }

    /// A DevTools event, in the order the browser sent them.
    private func handle(_ event: DevToolsEvent) {
        switch event.method {
        case "Target.attachedToTarget":
            guard let session = event.params["sessionId"]?.string, let info = event.params["targetInfo"] else { return }
            let wanted = look != nil || leftoversPossible || api != nil
            let waiting = event.params["waitingForDebugger"] == .bool(true)
            guard info["type"]?.string == "page", wanted, autoAttached else {
                // Not a page (a worker, the browser's own UI), or attached
                // as the layer was letting go: nothing of ours goes there.
                if let client {
                    if waiting { tell(client, "Runtime.runIfWaitingForDebugger", session: session) }
                    detach(session, client)
                }
                return
            }
            guard pages.count < Self.pageLimit else {
                // Left attached and untouched (detaching costs a command
                // each); letting go of the pages detaches it with the rest.
                log.log(.warning, "browser layer: more than \(Self.pageLimit) pages; page \(bounded(info["targetId"]?.string ?? "?", 40)) left out")
                // A flood of pages: what their commands took goes back once it ends.
                Self.trimMemory()
                if waiting, let client { tell(client, "Runtime.runIfWaitingForDebugger", session: session) }
                return
            }
            var page = Page(targetID: bounded(info["targetId"]?.string ?? "?", 40))
            page.waiting = waiting
            page.documentURL = info["url"]?.string ?? ""
            pages[session] = page
            _ = update(session)
        case "Target.detachedFromTarget":
            guard let session = event.params["sessionId"]?.string else { return }
            let page = pages.removeValue(forKey: session)
            if let api, let page { api.handlers.left(api.caller.uniqueName, page.targetID, nil) }
        case "Runtime.executionContextCreated", "Runtime.executionContextDestroyed", "Runtime.executionContextsCleared",
            "Runtime.bindingCalled", "Page.frameStartedNavigating", "Page.frameNavigated", "Page.frameStoppedLoading":
            pageAPIEvent(event)
        default:
            break  // Page events of attached pages: nothing to do.
        }
    }
}

// MARK: - The page API (1.2)

extension BrowserLayer {
    /// Queues putting the page API in page `session`: the document script
    /// for its next documents and, in a tab at an allowed origin, the
    /// Runtime domain with the binding. Returns whether the document there
    /// is to be checked once it answers (`reloadIfServedWithout`).
    private func queueInstall(_ api: PageAPI, _ page: Page, _ session: String, _ batch: inout Batch) -> Bool {
        if pages[session]?.pageEnabled != true {
            // Document scripts run only with the Page domain on; it also
            // tells where the tab goes (`Page.frameStartedNavigating`).
            pages[session]?.pageEnabled = true
            batch.send("Page.enable")
        }
        batch.send("Page.getFrameTree") { [self] tree in
            guard let url = tree["frameTree"]?["frame"]?["url"]?.string, !url.isEmpty else { return }
            pages[session]?.documentURL = url
            // It went to an allowed origin before it was attached (a tab
            // window.open made in its opener's process): the Runtime
            // domain, and the document loaded again with the API.
            if pages[session]?.runtimeOn == false, let origin = Self.origin(of: url), api.allowed.contains(origin) {
                pages[session]?.runtimeWanted = true
                _ = update(session)
            }
        }
        batch.send("Page.addScriptToEvaluateOnNewDocument", [("source", .string(api.script))])
        pages[session]?.apiInstalled = true
        // The Runtime domain only in a tab at an allowed origin, or in a new
        // tab that is held and has not said where it goes: one at another
        // origin turns it on when it starts to navigate to an allowed one,
        // and a new tab going elsewhere has it turned off before its
        // document runs (`Page.frameStartedNavigating`). A page of another
        // origin must not run with it on: its scripts could fill the
        // browser's queue to the service with binding calls and console
        // messages before it was turned off again.
        let origin = Self.origin(of: page.documentURL)
        guard origin.map(api.allowed.contains) ?? page.waiting else { return false }
        queueRuntime(session, &batch)
        return true
    }

    private func queueRuntime(_ session: String, _ batch: inout Batch) {
        pages[session]?.runtimeWanted = false
        pages[session]?.runtimeOn = true
        // Reports the contexts there are (`pageAPIEvent` keeps the top one).
        batch.send("Runtime.enable")
        batch.send("Runtime.addBinding", [("name", .string(PageAPI.binding))])
    }

    /// A document of an allowed origin whose scripts ran without the API
    /// (the browser loaded it before its launcher had attached it, or the
    /// tab came back from another origin) is loaded again, so that
    /// `guidedAccess` is there before its scripts, as in every other
    /// document. One a service before this one served has it, and is left
    /// as it is.
    private func reloadIfServedWithout(_ api: PageAPI, _ session: String, _ client: DevToolsClient) async {
        guard let page = pages[session], page.runtimeOn, let top = page.top, serves(page, api) else { return }
        do throws(DevToolsFailure) {
            let served = try await client.call(
                "Runtime.evaluate",
                [
                    ("expression", .string("Object.prototype.hasOwnProperty.call(window, \"guidedAccess\")")),
                    ("contextId", .number(String(top.id))), ("returnByValue", .bool(true)),
                ], session: session, timeout: Self.commandTimeout)
            guard served["result"]?["value"] == .bool(false), pages[session]?.top?.id == top.id else { return }
        } catch {
            return  // the document went meanwhile
        }
        log.log(.info, "browser layer: page \(page.targetID) (\(top.origin)) was loaded without the page API in it: loading it again")
        tell(client, "Page.reload", session: session)
    }

    /// `scheme://host[:port]` of an http(s) URL; nil for any other (an
    /// empty tab's, `about:blank`, `data:`).
    static func origin(of url: String) -> String? {
        let scheme = url.hasPrefix("https://") ? 8 : url.hasPrefix("http://") ? 7 : 0
        guard scheme > 0 else { return nil }
        let rest = url.dropFirst(scheme)
        let host = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        return String(url.prefix(scheme)) + host.lowercased()
    }

    /// Whether the page's top document is one the page API serves: its
    /// origin, as the browser reports its main world, is allowed, and it
    /// was loaded from there (not an empty document given that origin).
    private func serves(_ page: Page, _ api: PageAPI) -> Bool {
        guard let top = page.top, api.allowed.contains(top.origin) else { return false }
        return page.documentURL.hasPrefix(top.origin + "/")
    }

    /// The contexts of attached pages, and calls of the binding.
    fileprivate func pageAPIEvent(_ event: DevToolsEvent) {
        guard let api, let session = event.sessionID, let page = pages[session] else { return }
        switch event.method {
        case "Runtime.executionContextCreated":
            guard let context = event.params["context"], case .number(let idText)? = context["id"], let id = Int(idText),
                let auxData = context["auxData"], auxData["isDefault"] == .bool(true),
                auxData["frameId"]?.string == page.targetID
            else { return }
            // The tab's top document, main world: the only context that may call.
            let origin = context["origin"]?.string ?? ""
            pages[session]?.top = (id, origin)
            api.handlers.left(api.caller.uniqueName, page.targetID, origin)
            // Another origin's document (not a tab's first empty one): no
            // contexts, binding or console from it until the tab comes back.
            if !api.allowed.contains(origin), !origin.isEmpty, origin != "null", page.runtimeOn, let client {
                pages[session]?.runtimeOn = false
                pages[session]?.top = nil
                tell(client, "Runtime.disable", session: session)
            }
        case "Runtime.executionContextDestroyed":
            if case .number(let idText)? = event.params["executionContextId"], Int(idText) == page.top?.id {
                pages[session]?.top = nil
            }
        case "Runtime.executionContextsCleared":
            pages[session]?.top = nil
        case "Runtime.bindingCalled":
            guard event.params["name"]?.string == PageAPI.binding else { return }
            called(api, session, page, event.params)
        case "Page.frameStartedNavigating":
            // The tab is going somewhere: the Runtime domain on or off before
            // the document there runs its first script.
            guard event.params["frameId"]?.string == page.targetID, let url = event.params["url"]?.string,
                page.apiInstalled
            else { return }
            let allowed = Self.origin(of: url).map(api.allowed.contains) ?? false
            if allowed, !page.runtimeOn {
                pages[session]?.runtimeWanted = true
                _ = update(session)
            } else if !allowed, page.runtimeOn, let client, !url.hasPrefix("javascript:") {
                pages[session]?.runtimeOn = false
                pages[session]?.runtimeWanted = false
                pages[session]?.top = nil
                tell(client, "Runtime.disable", session: session)
            }
        case "Page.frameNavigated":
            guard let frame = event.params["frame"], frame["parentId"] == nil, let url = frame["url"]?.string else { return }
            pages[session]?.documentURL = url
            // At an allowed origin (a navigation that did not start as
            // `frameStartedNavigating` said): the Runtime domain on again.
            if !page.runtimeOn, let origin = frame["securityOrigin"]?.string, api.allowed.contains(origin) {
                pages[session]?.runtimeWanted = true
                _ = update(session)
            }
        case "Page.frameStoppedLoading":
            // A navigation away that did not happen (cancelled, failed): the
            // document still there is of an allowed origin.
            guard event.params["frameId"]?.string == page.targetID, !page.runtimeOn, page.apiInstalled,
                let origin = Self.origin(of: page.documentURL), api.allowed.contains(origin)
            else { return }
            pages[session]?.runtimeWanted = true
            _ = update(session)
        default:
            break
        }
    }

    /// A page called the binding: from the tab's top document of an allowed
    /// origin, as the browser says, it is a call; from anywhere else it is
    /// refused (logged, not answered).
    private func called(_ api: PageAPI, _ session: String, _ page: Page, _ params: JSON) {
        guard let client, case .number(let contextText)? = params["executionContextId"], let context = Int(contextText),
            case .string(let payload)? = params["payload"]
        else { return }
        guard let top = page.top, top.id == context, serves(page, api) else {
            let why =
                page.top?.id != context
                ? "not from the tab's top document (an iframe, another world, or a document gone)"
                : api.allowed.contains(page.top?.origin ?? "")
                    ? "the document was not loaded from its origin (\(bounded(page.documentURL, 80)))"
                    : "its origin \(bounded(page.top?.origin ?? "", 80)) is not in [Browser] AllowOrigins"
            refusals.log(.warning, "browser layer: page API call in page \(page.targetID) refused: \(why)")
            return
        }
        func answer(_ id: String, _ result: Result<JSON, GuidedAccessError>) {
            deliver(result, to: id, client, session, context)
        }
        // The id first: a call too big to read is still answered.
        guard let id = Self.callID(payload) else {
            log.log(.warning, "browser layer: page API call in page \(page.targetID) (\(top.origin)) is not a call: ignored")
            return
        }
        guard payload.utf8.count <= PageCallLimits.callBytes else {
            answer(id, .failure(.invalidArgs("the call's arguments are over \(PageCallLimits.callBytes >> 10) KiB")))
            return
        }
        guard page.outstanding < PageCallLimits.outstanding else {
            answer(id, .failure(.limitExceeded("\(PageCallLimits.outstanding) calls of this page already wait for their answers")))
            return
        }
        guard let call = try? JSON.parse(Array(payload.utf8)), case .string(let method)? = call["method"],
            case .array(let arguments)? = call["args"]
        else {
            answer(id, .failure(.invalidArgs("the call is not {id, method, args}")))
            return
        }
        var caller = api.caller
        caller.identity.origin = top.origin
        caller.tab = page.targetID
        pages[session]?.outstanding += 1
        let pageCall = PageCall(caller: caller, method: method, arguments: arguments)
        let targetID = page.targetID
        Task(executorPreference: loop) {
            let result = await api.handlers.call(pageCall)
            await self.answered(result, to: id, client, session, targetID, context)
        }
    }

    private func answered(
        _ result: Result<JSON, GuidedAccessError>, to id: String, _ client: DevToolsClient, _ session: String, _ targetID: String,
        _ context: Int
    ) {
        guard pages[session]?.targetID == targetID else { return }
        pages[session]?.outstanding -= 1
        // Only to the document that asked: not one the tab went on to.
        guard self.client === client, pages[session]?.top?.id == context else { return }
        deliver(result, to: id, client, session, context)
    }

    /// The answer to call `id`, into the context that made it.
    private func deliver(
        _ result: Result<JSON, GuidedAccessError>, to id: String, _ client: DevToolsClient, _ session: String, _ context: Int
    ) {
        let message: JSON
        switch result {
        case .success(let value): message = .object([("id", .number(id)), ("result", value)])
        case .failure(let error):
            let name = error.dbusErrorName.split(separator: ".").last.map(String.init) ?? error.dbusErrorName
            // A message may quote what the page sent (an identifier of
            // 60 KiB): at most 1,000 characters go back.
            message = .object([
                ("id", .number(id)),
                ("error", .object([("name", .string(name)), ("message", .string(bounded(error.message, 1000)))])),
            ])
        }
        tell(
            client, "Runtime.evaluate",
            [("expression", .string(PageAPI.delivery(message))), ("contextId", .number(String(context))), ("silent", .bool(true))],
            session: session)
    }

    /// `DevToolsClient.tell` from the layer's synchronous code: the client
    /// runs on the same loop.
    private func tell(_ client: DevToolsClient, _ method: String, _ params: [(String, JSON)] = [], session: String) {
        client.assumeIsolated { $0.tell(method, params, session: session) }
    }

    /// The call's `id`: `{"id":N,` at its start, as the page script writes
    /// it (N a whole number below 2^53).
    static func callID(_ payload: String) -> String? {
        let prefix = "{\"id\":"
        guard payload.hasPrefix(prefix) else { return nil }
        let digits = payload.utf8.dropFirst(prefix.utf8.count).prefix { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
        guard (1...15).contains(digits.count) else { return nil }
        return String(decoding: digits, as: UTF8.self)
    }

    /// Tells every allowed page's top document.
    package func tell(_ event: PageEvent) {
        guard let api, let client else { return }
        let (type, detail) = event.dom
        let expression = PageAPI.delivery(.object([("event", .string(type)), ("detail", detail)]))
        for (session, page) in pages {
            guard let top = page.top, serves(page, api) else { continue }
            tell(
                client, "Runtime.evaluate",
                [("expression", .string(expression)), ("contextId", .number(String(top.id))), ("silent", .bool(true))],
                session: session)
        }
    }
}

/// A page's commands sent back to back, their answers awaited in order
/// (`BrowserLayer.bringUpToDate`).
private struct Batch {
    let client: DevToolsClient
    let session: String
    let loop: EventLoop
    private var sent: [(answer: Task<Result<JSON, DevToolsFailure>, Never>, tolerated: Bool, then: ((JSON) -> Void)?)] = []

    init(client: DevToolsClient, session: String, loop: EventLoop) {
        self.client = client
        self.session = session
        self.loop = loop
    }

    /// Sends now; `then` runs with the answer, in order, in `finish`.
    mutating func send(
        _ method: String, _ params: [(String, JSON)] = [], tolerated: Bool = false, then: ((JSON) -> Void)? = nil
    ) {
        let client = self.client, session = self.session
        sent.append((Task(executorPreference: loop) { () -> Result<JSON, DevToolsFailure> in
            do throws(DevToolsFailure) {
                return .success(try await client.call(method, params, session: session, timeout: BrowserLayer.commandTimeout))
            } catch {
                return .failure(error)
            }
        }, tolerated, then))
    }

    /// Awaits every answer; throws the first failure not `tolerated`
    /// (those go to `note`).
    nonisolated(nonsending) func finish(note: (DevToolsFailure) -> Void) async throws(DevToolsFailure) {
        var failure: DevToolsFailure?
        for command in sent {
            switch await command.answer.value {
            case .success(let result): command.then?(result)
            case .failure(let error):
                if command.tolerated { note(error) } else if failure == nil { failure = error }
            }
        }
        if let failure { throw failure }
    }
}

/// A continuation resumed by whichever of several comes first.
private final class FirstOf: Sendable {
    private let continuation = Mutex<CheckedContinuation<Void, Never>?>(nil)

    func arm(_ continuation: CheckedContinuation<Void, Never>) {
        self.continuation.withLock { $0 = continuation }
    }

    func resume() {
        continuation.withLock { $0.take() }?.resume()
    }
}
