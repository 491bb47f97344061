import ArgumentParser
import DBus
import FoundationEssentials
import GuidedAccessClient
import GuidedAccessDoctor
import KioskSession

#if canImport(Glibc)
    import Glibc
#endif

// MARK: - doctor

struct Doctor: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Say what this kiosk will deliver, feature by feature, and why not where not.",
        discussion: """
            Asks the service (Desktop, SupportedFeatures, UnsupportedReasons, Agent, Backend, Version) \
            and looks at this machine itself: Orca, speech-dispatcher and its output modules, picom, \
            xsettingsd and wvkbd, the displays this command sees, the service's systemd unit and, in \
            system mode, the dconf profile line and the polkit policy.

            Exit status 0 when every required feature is supported (screen-reader, zoom, \
            invert-colors and grayscale, or those named with --feature); 6 when one is not; 10 when \
            no service answers.
            """)

    @OptionGroup var global: GlobalOptions

    @Option(
        name: .customLong("feature"),
        help: ArgumentHelp(
            "A feature to require instead of the default four (repeatable).", valueName: "F"))
    var features: [String] = []

    @Flag(help: "Print the findings as one JSON object.")
    var json = false

    func validate() throws {
        for name in features where Feature(rawValue: name) == nil {
            throw ValidationError(
                "unknown feature '\(name)'; features: " + Feature.allCases.map(\.wireName).joined(separator: ", "))
        }
    }

    func run() async throws {
        let bus = global.bus
        var service: DoctorService?
        var serviceError = ""
        do {
            let client = try await GuidedAccessClient.connect(bus: bus, allowInteractiveAuthorization: false)
            let status = try await client.status()
            service = DoctorService(
                desktop: status.desktop, supportedFeatures: status.supportedFeatures,
                unsupportedReasons: status.unsupportedReasons, agent: status.agent, backend: status.backend,
                version: status.version)
        } catch {
            serviceError = error.message
        }
        // --address: the backend tells the mode (dconf: system mode).
        let system = global.system || (global.address != nil && service?.backend == "dconf")
        let mode = system ? "system" : "user"
        let report = DoctorReport(
            mode: mode, bus: "\(bus)", service: service, serviceError: serviceError,
            checks: LocalChecks(system: system).all(service: service, serviceError: serviceError, bus: bus),
            required: features.compactMap(Feature.init(rawValue:)))
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            printLine(String(decoding: try encoder.encode(report.json), as: UTF8.self))
        } else {
            printLine(report.text)
        }
        switch report.outcome {
        case .ok: return
        case .unsupported: throw Failure(code: .feature)
        case .serviceUnavailable: throw Failure(code: .serviceUnavailable)
        }
    }
}

/// What the ctl finds on this machine by itself.
struct LocalChecks {
    let system: Bool
    let environment = SessionProbe.processEnvironment()
    var probe: SessionProbe { SessionProbe(environment: environment) }

    static let polkitPolicy = "/usr/share/polkit-1/actions/org.guidedaccess.GuidedAccess1.policy"
    static let dconfProfile = "/etc/dconf/profile/user"

    func all(service: DoctorService?, serviceError: String, bus: Bus) -> [DoctorCheck] {
        var checks: [DoctorCheck] = []
        if let service {
            checks.append(
                DoctorCheck(
                    "service", ok: true,
                    "guidedaccessd \(service.version) on the \(bus), backend \(service.backend)"))
            let desktop = service.desktop.isEmpty ? "none" : service.desktop
            checks.append(
                desktop.hasPrefix("none")
                    ? DoctorCheck(
                        "desktop", ok: false,
                        "none: the service found no desktop it acts on"
                            + (system ? " on seat0 (logind's active session)" : " in its session")
                            + (desktop == "none" ? "" : " (\(desktop))") + "; here: \(sessionEvidence)")
                    : DoctorCheck("desktop", ok: true, "\(desktop) (as the service detected it; here: \(sessionEvidence))"))
            if system || !service.agent.isEmpty {
                checks.append(
                    service.agent.isEmpty
                        ? DoctorCheck(
                            "agent", ok: false,
                            "none registered: start guidedaccess-agent.service in the kiosk user's session (systemctl --user)")
                        : DoctorCheck("agent", ok: true, "the session agent of \(service.agent) is registered"))
            }
        } else {
            checks.append(DoctorCheck("service", ok: false, "no answer on the \(bus): \(serviceError)"))
        }
        checks.append(displays)
        checks += programs
        if system {
            checks.append(dconfProfileCheck)
            checks.append(
                access(Self.polkitPolicy, R_OK) == 0
                    ? DoctorCheck("polkit-policy", ok: true, Self.polkitPolicy)
                    : DoctorCheck(
                        "polkit-policy", ok: false,
                        "\(Self.polkitPolicy) is not installed: polkit admits no one by its actions"))
        }
        checks.append(unit)
        return checks
    }

    /// What a desktop is told by, as this command sees it.
    var sessionEvidence: String {
        let names = ["XDG_CURRENT_DESKTOP", "XDG_SESSION_TYPE", "WAYLAND_DISPLAY", "DISPLAY"]
        let set = names.compactMap { name in environment[name].map { "\(name)=\($0)" } }
        return set.isEmpty ? "none of \(names.joined(separator: ", ")) is set" : set.joined(separator: ", ")
    }

    /// The displays this command sees: the variables, else the sockets.
    var displays: DoctorCheck {
        let display = probe.display()
        let sockets = SessionProbe.entries(of: SessionProbe.x11SocketDirectory).filter { $0.hasPrefix("X") }.sorted()
        let socketText =
            sockets.isEmpty
            ? "no X socket in \(SessionProbe.x11SocketDirectory)"
            : "X sockets in \(SessionProbe.x11SocketDirectory): \(sockets.joined(separator: ", "))"
        let ok = display.waylandDisplay != nil || display.x11Display != nil
        return DoctorCheck(
            "display", ok: ok,
            (ok ? "\(display)" : "no display this command can see") + "; \(socketText)")
    }

    /// The programs the service runs for features, and what they need.
    var programs: [DoctorCheck] {
        let probe = probe
        func program(_ name: String, _ what: String) -> DoctorCheck {
            if let path = probe.executable(name) { return DoctorCheck(name, ok: true, path) }
            return DoctorCheck(name, ok: false, "not installed (\(what))")
        }
        let modules = probe.installation.speechOutputModules
        return [
            program("orca", "the screen reader, unless the desktop starts its own"),
            program("speech-dispatcher", "Orca speaks through it"),
            modules.isEmpty
                ? DoctorCheck(
                    "speech-output-modules", ok: false,
                    "none: speech-dispatcher cannot speak (install e.g. speech-dispatcher-espeak-ng)")
                : DoctorCheck("speech-output-modules", ok: true, modules.joined(separator: ", ")),
            program("picom", "the colour features on a bare X display"),
            program("xsettingsd", "large-text, high-contrast and reduce-motion on a bare X display"),
            program("wvkbd-mobintl", "the on-screen keyboard on wlroots desktops: package wvkbd"),
        ]
    }

    var dconfProfileCheck: DoctorCheck {
        DoctorCheck.dconfProfile(path: Self.dconfProfile, text: Self.readFile(Self.dconfProfile))
    }

    /// The service's unit, as systemd tells it.
    var unit: DoctorCheck {
        let unit = system ? "guidedaccessd.service" : "guidedaccessd-user.service"
        let scope = system ? "system" : "user"
        guard let systemctl = probe.executable("systemctl") else {
            return DoctorCheck.unit(unit, scope: scope, enabled: nil, active: nil, failure: "systemctl is not installed: the unit's state is unknown")
        }
        let prefix = [systemctl] + (system ? [] : ["--user"])
        guard let enabled = Self.run(prefix + ["is-enabled", unit]), let active = Self.run(prefix + ["is-active", unit])
        else {
            return DoctorCheck.unit(unit, scope: scope, enabled: nil, active: nil, failure: "\(systemctl) could not be run")
        }
        // No manager to ask: systemctl says so on stderr, and nothing on stdout.
        if enabled.stdout.isEmpty && active.stdout.isEmpty {
            let failure = enabled.stderr.isEmpty ? active.stderr : enabled.stderr
            return DoctorCheck.unit(unit, scope: scope, enabled: nil, active: nil, failure: failure.isEmpty ? "no answer" : failure)
        }
        // A unit that is not installed: is-enabled says so on stderr only.
        return DoctorCheck.unit(
            unit, scope: scope, enabled: enabled.stdout.isEmpty ? enabled.stderr : enabled.stdout, active: active.stdout)
    }

    // MARK: Helpers

    /// A small file's text, or nil.
    static func readFile(_ path: String) -> String? {
        guard let file = fopen(path, "r") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 1 << 20 {
            let n = fread(&buffer, 1, buffer.count, file)
            if n <= 0 { break }
            bytes += buffer[0..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Runs `argv` (stdin /dev/null) for at most 5 seconds; the first line
    /// of its stdout and of its stderr, or nil when it could not be started.
    static func run(_ argv: [String]) -> (stdout: String, stderr: String)? {
        var out: [Int32] = [0, 0], err: [Int32] = [0, 0]
        guard pipe(&out) == 0 else { return nil }
        guard pipe(&err) == 0 else {
            close(out[0])
            close(out[1])
            return nil
        }
        for fd in out + err { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, out[1], 1)
        posix_spawn_file_actions_adddup2(&actions, err[1], 2)
        var cArguments = argv.map { strdup($0) } + [nil]
        defer { for argument in cArguments { free(argument) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, argv[0], &actions, nil, &cArguments, environ)
        close(out[1])
        close(err[1])
        defer {
            close(out[0])
            close(err[0])
        }
        guard result == 0 else { return nil }
        var texts: [[UInt8]] = [[], []]
        var open = [true, true]
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        deadline.tv_sec += 5
        while open.contains(true) {
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            let left = Int32((deadline.tv_sec - now.tv_sec) * 1000 + (deadline.tv_nsec - now.tv_nsec) / 1_000_000)
            if left <= 0 { break }
            var fds = [pollfd(fd: open[0] ? out[0] : -1, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: open[1] ? err[0] : -1, events: Int16(POLLIN), revents: 0)]
            let ready = poll(&fds, 2, left)
            if ready < 0 && errno == EINTR { continue }
            if ready <= 0 { break }
            for i in 0..<2 where open[i] && fds[i].revents != 0 {
                var buffer = [UInt8](repeating: 0, count: 4096)
                let n = Glibc.read(i == 0 ? out[0] : err[0], &buffer, buffer.count)
                if n > 0, texts[i].count < 65536 { texts[i] += buffer[0..<n] } else if n <= 0 { open[i] = false }
            }
        }
        if open.contains(true) { kill(pid, SIGKILL) }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        func firstLine(_ bytes: [UInt8]) -> String {
            String(decoding: bytes, as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
        }
        return (firstLine(texts[0]), firstLine(texts[1]))
    }
}
