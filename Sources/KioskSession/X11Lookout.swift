import DBus
import GuidedAccessCore

/// What the two drivers of a bare X display (`X11CompositorDriver`,
/// `X11SettingsDriver`) share: asking the session's X server who holds the
/// selection their program would take — when the desktop is x11 and their
/// program does not run; again when the display changes, a client reads
/// `SupportedFeatures`, or a caller asks for one of their features — and
/// what they deliver given the answer. One question at a time; questions
/// meanwhile make one more.
final class X11Lookout: @unchecked Sendable {
    let desktop: SessionDesktopDriver
    let kind: ProgramKind
    let features: Set<Feature>
    private let reach: FeatureCapability.Reach
    private let loop: EventLoop
    /// Why an answer keeps the program from running (a selection's owner
    /// that is not the service's, no GLX), or nil.
    private let refusal: @Sendable (X11DisplayFacts) -> String?
    /// What the X server said when last asked, or why it could not be asked.
    private(set) var facts: Result<X11DisplayFacts, X11Error>?
    private let asking = OneAtATime()

    init(
        _ kind: ProgramKind, features: Set<Feature>, reach: FeatureCapability.Reach, desktop: SessionDesktopDriver,
        loop: EventLoop, refusal: @escaping @Sendable (X11DisplayFacts) -> String?
    ) {
        self.kind = kind
        self.features = features
        self.reach = reach
        self.desktop = desktop
        self.loop = loop
        self.refusal = refusal
    }

    /// Asks the X server, unless the desktop is not x11 or `running` (the
    /// program holds the selection itself).
    func ask(running: Bool) async {
        let display = desktop.display
        guard desktop.desktop == .x11, !running, let x11 = display.x11Display else {
            facts = nil
            return
        }
        do throws(X11Error) {
            facts = .success(try await X11Display.facts(of: x11, xauthority: display.xauthority, loop: loop))
        } catch {
            facts = .failure(error)
        }
    }

    /// The last answer's refusal, if any.
    var refused: String? {
        guard case .success(let facts)? = facts else { return nil }
        return refusal(facts)
    }

    /// What the driver delivers now: nothing off x11; else its features,
    /// or why not (`otherwise`: a reason of the driver's own).
    func capabilities(running: Bool, otherwise: String? = nil) -> [Feature: FeatureCapability] {
        guard desktop.desktop == .x11 else { return [:] }
        let display = desktop.display
        var why = kind.unavailableReason(
            installed: SessionProbe(environment: desktop.environment).installation, x11Display: display.x11Display,
            waylandDisplay: nil)
        if why == nil { why = otherwise }
        if why == nil, !running {
            switch facts {
            case .failure(let error)?: why = "the X server of \(display.x11Display ?? "the session") cannot be asked: \(error)"
            case .success(let facts)?: why = refusal(facts)
            case nil: why = "the X server has not been asked yet"
            }
        }
        let capability: FeatureCapability = why.map { .unavailable($0) } ?? .delivers(reach)
        return Dictionary(uniqueKeysWithValues: features.map { ($0, capability) })
    }

    /// Follows what the answer depends on: `again` runs (on the loop) when
    /// the display changes.
    func follow(_ again: @escaping @Sendable () async -> Void) {
        let loop = self.loop
        desktop.follow { Task(executorPreference: loop) { await again() } }
    }

    /// Asks again, one question at a time, then `update`s.
    func again(running: () -> Bool, update: () -> Void) async {
        await asking.run {
            await ask(running: running())
            update()
        }
    }
}
