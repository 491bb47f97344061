import GuidedAccessCore

/// Decides what the configuration's lists leave open: whether a caller may
/// perform a polkit action. Asked before any state changes, on every call
/// it decides (answers are not cached).
public protocol Authority: Sendable {
    /// Returns when the action is allowed; throws `notAuthorized` (or
    /// `interactiveAuthorizationRequired`) with a message saying why not.
    func authorize(action: String, busName: String, interactive: Bool) async throws(GuidedAccessError)
}

/// For a service that consults no polkit (user mode): everything the lists
/// do not admit is denied, and the message says so.
public struct ListsOnlyAuthority: Authority {
    public let reason: String

    public init(reason: String) {
        self.reason = reason
    }

    public func authorize(action: String, busName: String, interactive: Bool) async throws(GuidedAccessError) {
        throw .notAuthorized("\(busName) may not perform \(action): \(reason)")
    }
}
