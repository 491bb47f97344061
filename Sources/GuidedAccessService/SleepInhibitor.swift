import DBus
import Glibc
import Logging

/// logind's `sleep:idle` inhibitor (mode `block`), held while a session
/// lasts: the kiosk must not suspend or blank in the middle of a visit.
/// Where logind is absent, that is logged, not an error.
final class SleepInhibitor {
    /// The system bus, where logind lives; nil when there is none.
    private let systemBus: @Sendable () async -> Connection?
    private let logger: Logger
    private var fd: Int32?
    /// Whether the session still wants it (it may end while logind answers).
    private var wanted = false

    init(systemBus: @escaping @Sendable () async -> Connection?, logger: Logger) {
        self.systemBus = systemBus
        self.logger = logger
    }

    func acquire(isolation: isolated (any Actor)? = #isolation) async {
        guard fd == nil, !wanted else { return }
        wanted = true
        guard let bus = await systemBus() else {
            logger.notice("no system bus: the session runs without a sleep inhibitor")
            return
        }
        do {
            let reply = try await bus.call(
                destination: "org.freedesktop.login1", path: "/org/freedesktop/login1",
                interface: "org.freedesktop.login1.Manager", member: "Inhibit",
                [
                    .string("sleep:idle"), .string("GuidedAccess"),
                    .string("A guided access session is active"), .string("block"),
                ],
                timeout: .seconds(5))
            guard case .unixFD(let received)? = reply.first else {
                logger.warning("logind's Inhibit answered without a descriptor; no sleep inhibitor")
                return
            }
            guard wanted, fd == nil else {
                close(received)  // the session ended while logind answered
                return
            }
            fd = received
            logger.info("holding logind's sleep:idle inhibitor")
        } catch {
            logger.notice("no sleep inhibitor from logind: \(error.message)")
        }
    }

    func release() {
        wanted = false
        guard let held = fd else { return }
        close(held)
        fd = nil
        logger.info("released logind's sleep:idle inhibitor")
    }

    deinit {
        if let fd { close(fd) }
    }
}
