import DBus
import Glibc
import GuidedAccessCore
import Logging

/// invert-colors and grayscale on a bare X display (`Desktop` x11: Xorg or
/// Xvfb, a window manager, one app): the service runs picom for the
/// session, with a window shader that does exactly the features on —
/// grayscale by Rec. 709 luma, inversion 1 − value, both composed — and
/// nothing else (`--config /dev/null`: no shadows, fading or opacity of a
/// system picom.conf). A new set of colour features is a new picom, once
/// the last has let go of the screen; at the session's end it stops and
/// the X server gives every window back as it was drawn.
///
/// Never a second compositor: where the `_NET_WM_CM_S0` selection has an
/// owner that is not the service's picom, the features are unavailable,
/// and the reason names that compositor; it is asked again before each
/// start, since a kiosk may start its own later.
///
/// picom runs as a `SessionProgram`: a transient unit of the user's
/// systemd manager where there is one, else a child; started again with
/// back-off, adopted by a restarted service (the journal keeps the run and
/// its features), stopped at the restarted service's start when its
/// session ended meanwhile.
public final class X11CompositorDriver: FeatureDriver, @unchecked Sendable {
    public let name = "x11-compositor"
    static let features: Set<Feature> = [.invertColors, .grayscale]
    private let lookout: X11Lookout
    private var desktop: SessionDesktopDriver { lookout.desktop }
    private let owner: ProgramOwner
    private let loop: EventLoop
    private let program: SessionProgram
    private let logger: Logger
    /// The run going, and the features its shader does.
    private var run: (record: ProgramRecord, features: Set<Feature>)?
    /// The displays it was started in: moved, it starts again in the new ones.
    private var startedIn: SessionDisplay?
    package private(set) var capabilities: [Feature: FeatureCapability] = [:]
    package var desktopPart: DesktopPart? { nil }
    package var followsReads: Bool { true }
    private var events: (@Sendable (DriverEvent) -> Void)?

    /// How long picom may take to show the filter before the call that
    /// started it returns anyway.
    static let readyBound: Duration = .seconds(1)

    public init(
        desktop: SessionDesktopDriver, owner: ProgramOwner = .service, loop: EventLoop, bus: Connection, logger: Logger
    ) {
        lookout = X11Lookout(.compositor, features: Self.features, reach: .wholeScreen, desktop: desktop, loop: loop) {
            facts in
            if let compositor = facts.compositor { return Self.foreign(compositor) }
            return facts.hasGLX ? nil : "the X server has no GLX extension, which picom's shader needs"
        }
        self.owner = owner
        self.loop = loop
        self.logger = logger
        program = SessionProgram(.compositor, owner: owner, loop: loop, bus: bus, logger: logger)
    }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {
        self.events = events
        program.onEvent { [self] event in self.programEvent(event) }
        lookout.follow { [self] in await askAgain() }
        await lookout.ask(running: false)
        capabilities = lookout.capabilities(running: false)
    }

    package func supportWasRead() {
        Task(executorPreference: loop) { await self.askAgain() }
    }

    package nonisolated(nonsending) func lookAgain(for features: Set<Feature>) async {
        guard !features.isDisjoint(with: Self.features) else { return }
        await askAgain()
    }

    private func askAgain() async {
        await lookout.again(running: { run != nil }) { updateCapabilities() }
    }

    /// Tells the service when what it delivers changed.
    private func updateCapabilities() {
        let new = lookout.capabilities(running: run != nil)
        guard new != capabilities else { return }
        capabilities = new
        events?(.changed)
    }

    static func foreign(_ compositor: X11SelectionOwner) -> String {
        "a compositor of the kiosk's own runs (\(compositor)), and the service never runs a second one: "
            + "stop it, or give the features through it"
    }

    // MARK: The transaction

    package nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool {
        let wanted = target.features.intersection(Self.features).filter { capabilities[$0] == .delivers(.wholeScreen) }
        let display = desktop.display
        if let run, run.features != wanted || startedIn.map({ !$0.isSameDisplays(as: display) }) ?? false {
            program.stop()
            self.run = nil
            startedIn = nil
            // The next picom cannot take the screen while this one holds it.
            if !wanted.isEmpty { await program.gone(within: .seconds(2)) }
        }
        guard !wanted.isEmpty, run == nil else { return false }
        // A compositor of the kiosk's own may have come since it was last asked.
        await lookout.ask(running: false)
        if let refused = lookout.refused {
            capabilities = lookout.capabilities(running: false)
            throw DriverFailure(.unsupported, "\(wanted.sorted()[0]): \(refused); nothing was changed")
        }
        let executable = SessionProbe(environment: desktop.environment).executable(ProgramKind.compositor.executable)
        guard let executable else { throw DriverFailure(.failed, "picom is not installed; nothing was changed") }
        let before = try? await X11Display.sample(of: display.x11Display ?? "", xauthority: display.xauthority, loop: loop)
        do throws(ProgramError) {
            let record = try await program.start(
                executable, arguments: Self.arguments(wanted), environment: desktop.programEnvironment)
            run = (record, wanted)
            startedIn = display
        } catch {
            throw DriverFailure(.failed, "\(wanted.sorted()[0]): picom: \(error.message); nothing was changed")
        }
        await untilShown(display, before: before)
        return true
    }

    /// Returns once the screen shows the filter — a sample of it differs
    /// from `before` — or after `readyBound` (a screen the filter does not
    /// change where it is sampled, an X server that cannot be asked): the
    /// caller's reply then means the customer sees it. picom takes the
    /// compositor's selection at once but paints its first frame only once
    /// OpenGL is up (≈ 0.2 s on Mesa's software renderer).
    private func untilShown(_ display: SessionDisplay, before: [UInt8]?) async {
        guard let x11 = display.x11Display, let before else { return }
        let deadline = X11Display.now() + Self.readyBound
        while X11Display.now() < deadline, run != nil {
            guard let now = try? await X11Display.sample(of: x11, xauthority: display.xauthority, loop: loop) else { return }
            if now != before { return }
            guard (try? await loop.sleep(for: .milliseconds(10))) != nil else { return }
        }
        logger.info("compositor: the screen looked the same \(Self.readyBound) after picom started; going on")
    }

    /// picom's arguments for `features`: the GLX backend, the shader, no
    /// configuration file.
    static func arguments(_ features: Set<Feature>) -> [String] {
        ["--config", "/dev/null", "--backend", "glx", "--glx-fshader-win", shader(features)]
    }

    /// A window shader (picom's legacy GLX backend: `tex`, `opacity`,
    /// `invert_color` for its own inversion rules) for `features`; colours
    /// are premultiplied by alpha.
    static func shader(_ features: Set<Feature>) -> String {
        var steps: [String] = []
        if features.contains(.grayscale) { steps.append("c.rgb = vec3(dot(c.rgb, vec3(0.2126, 0.7152, 0.0722)));") }
        if features.contains(.invertColors) { steps.append("c.rgb = c.a - c.rgb;") }
        return """
            uniform float opacity;
            uniform bool invert_color;
            uniform sampler2D tex;
            void main() {
                vec4 c = texture2D(tex, gl_TexCoord[0].xy);
                \(steps.joined(separator: "\n    "))
                if (invert_color) c.rgb = c.a - c.rgb;
                gl_FragColor = c * opacity;
            }
            """
    }

    private func programEvent(_ event: SessionProgram.Event) {
        guard let run else { return }
        switch event {
        case .restarted(let record):
            self.run = (record, run.features)
            events?(.recordChanged)
        case .gaveUp(let exits, let lastExit):
            self.run = nil
            startedIn = nil
            events?(.recordChanged)
            for feature in run.features.sorted() {
                events?(
                    .featureLost(
                        feature,
                        message: "\(feature): picom exited \(exits) times within a minute (last: \(lastExit)); it is not started again",
                        fields: ["FEATURE": feature.wireName, "EXITS": String(exits), "LAST_EXIT": lastExit]))
            }
        }
    }

    // MARK: The journal

    package var record: JSON? {
        guard let run else { return nil }
        return .object(
            run.record.journalFields + [("features", .array(run.features.sorted().map { .string($0.wireName) }))])
    }

    package func validate(_ record: JSON) throws(DriverRecordError) {
        _ = try Self.run(of: record, owner: owner)
    }

    static func run(of record: JSON, owner: ProgramOwner) throws(DriverRecordError) -> (ProgramRecord, Set<Feature>) {
        let run = try ProgramRecord(journal: record, kind: .compositor, owner: owner)
        guard case .array(let items)? = record["features"] else { throw DriverRecordError("'features' is not an array") }
        var features: Set<Feature> = []
        for item in items {
            guard case .string(let name) = item, let feature = Feature(rawValue: name), Self.features.contains(feature) else {
                throw DriverRecordError("'features' holds something other than invert-colors and grayscale")
            }
            features.insert(feature)
        }
        return (run, features)
    }

    // MARK: Recovery

    /// A session that goes on keeps the journal's picom if it still runs
    /// with the session's colour features (adopted: the same process),
    /// else gets a new one; without a session, or one about to end, it stops.
    package nonisolated(nonsending) func recover(_ record: JSON?, target: DriverTarget?, endsNow: Bool) async -> [DriverNote] {
        let recorded = try? record.map { record throws(DriverRecordError) in try Self.run(of: record, owner: owner) }
        await program.stopUnknownUnits(keeping: recorded?.0)
        let environment = desktop.programEnvironment
        let wanted = endsNow || desktop.desktop != .x11 ? [] : (target?.features ?? []).intersection(Self.features)
        var notes: [DriverNote] = []
        if let (leftOver, features) = recorded, features != wanted {
            await program.stopLeftOver(leftOver, environment: environment)
            await program.gone(within: .seconds(2))
        }
        if !wanted.isEmpty, let executable = SessionProbe(environment: desktop.environment).executable("picom") {
            do throws(ProgramError) {
                let adopt = recorded.flatMap { $0.1 == wanted ? $0.0 : nil }
                run = (try await program.resume(adopt, executable, arguments: Self.arguments(wanted), environment: environment), wanted)
                startedIn = desktop.display
            } catch {
                notes.append(DriverNote(.error, "compositor: cannot start picom for the resumed session: \(error)"))
            }
        }
        // Asked at start, the picom adopted here held the selection: a
        // compositor of the kiosk's own, it seemed.
        updateCapabilities()
        if run == nil { Task(executorPreference: loop) { await self.askAgain() } }
        return notes
    }
}
