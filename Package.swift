// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "GuidedAccess",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "GuidedAccessAPI", targets: ["GuidedAccessAPI"]),
        .library(name: "DBus", targets: ["DBus"]),
        .library(name: "GuidedAccessCore", targets: ["GuidedAccessCore"]),
        .library(name: "GSettingsBackend", targets: ["GSettingsBackend"]),
        .library(name: "DconfBackend", targets: ["DconfBackend"]),
        .library(name: "KeyFile", targets: ["KeyFile"]),
        .library(name: "GuidedAccessClient", targets: ["GuidedAccessClient"]),
        .executable(name: "guidedaccessctl", targets: ["guidedaccessctl"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
    ],
    targets: [
        // C libraries through pkg-config.
        .systemLibrary(
            name: "CDBus", path: "Modules/CDBus", pkgConfig: "dbus-1",
            providers: [.apt(["libdbus-1-dev"])]),
        // Linux event sources (epoll, eventfd, timerfd, signalfd) for the main
        // loop, and glibc's malloc tuning for the daemon.
        .systemLibrary(name: "CLinux", path: "Modules/CLinux"),
        // Forking a helper (guidedaccessctl's polkit agent) as systemd's tools do.
        .systemLibrary(name: "CProcess", path: "Modules/CProcess"),
        .systemLibrary(
            name: "CGio", path: "Modules/CGio", pkgConfig: "gio-2.0",
            providers: [.apt(["libglib2.0-dev"])]),

        .systemLibrary(
            name: "CDconf", path: "Modules/CDconf", pkgConfig: "dconf",
            providers: [.apt(["libdconf-dev"])]),

        // A D-Bus layer over libdbus that knows nothing of GuidedAccess.
        .target(
            name: "DBus",
            dependencies: ["CDBus", "CLinux", .product(name: "Logging", package: "swift-log")]),

        // The API's vocabulary: bus coordinates, features, restriction
        // states, error names, option keys, session-change reasons. No
        // dependencies: the service, the client library, the CLI and the
        // tests all take it from here.
        .target(name: "GuidedAccessAPI"),
        // The API's types in their D-Bus form, for both sides of the bus.
        .target(name: "GuidedAccessWire", dependencies: ["GuidedAccessAPI", "DBus"]),

        // The domain: the key map, sessions and their store, restrictions,
        // the journal. Imports neither libdbus nor GLib.
        .target(name: "GuidedAccessCore", dependencies: ["GuidedAccessAPI"]),

        // The installed GSettings schemas: key checks and values to and from
        // GVariant, for both settings backends.
        .target(name: "GSettingsSchemas", dependencies: ["CGio", "GuidedAccessCore"]),
        // User mode: the mapped keys in the user's own GSettings (dconf).
        .target(
            name: "GSettingsBackend", dependencies: ["CDconf", "CGio", "DBus", "GSettingsSchemas", "GuidedAccessCore"]),
        // Runs GSettingsBackend in its own process, so tests can give GLib a
        // private bus and config dirs before it reads its environment.
        .executableTarget(name: "gsettings-backend-probe", dependencies: ["GSettingsBackend", "DBus"]),
        // System mode: the mapped keys imposed and locked through a dconf
        // system database (keyfiles + `dconf update`).
        .target(name: "DconfBackend", dependencies: ["CGio", "GSettingsSchemas", "GuidedAccessCore"]),

        // GLib's GKeyFile for the service's configuration files and drop-ins.
        .target(name: "KeyFile", dependencies: ["CGio"]),

        // Drivers of the kiosk's graphical session: its desktop (user mode:
        // detected in the session; system mode: logind's seat0) and what it
        // acts on, and the programs the service runs in it (Orca, wvkbd).
        .target(
            name: "KioskSession",
            dependencies: [
                "DBus", "GuidedAccessCore", "CProcess", "CLinux", .product(name: "Logging", package: "swift-log"),
            ]),

        // The driver of the session's features inside the kiosk browser's
        // pages, through Chromium's DevTools protocol: a WebSocket client of
        // its own on the service's loop (docs/internals.md: "The browser layer").
        .target(
            name: "BrowserLayer",
            dependencies: [
                "DBus", "CLinux", "GuidedAccessAPI", "GuidedAccessCore", .product(name: "Logging", package: "swift-log"),
            ]),

        // The org.guidedaccess.GuidedAccess1 service on the DBus layer: the
        // method table, caller identity, polkit, audit and announcements,
        // over a list of drivers (GuidedAccessCore's FeatureDriver) it knows
        // none of by name.
        .target(
            name: "GuidedAccessService",
            dependencies: [
                "DBus", "GuidedAccessAPI", "GuidedAccessWire", "GuidedAccessCore", "CProcess",
                .product(name: "Logging", package: "swift-log"),
            ]),
        // The session agent (1.2): the program's side (`guidedaccessd
        // --agent`: Agent1 over the session's drivers) and the system
        // service's (the driver that admits agents and sends them the session).
        .target(
            name: "SessionAgent",
            dependencies: [
                "DBus", "GuidedAccessAPI", "GuidedAccessWire", "GuidedAccessCore",
                .product(name: "Logging", package: "swift-log"),
            ]),
        // Builds the driver list (settings backend, desktop, programs,
        // browser pages) for the mode and the configuration, and runs the service.
        .executableTarget(
            name: "guidedaccessd",
            dependencies: [
                "GuidedAccessService", "SessionAgent", "GSettingsBackend", "DconfBackend", "KioskSession", "BrowserLayer",
                "KeyFile", "DBus",
                "GuidedAccessCore", "CLinux", .product(name: "Logging", package: "swift-log"),
            ]),

        // The client library for kiosk apps: the service's API in Swift types,
        // on the DBus layer only (not the domain, GuidedAccessCore).
        .target(name: "GuidedAccessClient", dependencies: ["GuidedAccessAPI", "GuidedAccessWire", "DBus"]),
        // `guidedaccessctl doctor`'s verdict from its findings (the
        // service's properties, the ctl's own checks): pure, tested alone.
        .target(name: "GuidedAccessDoctor", dependencies: ["GuidedAccessAPI"]),
        // The command-line client. KioskSession: the service's own probes
        // of the session (displays, installed programs) for `doctor`.
        .executableTarget(
            name: "guidedaccessctl",
            dependencies: [
                "GuidedAccessClient", "GuidedAccessDoctor", "KioskSession", "CProcess",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]),

        // A test object served through the DBus layer, for the integration
        // tests, the demo and the benchmark.
        .executableTarget(
            name: "dbus-test-service",
            dependencies: ["DBus", .product(name: "Logging", package: "swift-log")]),

        // A libFuzzer target for the message decoding and the handlers'
        // argument checks, with its seed corpus (scripts/fuzz builds it with
        // -sanitize=fuzzer); in an ordinary build, a program that runs
        // inputs through the same code and writes the seeds.
        .executableTarget(
            name: "guidedaccess-fuzz",
            dependencies: ["DBus", "CDBus", "GuidedAccessWire", "GuidedAccessCore", "GuidedAccessService", "BrowserLayer"],
            exclude: ["corpus", "dbus.dict"]),

        // Benchmarks: run through scripts/bench-*.
        .executableTarget(name: "dbus-call-rate", dependencies: ["DBus"], path: "Benchmarks/dbus-call-rate"),
        .executableTarget(
            name: "guidedaccess-load",
            dependencies: ["DBus", "CDBus", "GuidedAccessAPI", .product(name: "Logging", package: "swift-log")],
            path: "Benchmarks/guidedaccess-load"),

        // Examples: a kiosk program on the client library.
        .executableTarget(name: "kiosk-session", dependencies: ["GuidedAccessClient"], path: "Examples/kiosk-session"),

        .testTarget(name: "DBusTests", dependencies: ["DBus", "TestSupport"]),
        .testTarget(name: "GuidedAccessCoreTests", dependencies: ["GuidedAccessCore"]),
        .testTarget(
            name: "GSettingsBackendTests",
            dependencies: ["GSettingsBackend", "gsettings-backend-probe", "DBus", "TestSupport"]),
        .testTarget(name: "DconfBackendTests", dependencies: ["DconfBackend", "TestSupport"]),
        // What the tests of several targets share: a dbus-daemon and a dconf of their own.
        .target(name: "TestSupport", path: "Tests/TestSupport"),
        .testTarget(name: "GuidedAccessServiceTests", dependencies: ["GuidedAccessService", "DBus", "CProcess"]),
        .testTarget(name: "KeyFileTests", dependencies: ["KeyFile"]),
        .testTarget(name: "BrowserLayerTests", dependencies: ["BrowserLayer"]),
        .testTarget(
            name: "KioskSessionTests", dependencies: ["KioskSession", .product(name: "Logging", package: "swift-log")]),
        .testTarget(name: "GuidedAccessDoctorTests", dependencies: ["GuidedAccessDoctor"]),
        // Runs guidedaccessd (memory backend) on a private bus, so it depends on it.
        .testTarget(name: "GuidedAccessClientTests", dependencies: ["GuidedAccessClient", "guidedaccessd", "TestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)

// No target has unsafeFlags: SwiftPM refuses a dependency by version (a kiosk
// app's `.package(url:from:)`) whose targets a product needs have them. The
// release build as it ships (`make`) disables the implicit import of
// _StringProcessing on its own command line instead (see the Makefile).
