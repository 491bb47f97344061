import Logging

/// The browser layer's log lines about its peer, rate-limited: whatever the
/// peer does (flaps, floods, sends what is not DevTools), it costs the log
/// no more than a burst of `burst` lines and then one line every `interval`.
/// The lines not written are counted, and the next line written says how
/// many. Strings the peer chose go in cut (`bounded`); the daemon's log
/// handler escapes them.
///
/// Loop thread only (the actors of the browser layer run there).
final class PeerLog: @unchecked Sendable {
    let logger: Logger
    static let burst = 5.0
    static let interval: Duration = .seconds(2)
    private var tokens = PeerLog.burst
    private var refilled = ContinuousClock.now
    private var dropped = 0

    init(_ logger: Logger) { self.logger = logger }

    func log(_ level: Logger.Level, _ message: @autoclosure () -> String) {
        guard level >= logger.logLevel else { return }
        let now = ContinuousClock.now
        tokens = min(Self.burst, tokens + (now - refilled) / Self.interval)
        refilled = now
        guard tokens >= 1 else {
            dropped += 1
            return
        }
        tokens -= 1
        let note = dropped > 0 ? " (\(dropped) more lines about the browser were not logged)" : ""
        dropped = 0
        logger.log(level: level, "\(message())\(note)")
    }
}
