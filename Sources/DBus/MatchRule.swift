/// A match rule for signals, as the bus daemon's AddMatch takes it; the same
/// rule filters signals locally, since one connection may hold several.
public struct MatchRule: Hashable, Sendable, CustomStringConvertible {
    public var sender: String?
    public var path: ObjectPath?
    public var interface: String?
    public var member: String?
    public var arg0: String?

    public init(
        sender: String? = nil, path: ObjectPath? = nil, interface: String? = nil, member: String? = nil,
        arg0: String? = nil
    ) {
        self.sender = sender
        self.path = path
        self.interface = interface
        self.member = member
        self.arg0 = arg0
    }

    /// The bus daemon's `NameOwnerChanged`, optionally for one name.
    public static func nameOwnerChanged(for name: String? = nil) -> MatchRule {
        MatchRule(
            sender: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "NameOwnerChanged", arg0: name)
    }

    /// The rule in the bus daemon's text form.
    public var description: String {
        var parts = ["type='signal'"]
        func add(_ key: String, _ value: String?) {
            guard let value else { return }
            // A quote inside a value is written as '\'' (close, escaped quote, reopen).
            var escaped = ""
            for c in value {
                if c == "'" { escaped += "'\\''" } else { escaped.append(c) }
            }
            parts.append("\(key)='\(escaped)'")
        }
        add("sender", sender)
        add("path", path?.rawValue)
        add("interface", interface)
        add("member", member)
        add("arg0", arg0)
        return parts.joined(separator: ",")
    }

    /// Whether a received signal matches. A well-known sender name cannot be
    /// compared locally (messages carry the unique name); the bus daemon has
    /// already applied that part of the rule to what it routes to us.
    public func matches(_ message: Message) -> Bool {
        guard message.kind == .signal else { return false }
        if let sender, sender.hasPrefix(":") || sender == "org.freedesktop.DBus" {
            guard message.sender == sender else { return false }
        }
        if let path, message.path != path.rawValue { return false }
        if let interface, message.interface != interface { return false }
        if let member, message.member != member { return false }
        if let arg0 {
            guard case .string(let first)? = try? message.arguments().first, first == arg0 else { return false }
        }
        return true
    }
}

/// Returned by `subscribe`; pass it to `unsubscribe`.
public struct SubscriptionToken: Hashable, Sendable {
    let id: UInt64
    let rule: MatchRule
}

extension Connection {
    /// Asks the bus for signals matching `rule` and calls `handler` with each
    /// one, on this connection's executor, in the order they arrive.
    public func subscribe(
        _ rule: MatchRule, handler: @escaping @Sendable (Message) -> Void
    ) async throws(DBusError) -> SubscriptionToken {
        let id = nextSubscriptionID
        nextSubscriptionID += 1
        subscriptions[id] = Subscription(rule: rule, handler: handler)
        do {
            _ = try await callBus("AddMatch", [.string(rule.description)])
        } catch {
            subscriptions[id] = nil
            throw error
        }
        return SubscriptionToken(id: id, rule: rule)
    }

    public func unsubscribe(_ token: SubscriptionToken) async {
        guard subscriptions.removeValue(forKey: token.id) != nil else { return }
        _ = try? await callBus("RemoveMatch", [.string(token.rule.description)])
    }

    /// Signals matching `rule` as an async sequence. The subscription ends
    /// when the sequence's consumer stops iterating.
    public func signals(matching rule: MatchRule) async throws(DBusError) -> AsyncStream<Message> {
        let (stream, continuation) = AsyncStream<Message>.makeStream(bufferingPolicy: .unbounded)
        let token = try await subscribe(rule) { continuation.yield($0) }
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            Task(executorPreference: self.loop) { await self.unsubscribe(token) }
        }
        return stream
    }
}
