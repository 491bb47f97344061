import DBus
import Glibc
import GuidedAccessCore
import GuidedAccessWire
import Logging

/// The session agent as one more driver of the system service (spec 1.2,
/// section 1): it admits agents (`AgentRegistry`), tells what the
/// registered one delivers in the kiosk user's session (its
/// `SupportedFeatures` and `Desktop`), and sends it the session's features
/// (`Apply`) — in the transaction, and again whenever an agent registers.
///
/// Ending never waits for an agent: with none registered, `apply` has
/// nothing to do, and the next agent is sent the state as it is then
/// (`Apply([])` outside a session), which stops what it still runs. An
/// `Apply` that fails, takes longer than `AgentBus.applyTimeoutSeconds`, or
/// whose agent leaves before answering fails the caller's call
/// (`BackendFailed`), and the store undoes the whole call — sending the
/// agent the previous state.
///
/// Calls to the agent take turns (first come, first served), so that what
/// it is sent arrives in the order it was decided. Used on the service's
/// executor only, like every driver.
public final class AgentProxyDriver: FeatureDriver, AgentRegistry, BrowserAttaching, @unchecked Sendable {
    public let name = "session-agent"
    /// The system bus.
    private let connection: Connection
    private let logger: Logger
    /// `[Agent] AllowUsers=`; nil: the user of seat0's active session.
    private let allowedUIDs: Set<UInt32>?
    /// The uid of the user of seat0's active graphical session, as logind
    /// said last (`fresh: false`), or as it says now (`fresh: true`).
    private let seatUser: nonisolated(nonsending) (_ fresh: Bool) async -> UInt32?
    /// Told whether an agent speaks for the session now (the seat's desktop
    /// driver stands aside while one does), before `events` hears of it.
    private let presence: (Bool) -> Void

    private var agent: Agent?
    /// What the agent last reported; kept across a replacement until the
    /// new one has reported, so that support does not flap.
    private var view: View?
    /// What the session wants of the agent now, and what was last sent to
    /// which agent and answered.
    private var wanted = DriverTarget.none
    private var sent: Sent?
    private let calls = Turns()
    private var events: (@Sendable (DriverEvent) -> Void)?
    private var followers: [(AgentChange) -> Void] = []

    private struct Agent {
        let caller: BusCaller
        let user: String
        var watches: [SubscriptionToken] = []
        var uniqueName: String { caller.uniqueName }
        var uid: UInt32 { caller.identity.uid }
        /// For messages: `the session agent of kiosk (pid 812)`.
        var title: String { "the session agent of \(user) (pid \(caller.identity.pid))" }
    }

    private struct View: Equatable {
        var supported: Set<Feature> = []
        var reasons: [Feature: String] = [:]
        var desktop = "none"
    }

    private struct Sent: Equatable {
        var agent: String
        var features: Set<Feature>
        var zoomFactor: Double
        var textScale: Double
    }

    public init(
        connection: Connection, allowedUIDs: Set<UInt32>?, seatUser: nonisolated(nonsending) @escaping (_ fresh: Bool) async -> UInt32?,
        presence: @escaping (Bool) -> Void, logger: Logger
    ) {
        self.connection = connection
        self.allowedUIDs = allowedUIDs
        self.seatUser = seatUser
        self.presence = presence
        self.logger = logger
    }

    // MARK: What it delivers

    package var capabilities: [Feature: FeatureCapability] {
        guard let view, let agent else { return [:] }
        var capabilities: [Feature: FeatureCapability] = [:]
        for feature in Feature.allCases {
            if view.supported.contains(feature) {
                capabilities[feature] = .delivers(.wholeScreen)
            } else {
                let why = view.reasons[feature] ?? "not delivered in the session"
                capabilities[feature] = .unavailable("\(why) (in the session of \(agent.user), as its agent reports)")
            }
        }
        return capabilities
    }

    package var desktopPart: DesktopPart? { view.map { .desktop($0.desktop) } }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {
        self.events = events
    }

    // MARK: Registration

    /// The registered agent's user once what it delivers is known (its
    /// properties read), so that `Agent` and `SupportedFeatures` change
    /// together: a client that sees the agent finds its features.
    package var agentUser: String { view == nil ? "" : agent?.user ?? "" }

    package var agentCaller: BusCaller? { agent?.caller }

    package func follow(_ handler: @escaping (AgentChange) -> Void) {
        followers.append(handler)
    }

    package nonisolated(nonsending) func register(_ caller: BusCaller) async throws(GuidedAccessError) -> AgentRegistration {
        let uid = caller.identity.uid
        // An agent registers when it sees seat0 change, which the service
        // may not have heard of yet: a refusal by seat is checked with
        // logind itself before it is given.
        var why = refusal(of: uid, seatUser: await seatUser(false))
        if why != nil, allowedUIDs == nil, uid != 0 { why = refusal(of: uid, seatUser: await seatUser(true)) }
        if let why { throw .notAuthorized(why) }
        let user = Self.userName(uid)
        var new = Agent(caller: caller, user: user)
        let loop = connection.loop
        let name = caller.uniqueName
        do {
            new.watches.append(
                try await connection.subscribe(.nameOwnerChanged(for: name)) { [self] message in
                    guard let arguments = try? message.arguments(), arguments.count == 3,
                        case .string(let newOwner) = arguments[2], newOwner.isEmpty
                    else { return }
                    Task(executorPreference: loop) { await self.left(name) }
                })
            new.watches.append(
                try await connection.subscribe(
                    MatchRule(
                        sender: name, path: AgentBus.objectPath, interface: "org.freedesktop.DBus.Properties",
                        member: "PropertiesChanged")
                ) { [self] _ in
                    Task(executorPreference: loop) { await self.readProperties(of: name) }
                })
            new.watches.append(
                try await connection.subscribe(
                    MatchRule(
                        sender: name, path: AgentBus.objectPath, interface: AgentBus.interface,
                        member: AgentSignal.featureLost.rawValue)
                ) { [self] message in
                    guard let arguments = try? message.arguments(), arguments.count == 3,
                        case .string(let wireName) = arguments[0], let feature = Feature(rawValue: wireName),
                        case .string(let text) = arguments[1], case .dictionary(.string, .string, let entries) = arguments[2]
                    else { return }
                    var fields: [String: String] = [:]
                    for entry in entries.prefix(16) {
                        if case .string(let key) = entry.key, case .string(let value) = entry.value { fields[key] = value }
                    }
                    Task(executorPreference: loop) { await self.lost(feature, text, fields, from: name) }
                })
        } catch {
            for watch in new.watches { await connection.unsubscribe(watch) }
            throw .backendFailed("cannot follow the session agent \(name) on the bus: \(error)")
        }
        // It may have left while the watches were set up.
        guard (try? await connection.nameOwner(name)) == name else {
            for watch in new.watches { await connection.unsubscribe(watch) }
            throw .notAuthorized("\(name) left the bus while it registered")
        }
        // Only now, with the new one followed and present, is the old one
        // replaced (and one registering while this one waited, too).
        var replaced: AgentRegistration.Replaced?
        while let old = agent {
            let tookOver = old.uid == uid
            replaced = .init(caller: old.caller, user: old.user, tookOver: tookOver)
            await forget(old)
            if !tookOver { release(old, because: "the session agent of \(user) replaced it") }
        }
        agent = new
        sent = nil
        logger.notice(
            "session agent: \(new.title), \(name), registered\(replaced.map { $0.tookOver ? " (taking over from \($0.caller.uniqueName))" : " (replacing the agent of \($0.user))" } ?? "")"
        )
        // After the reply: what it delivers, then the state.
        Task(executorPreference: loop) { [self] in
            await readProperties(of: name)
            do throws(DriverFailure) {
                try await sendWanted()
            } catch {
                logger.error("session agent: sending the state to \(new.title): \(error.message)")
            }
        }
        return AgentRegistration(user: user, replaced: replaced)
    }

    /// Why `uid` may not be the agent now, or nil.
    private func refusal(of uid: UInt32, seatUser seat: UInt32?) -> String? {
        let who = "uid \(uid) (\(Self.userName(uid)))"
        guard uid != 0 else {
            return "root is never the session agent: the agent runs as the kiosk user, in its graphical session"
        }
        if let allowed = allowedUIDs {
            guard allowed.contains(uid) else {
                let names = allowed.sorted().map { "\(Self.userName($0))" }.joined(separator: ", ")
                return "\(who) may not register as the session agent: [Agent] AllowUsers= admits \(names.isEmpty ? "no one" : names)"
            }
            return nil
        }
        guard let seat else {
            return "\(who) may not register as the session agent: logind reports no graphical session on seat0, and [Agent] AllowUsers= is not set"
        }
        guard seat == uid else {
            return "\(who) may not register as the session agent: logind's active session on seat0 is uid \(seat)'s (\(Self.userName(seat))), and [Agent] AllowUsers= is not set"
        }
        return nil
    }

    /// seat0's active session changed: without `[Agent] AllowUsers=`, an
    /// agent whose user no longer has it is released and forgotten.
    public func seatChanged() {
        guard allowedUIDs == nil, let agent else { return }
        let loop = connection.loop
        Task(executorPreference: loop) { [self] in
            guard let why = refusal(of: agent.uid, seatUser: await seatUser(false)) else { return }
            guard self.agent?.uniqueName == agent.uniqueName else { return }
            release(agent, because: why)
            await lose(agent, reason: "no longer admitted: \(why)")
        }
    }

    /// The agent's `FeatureLost`: passed on to the service, which audits it.
    private nonisolated(nonsending) func lost(_ feature: Feature, _ message: String, _ fields: [String: String], from name: String) async {
        guard let agent, agent.uniqueName == name else { return }
        let user = agent.user
        events?(.featureLost(feature, message: "\(message) (in the session of \(user), as its agent reports)", fields: fields.merging(["AGENT_USER": user]) { $1 }))
    }

    private nonisolated(nonsending) func left(_ name: String) async {
        guard let agent, agent.uniqueName == name else { return }
        await lose(agent, reason: "it left the bus")
    }

    private nonisolated(nonsending) func lose(_ agent: Agent, reason: String) async {
        await forget(agent)
        view = nil
        logger.notice("session agent: \(agent.title), \(agent.uniqueName), lost: \(reason)")
        presence(false)
        for follower in followers { follower(.lost(agent.caller, user: agent.user, reason: reason)) }
        events?(.changed)
    }

    private nonisolated(nonsending) func forget(_ old: Agent) async {
        if agent?.uniqueName == old.uniqueName { agent = nil }
        sent = nil
        for watch in old.watches { await connection.unsubscribe(watch) }
    }

    /// Sends `Release()` to an agent no longer wanted, without waiting.
    private func release(_ old: Agent, because why: String) {
        let connection = connection
        let logger = logger
        Task(executorPreference: connection.loop) {
            do {
                _ = try await connection.call(
                    destination: old.uniqueName, path: AgentBus.objectPath,
                    interface: AgentBus.interface, member: AgentMethod.release.rawValue,
                    timeout: .seconds(AgentBus.applyTimeoutSeconds))
                logger.notice("session agent: \(old.title) released: \(why)")
            } catch {
                logger.warning("session agent: \(old.title) did not take Release() (\(error)): \(why)")
            }
        }
    }

    /// The agent's properties, read anew (at its registration, and when it
    /// announces a change).
    private nonisolated(nonsending) func readProperties(of name: String) async {
        guard agent?.uniqueName == name else { return }
        let reply: [DBusValue]
        do {
            reply = try await connection.call(
                destination: name, path: AgentBus.objectPath,
                interface: "org.freedesktop.DBus.Properties", member: "GetAll", [.string(AgentBus.interface)],
                timeout: .seconds(AgentBus.applyTimeoutSeconds))
        } catch {
            logger.error("session agent: cannot read what \(name) delivers: \(error)")
            return
        }
        guard agent?.uniqueName == name, case .dictionary(_, _, let entries)? = reply.first else { return }
        var new = View()
        for entry in entries {
            guard case .string(let property) = entry.key, case .variant(let value) = entry.value else { continue }
            switch (AgentProperty(rawValue: property), value) {
            case (.supportedFeatures?, .array(.string, let names)):
                // A newer agent's features this service does not know are left out.
                new.supported = Set(names.compactMap { if case .string(let n) = $0 { Feature(rawValue: n) } else { nil } })
            case (.desktop?, .string(let desktop)):
                new.desktop = desktop
            case (.unsupportedReasons?, .dictionary(.string, .string, let reasons)):
                for reason in reasons {
                    if case .string(let n) = reason.key, let feature = Feature(rawValue: n), case .string(let why) = reason.value {
                        new.reasons[feature] = why
                    }
                }
            default:
                continue
            }
        }
        guard new != view else { return }
        let first = view == nil
        view = new
        logger.info(
            "session agent: \(agent!.user)'s session: desktop \(new.desktop), delivers \(new.supported.sortedWireNames.joined(separator: ", "))"
        )
        if first { presence(true) }
        events?(.changed)
    }

    // MARK: The kiosk browser

    /// `AttachBrowser` in system mode: the launcher's socket goes on to the
    /// agent, whose browser driver takes it (the service has no network and
    /// is not the kiosk user).
    package nonisolated(nonsending) func attach(_ caller: BusCaller, descriptor: Int32) async throws(GuidedAccessError) -> String {
        defer { UnixFD.close(descriptor) }  // the message carries a copy
        guard let agent else {
            throw .other(
                name: "org.freedesktop.DBus.Error.NotSupported",
                message:
                    "no session agent is registered: in system mode the kiosk browser is driven by the session agent (guidedaccess-agent.service in the kiosk user's session)")
        }
        // The kiosk user's browser only: the agent would give another
        // user's browser to the kiosk user's session, and the other way round.
        guard caller.identity.uid == agent.uid else {
            throw .notAuthorized(
                "the session agent acts for \(agent.user) (uid \(agent.uid)); a browser of uid \(caller.identity.uid) is not attached to its session: run the launcher as \(agent.user)")
        }
        let reply: [DBusValue]
        do {
            reply = try await connection.call(
                destination: agent.uniqueName, path: AgentBus.objectPath, interface: AgentBus.interface,
                member: AgentMethod.attachBrowser.rawValue,
                [.unixFD(descriptor), .string(caller.uniqueName), .uint32(caller.identity.uid)], timeout: .seconds(5))
        } catch {
            throw GuidedAccessError(error)
        }
        guard case .string(let product)? = reply.first else {
            throw .other(name: "org.freedesktop.DBus.Error.Failed", message: "the session agent's AttachBrowser replied with no product")
        }
        return product
    }

    // MARK: The transaction

    package nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool {
        wanted = target
        try await sendWanted()
        return false
    }

    /// Sends the agent what the session wants, unless it has it already.
    private nonisolated(nonsending) func sendWanted() async throws(DriverFailure) {
        await calls.take()
        defer { calls.give() }
        guard let agent else { return }
        let target = wanted
        let next = Sent(
            agent: agent.uniqueName, features: target.features, zoomFactor: target.zoomFactor,
            textScale: target.textScale)
        guard sent != next else { return }
        sent = nil
        let started = ContinuousClock.now
        do {
            _ = try await connection.call(
                destination: agent.uniqueName, path: AgentBus.objectPath,
                interface: AgentBus.interface, member: AgentMethod.apply.rawValue,
                [
                    .array(.string, target.features.sortedWireNames.map(DBusValue.string)),
                    .dictionary(
                        key: .string, value: .variant,
                        [
                            .init(.string(AgentBus.textScaleParameter), .variant(.double(target.textScale))),
                            .init(.string(AgentBus.zoomFactorParameter), .variant(.double(target.zoomFactor))),
                        ]),
                ], timeout: .seconds(AgentBus.applyTimeoutSeconds))
        } catch {
            throw DriverFailure(.failed, failure(of: agent, error, after: ContinuousClock.now - started))
        }
        if self.agent?.uniqueName == agent.uniqueName { sent = next }
    }

    /// What the caller is told when `Apply` failed `after` it was sent. The
    /// bus answers `NoReply` both when the call timed out and when the agent
    /// disconnected without replying (before its NameOwnerChanged arrives):
    /// the time tells them apart.
    private func failure(of agent: Agent, _ error: DBusError, after elapsed: Duration) -> String {
        let gone = self.agent?.uniqueName != agent.uniqueName
            || (error.name == "org.freedesktop.DBus.Error.NoReply"
                && elapsed < .seconds(AgentBus.applyTimeoutSeconds) - .milliseconds(500))
        switch error.name {
        case AgentBus.failedError:
            return error.message
        case _ where gone,
            "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner",
            "org.freedesktop.DBus.Error.Disconnected":
            return "\(agent.title) left before it answered"
        case "org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.TimedOut", "org.freedesktop.DBus.Error.Timeout":
            return "\(agent.title) did not answer within \(AgentBus.applyTimeoutSeconds) s"
        default:
            return "\(agent.title): \(error)"
        }
    }

    // MARK: The journal

    /// The agent keeps what it runs in its own state directory.
    package var record: JSON? { nil }

    package nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote] {
        // Sent to the agent when it registers.
        wanted = target ?? .none
        return []
    }

    // MARK: Users

    /// The name of user `uid`, or its number when it has none.
    static func userName(_ uid: UInt32) -> String {
        SystemUsers.name(of: uid) ?? String(uid)
    }
}
