import DBus
import Foundation
import Glibc
import GuidedAccessClient
import Synchronization
import TestSupport
import Testing

/// A dbus-daemon and guidedaccessd (user mode, memory backend) of the test's own.
final class PrivateService: @unchecked Sendable {
    let bus: PrivateBus
    let daemonPID: pid_t
    var directory: String { bus.directory }
    var address: String { bus.address }

    init() async throws {
        bus = try PrivateBus(prefix: "ga-client-tests")
        let directory = bus.directory
        try "[Service]\nBackend=memory\n".write(toFile: directory + "/ga.conf", atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: true)
        daemonPID = try PrivateBus.spawn([
            Self.daemonPath, "--user", "--address", bus.address, "--config", directory + "/ga.conf",
            "--state-dir", directory + "/state",
        ])
        // Ready when it owns its name.
        let watcher = try await Connection.connect(to: .address(bus.address))
        for _ in 0..<200 {
            if try await watcher.nameOwner(GuidedAccessBus.name) != nil { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw DBusError.failed("guidedaccessd did not take its name")
    }

    deinit {
        kill(daemonPID, SIGKILL)
        var status: Int32 = 0
        waitpid(daemonPID, &status, 0)
        // The bus goes when `bus` is released, after this.
    }

    static let daemonPath: String = {
        let candidates: [String?] = [
            Bundle.main.executableURL?.deletingLastPathComponent().path,
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path,
        ]
        for case let dir? in candidates where FileManager.default.isExecutableFile(atPath: dir + "/guidedaccessd") {
            return dir + "/guidedaccessd"
        }
        return ".build/debug/guidedaccessd"
    }()
}

final class RecordingProvider: GuidedAccessRestrictionProvider {
    let identifiers = ["com.example.kiosk.print", "com.example.kiosk.camera"]
    let changes = Mutex<[String]>([])

    func text(for identifier: String) -> String { identifier == "com.example.kiosk.print" ? "Printing" : "Camera" }
    func detailText(for identifier: String) -> String? { identifier == "com.example.kiosk.print" ? "Print receipts" : nil }
    func didChange(identifier: String, state: RestrictionState) {
        changes.withLock { $0.append("\(identifier)=\(state.rawValue)") }
    }
}

/// The next `count` events, or fewer when `timeout` passes first.
func next(_ count: Int, of events: AsyncStream<GuidedAccessEvent>, timeout: Duration = .seconds(10)) async
    -> [GuidedAccessEvent]
{
    await withTaskGroup(of: [GuidedAccessEvent]?.self) { group in
        group.addTask {
            var result: [GuidedAccessEvent] = []
            for await event in events {
                result.append(event)
                if result.count == count { break }
            }
            return result
        }
        group.addTask {
            try? await Task.sleep(for: timeout)
            return nil
        }
        let first = await group.next()!
        group.cancelAll()
        return first ?? []
    }
}

@Suite(.serialized) struct ClientTests {
    @Test func sessionRestrictionsAndEventsInOrder() async throws {
        let service = try await PrivateService()
        let client = try await GuidedAccessClient.connect(bus: .address(service.address))
        let events = try await client.changes()
        let provider = RecordingProvider()
        let delivery = try await client.register(provider: provider)
        defer { delivery.cancel() }

        #expect(try await client.isSessionActive == false)
        try await client.requestSession(enabled: [.zoom, .grayscale], options: .init(timeLimit: .seconds(600), zoomFactor: 3))
        #expect(try await client.isSessionActive)
        #expect(try await client.enabledFeatures == [.zoom, .grayscale])
        try await client.configure(features: [.grayscale], enabled: false)
        #expect(try await client.enabledFeatures == [.zoom])
        let status = try await client.status()
        #expect(status.sessionOwner == client.connection.uniqueName)
        #expect(status.sessionDeadline > 0)
        #expect(!status.desktop.isEmpty)
        // The service names no feature the API does not know.
        #expect(try await client.supportedFeatures == (try Feature.parse(status.supportedFeatures)))
        #expect(status.supportedFeatures == status.supportedFeatures.sorted())

        #expect(try await client.restrictions() == [
            Restriction(identifier: "com.example.kiosk.camera", text: "Camera", detail: ""),
            Restriction(identifier: "com.example.kiosk.print", text: "Printing", detail: "Print receipts"),
        ])
        // User mode without [Operators]: our own user is an operator.
        try await client.setRestrictionState(.deny, for: "com.example.kiosk.print")
        #expect(try await client.restrictionState(for: "com.example.kiosk.print") == .deny)
        try await client.endSession()

        let received = await next(4, of: events)
        #expect(received == [
            .session(active: true, reason: SessionChangeReason.started.rawValue),
            .restriction(identifier: "com.example.kiosk.print", state: .deny),
            .restriction(identifier: "com.example.kiosk.print", state: .allow),
            .session(active: false, reason: SessionChangeReason.ended.rawValue),
        ])
        #expect(received.map(\.sessionChangeReason) == [.started, nil, nil, .ended])
        for _ in 0..<100 where provider.changes.withLock({ $0.count }) < 2 {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(provider.changes.withLock { $0 } == ["com.example.kiosk.print=deny", "com.example.kiosk.print=allow"])
        await client.close()
    }

    @Test func errorsAreTyped() async throws {
        let service = try await PrivateService()
        let client = try await GuidedAccessClient.connect(bus: .address(service.address))
        await #expect(throws: GuidedAccessError.self) { try await client.endSession() }
        do {
            try await client.endSession()
        } catch {
            guard case .notInSession(let message) = error else { Issue.record("got \(error)"); return }
            #expect(!message.isEmpty)
        }
        do {
            try await client.configure(featureNames: ["no-such-feature"], enabled: true)
            Issue.record("no error")
        } catch {
            guard case .unknownFeature(let message) = error else { Issue.record("got \(error)"); return }
            #expect(message.contains("no-such-feature"))
        }
        do {
            _ = try await client.restrictionState(for: "com.example.nothing")
            Issue.record("no error")
        } catch {
            guard case .unknownRestriction = error else { Issue.record("got \(error)"); return }
        }
        await client.close()
    }

    @Test func noBusIsServiceUnavailable() async {
        do {
            _ = try await GuidedAccessClient.connect(bus: .address("unix:path=/nonexistent/ga-bus"))
            Issue.record("connected")
        } catch {
            guard case .serviceUnavailable = error else { Issue.record("got \(error)"); return }
        }
    }
}
