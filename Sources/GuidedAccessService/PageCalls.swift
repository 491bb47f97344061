import DBus
import Glibc
import GuidedAccessAPI
import GuidedAccessCore

/// (1.2) The page API: `window.guidedAccess` in the kiosk browser's pages
/// of `[Browser] AllowOrigins=`. The driver of the pages checks who calls
/// (the tab's top document, its origin as the browser reports it) and
/// hands the call here; it is answered by the same handlers as the bus's,
/// as a client (never polkit, never an operator), with the tab as the
/// caller. What the session does is told to every allowed page.
extension GuidedAccessService {
    /// Starts serving pages where a driver does.
    func servePages() {
        guard let pages, pages.servesPages else { return }
        let loop = connection.loop
        pages.servePages(
            endpointCaller: BusCaller(uniqueName: connection.uniqueName, identity: Self.ownIdentity()),
            PageHandlers(
                call: { [self] call in await pageCall(call) },
                left: { [self] launcher, tab, origin in
                    Task(executorPreference: loop) { await self.pageLeft(launcher, tab: tab, nowAt: origin) }
                }))
    }

    /// The service as a caller: a page of the `DevToolsEndpoint` browser
    /// calls as the service with its origin.
    private static func ownIdentity() -> CallerIdentity {
        var buffer = [CChar](repeating: 0, count: 4097)
        let n = readlink("/proc/self/exe", &buffer, 4096)
        let path = n > 0 ? String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "/proc/self/exe"
        let executable = FileIdentity(atPath: "/proc/self/exe").map { Executable(path: path, file: $0) }
        return CallerIdentity(uid: geteuid(), gids: [getegid()], pid: UInt32(getpid()), executable: executable)
    }

    /// One call of a page: its answer, or the error the page's promise
    /// rejects with. A refusal is audited as a bus caller's is.
    func pageCall(_ call: PageCall) async -> Result<JSON, GuidedAccessError> {
        do {
            return .success(try await answer(call))
        } catch let error as GuidedAccessError {
            switch error {
            case .notAuthorized, .interactiveAuthorizationRequired:
                settings.audit.record(
                    .callDenied, caller: call.caller.identity,
                    "page call \(call.method) from \(call.caller.identity.origin ?? "?") denied: \(error.message)",
                    fields: ["METHOD": call.method, "ERROR": error.dbusErrorName])
            default:
                break
            }
            return .failure(error)
        } catch {
            return .failure(.backendFailed("\(error)"))
        }
    }

    private func answer(_ call: PageCall) async throws -> JSON {
        let page = Requester.page(call.caller)
        let arguments = PageArguments(method: call.method, call.arguments)
        switch call.method {
        case "startSession":
            try arguments.count(0...1)
            let (parameters, hasOptions) = try arguments.sessionOptions(at: 0, defaults: settings.defaults)
            try await startSession(page, parameters, hasOptions: hasOptions)
            return .null
        case "configureForSession":
            try arguments.count(2...2)
            try await configureForSession(page, try arguments.strings(at: 0, "features"), try arguments.bool(at: 1, "enabled"))
            return .array((session?.features ?? []).sortedWireNames.map(JSON.string))
        case "endSession":
            try arguments.count(0...0)
            try await endSessionCall(page)
            return .null
        case "getState":
            try arguments.count(0...0)
            return .object([
                ("sessionActive", .bool(session != nil)),
                ("enabledFeatures", .array((session?.features ?? []).sortedWireNames.map(JSON.string))),
                ("supportedFeatures", .array(supportedFeatures.map(JSON.string))),
                ("desktop", .string(desktop)),
                ("sessionDeadline", .number(String((session?.deadlineUsec ?? 0) / 1000))),
            ])
        case "registerRestrictions":
            try arguments.count(1...1)
            try await registerRestrictions(page, try arguments.restrictions(at: 0))
            return .null
        case "unregisterRestrictions":
            try arguments.count(1...1)
            try await unregisterRestrictions(page, try arguments.strings(at: 0, "ids"))
            return .null
        case "restrictionState":
            try arguments.count(1...1)
            return .string(try restrictionState(try arguments.string(at: 0, "id")).rawValue)
        default:
            throw GuidedAccessError.invalidArgs("guidedAccess has no method '\(bounded(call.method))'")
        }
    }

    /// An owning page is gone (its tab closed or left the owner's origin,
    /// or its browser went): the session goes on for a successor.
    func pageLeft(_ launcher: String, tab: String?, nowAt origin: String?) async {
        guard let session, session.owner == launcher, let ownerTab = session.ownerTab, tab == nil || tab == ownerTab else { return }
        // A reload, or a page of the same origin in that tab: still the owner.
        if tab != nil, let origin, origin == session.ownerIdentity.origin { return }
        if let problem = store.note({ $0.pageLeft(launcher, tab: tab) }) { logger.error("\(problem)") }
        logger.notice(
            "the page \(session.ownerIdentity.origin ?? "") that owns the session is gone (\(tab == nil ? "its browser went" : origin == nil ? "its tab closed" : "its tab left for another origin")); the session stays for its successor")
        await announce()
    }

    /// What every allowed page hears; the bus hears it through the signals
    /// and PropertiesChanged.
    func tellPages(_ event: PageEvent) {
        guard let pages, pages.servesPages else { return }
        pages.tellPages(event)
    }

    /// `featureschange` when the session's features are not what pages were told last.
    func tellPagesOfFeatures() {
        let now = (session?.features ?? []).sortedWireNames
        guard now != featuresToldPages else { return }
        featuresToldPages = now
        tellPages(.featuresChanged(now))
    }
}

// MARK: System mode: the pages of the session agent's browsers

extension GuidedAccessService {
    /// `PageCall(s call) → s answer`: the session agent hands on a call of
    /// a page of a browser it drives, as JSON `{launcher, tab, origin,
    /// method, args}`; the answer is the call's value as JSON, or the
    /// call's error. Only the registered agent may call it; the origin
    /// must be one of the service's own `[Browser] AllowOrigins=`, and the
    /// launcher one that attached a browser here (or the agent itself, for
    /// its `DevToolsEndpoint`): the agent says which page calls, the
    /// service decides who that is.
    func agentPageCall(_ call: MethodCall, _ text: String) async throws -> String {
        let agent = try requireAgent(call)
        guard text.utf8.count <= PageCallLimits.callBytes + 4096, let json = try? JSON.parse(Array(text.utf8)),
            case .string(let launcher)? = json["launcher"], case .string(let tab)? = json["tab"],
            case .string(let origin)? = json["origin"], case .string(let method)? = json["method"],
            case .array(let arguments)? = json["args"]
        else {
            throw GuidedAccessError.invalidArgs("PageCall takes {launcher, tab, origin, method, args} as JSON")
        }
        let caller = try pageCaller(launcher: launcher, tab: tab, origin: origin, agent: agent)
        switch await pageCall(PageCall(caller: caller, method: method, arguments: arguments)) {
        case .success(let value): return String(decoding: value.compactBytes(), as: UTF8.self)
        case .failure(let error): throw error
        }
    }

    /// `PageLeft(s launcher, s tab, s origin)`: a tab closed (`origin` ""),
    /// went to `origin`, or the browser went (`tab` "").
    ///
    /// A launcher's browser going is not taken from the agent: the service
    /// sees the launcher leave the bus itself, and a process of the agent's
    /// user must not drop a page's ownership by naming its launcher. A tab
    /// it must name, which the bus never shows.
    func agentPageLeft(_ call: MethodCall, _ launcher: String, _ tab: String, _ origin: String) async throws {
        let agent = try requireAgent(call)
        guard !tab.isEmpty || launcher == agent.uniqueName else { return }
        await pageLeft(launcher, tab: tab.isEmpty ? nil : tab, nowAt: origin.isEmpty ? nil : origin)
    }

    private func requireAgent(_ call: MethodCall) throws(GuidedAccessError) -> BusCaller {
        guard let agent = agents?.agentCaller, agent.uniqueName == call.sender else {
            throw .notAuthorized("only the registered session agent hands on the calls of pages (\(call.sender) is not it)")
        }
        return agent
    }

    private func pageCaller(launcher: String, tab: String, origin: String, agent: BusCaller) throws(GuidedAccessError) -> BusCaller {
        guard settings.allowedOrigins.contains(origin) else {
            throw .notAuthorized("the origin \(bounded(origin)) is not in the service's [Browser] AllowOrigins")
        }
        guard !tab.isEmpty, tab.utf8.count <= 64 else { throw .invalidArgs("the page's tab is not a target id") }
        var caller: BusCaller
        if launcher == agent.uniqueName {
            caller = agent
        } else if let attached = launchers[launcher], attached.identity.uid == agent.identity.uid {
            // A launcher of the agent's user (AttachBrowser passes on only
            // those): never another user's, whose identity this would borrow.
            caller = attached
        } else {
            throw .notAuthorized("\(bounded(launcher)) attached no browser to this service")
        }
        caller.identity.origin = origin
        caller.tab = tab
        return caller
    }
}

/// (1.2, system mode) The launchers that attached a browser, by unique
/// name: at most 16, the oldest forgotten first (the agent drives at most 8).
struct Launchers {
    private var entries: [BusCaller] = []

    mutating func note(_ caller: BusCaller) {
        entries.removeAll { $0.uniqueName == caller.uniqueName }
        entries.append(caller)
        if entries.count > 16 { entries.removeFirst(entries.count - 16) }
    }

    subscript(name: String) -> BusCaller? { entries.last { $0.uniqueName == name } }
}

/// A page's arguments (JSON, as the page passed them), checked as the
/// bus's are by their signature: InvalidArgs naming what is wrong.
private struct PageArguments {
    let method: String
    let values: [JSON]

    init(method: String, _ values: [JSON]) {
        self.method = method
        self.values = values
    }

    func count(_ range: ClosedRange<Int>) throws(GuidedAccessError) {
        guard range.contains(values.count) else {
            let wanted = range.lowerBound == range.upperBound ? "\(range.lowerBound)" : "\(range.lowerBound) or \(range.upperBound)"
            throw .invalidArgs("\(method) takes \(wanted) arguments, not \(values.count)")
        }
    }

    private func fail(_ what: String, _ expected: String) -> GuidedAccessError {
        .invalidArgs("\(method): \(what) must be \(expected)")
    }

    func string(at index: Int, _ name: String) throws(GuidedAccessError) -> String {
        guard case .string(let s) = values[index] else { throw fail(name, "a string") }
        return s
    }

    func bool(at index: Int, _ name: String) throws(GuidedAccessError) -> Bool {
        guard case .bool(let b) = values[index] else { throw fail(name, "true or false") }
        return b
    }

    func strings(at index: Int, _ name: String) throws(GuidedAccessError) -> [String] {
        try Self.strings(values[index], name, method)
    }

    static func strings(_ value: JSON, _ name: String, _ method: String) throws(GuidedAccessError) -> [String] {
        guard case .array(let items) = value else { throw .invalidArgs("\(method): \(name) must be an array of strings") }
        var strings: [String] = []
        for item in items {
            guard case .string(let s) = item else { throw .invalidArgs("\(method): \(name) must be an array of strings") }
            strings.append(s)
        }
        return strings
    }

    /// `{features, timeLimit, zoomFactor, textScale, inhibitSleep}` as
    /// StartSession's options; whether any was given.
    func sessionOptions(at index: Int, defaults: SessionDefaults) throws(GuidedAccessError) -> (SessionParameters, Bool) {
        guard index < values.count, values[index] != .null else {
            return (try SessionParameters(parsing: [:], defaults: defaults), false)
        }
        guard case .object(let members) = values[index] else { throw fail("options", "an object") }
        var options: [String: OptionValue] = [:]
        for (key, value) in members {
            switch key {
            case "features":
                options[SessionOptionKey.features.rawValue] = .stringArray(try Self.strings(value, "options.features", method))
            case "timeLimit":
                guard case .number(let text) = value, let seconds = UInt64(text) else {
                    throw fail("options.timeLimit", "a whole number of seconds, 0 or more")
                }
                options[SessionOptionKey.timeLimit.rawValue] = .uint64(seconds)
            case "zoomFactor", "textScale":
                guard case .number(let text) = value, let number = Double(text) else { throw fail("options.\(key)", "a number") }
                options[(key == "zoomFactor" ? SessionOptionKey.zoomFactor : SessionOptionKey.textScale).rawValue] = .double(number)
            case "inhibitSleep":
                guard case .bool(let b) = value else { throw fail("options.inhibitSleep", "true or false") }
                options[SessionOptionKey.inhibitSleep.rawValue] = .bool(b)
            default:
                throw .invalidArgs(
                    "\(method): unknown option '\(bounded(key))' (known: features, timeLimit, zoomFactor, textScale, inhibitSleep)")
            }
        }
        return (try SessionParameters(parsing: options, defaults: defaults), !members.isEmpty)
    }

    /// `[{id, text, detailText}]`.
    func restrictions(at index: Int) throws(GuidedAccessError) -> [RestrictionRegistration] {
        guard case .array(let items) = values[index] else { throw fail("restrictions", "an array of {id, text, detailText}") }
        var batch: [RestrictionRegistration] = []
        for item in items {
            guard case .string(let id)? = item["id"], case .string(let text)? = item["text"] else {
                throw fail("each restriction", "an object with string id and text (and detailText)")
            }
            var detail = ""
            if let value = item["detailText"] {
                guard case .string(let d) = value else { throw fail("detailText", "a string") }
                detail = d
            }
            batch.append(RestrictionRegistration(identifier: id, text: text, detail: detail))
        }
        return batch
    }
}

/// At most 100 characters of what a page sent, for a message.
private func bounded(_ text: String) -> String {
    text.count <= 100 ? text : text.prefix(100) + "…"
}
