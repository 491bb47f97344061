import CDBus
import Glibc
import TestSupport
import Testing

@testable import DBus

/// A connection's last reference may go on any thread while its loop
/// dispatches its messages: its Disconnected above all, which comes when
/// the bus drops it or it closes, just as its owner lets it go. The filter
/// once held the connection unretained and its deinit tore it down from the
/// releasing thread, under the loop's dispatch: the runtime caught the
/// filter retaining a connection being freed ("deallocated with non-zero
/// retain count") and aborted, in every run of the first test (within its
/// first rounds) and in about half the runs of the second.
@Suite(.serialized) struct ConnectionReleasedAsItsLoopDispatches {
    /// The bus drops the connection (its socket shut down under libdbus)
    /// and the connection is let go of a moment later: a moment swept over
    /// 0–99 µs across the rounds, so that releases land as the loop
    /// dispatches the Disconnected.
    @Test func releasedAsTheBusDropsIt() async throws {
        let bus = try PrivateBus()
        for round in 0..<400 {
            var connection: Connection? = try await Connection.connect(to: .address(bus.address))
            var fd: Int32 = -1
            #expect(dbus_connection_get_unix_fd(connection!.handle.pointer, &fd) != 0)
            #expect(shutdown(fd, Int32(SHUT_RDWR)) == 0)
            spin(for: .microseconds(round % 100))
            connection = nil
        }
    }

    /// The browser launcher's way: close, then let go at once, while the
    /// loop dispatches the Disconnected the close queued.
    @Test func closedAndReleasedAtOnce() async throws {
        let bus = try PrivateBus()
        for _ in 0..<300 {
            var connection: Connection? = try await Connection.connect(to: .address(bus.address))
            await connection!.close()
            connection = nil
        }
    }

    /// The teardown is the loop's, after the release: it still closes a
    /// connection let go of with no close, on a loop of its own or a shared one.
    @Test(arguments: [false, true]) func aReleasedConnectionLeavesTheBus(sharedLoop: Bool) async throws {
        let bus = try PrivateBus()
        let watcher = try await Connection.connect(to: .address(bus.address))
        var connection: Connection? = try await Connection.connect(
            to: .address(bus.address), loop: sharedLoop ? watcher.loop : nil)
        let name = connection!.uniqueName
        connection = nil
        let deadline = ContinuousClock.now + .seconds(5)
        var owned = true
        while owned, ContinuousClock.now < deadline {
            let reply = try await watcher.call(
                destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                member: "NameHasOwner", [.string(name)])
            owned = reply != [.bool(false)]
            if owned { try await watcher.loop.sleep(for: .milliseconds(10)) }
        }
        #expect(!owned, "\(name) is still on the bus 5 s after its connection was released")
    }
}

private func spin(for duration: Duration) {
    let end = ContinuousClock.now + duration
    while ContinuousClock.now < end {}
}
