// Load on guidedaccessd from many client connections at once, for
// scripts/bench-load; each mode prints `key=value` lines the script reads.
// All client connections of a mode share one event loop thread, so the
// client costs one core at most however many connections it holds.
//
//   guidedaccess-load calls --address A [--clients N] [--calls M] [--pid P]
//       [--target DESTINATION PATH INTERFACE PROPERTY]
//     N connections making M calls each, all at once. Without --target, the
//     service's mix: the first connection starts a session and is its owner
//     (ConfigureForSession on/off, alternating with reads), the others read
//     (Properties.Get, GetRestrictionState, ListRestrictions). With --target,
//     Properties.Get of that property only (the same load on another service).
//   guidedaccess-load fanout --address A [--subscribers N] [--rounds R] [--reference DESTINATION]
//     N connections subscribed to SessionChanged (and to the test service's
//     Pinged, emitted by its Emit, at --reference): the time from a
//     StartSession call to each subscriber's receipt, R rounds.
//   guidedaccess-load stuck --address A [--stuck K] [--calls M] [--pid P] [--bus-pid P]
//     The owner's ConfigureForSession on/off and a reader's Properties.Get,
//     M calls each, first alone, then with K connections that subscribe to
//     everything the service sends and never read.

import CDBus
import DBus
import GuidedAccessAPI
import Glibc
import Logging
import Synchronization

// MARK: Command line

struct Options: Sendable {
    var mode = ""
    var address = ""
    var clients = 100
    var calls = 1000
    var subscribers = 1000
    var rounds = 3
    var stuck = 10
    var servicePID: Int32?
    var busPID: Int32?
    var reference: String?
    var target: [String]?

    static func parse() -> Options {
        var options = Options()
        var arguments = CommandLine.arguments.dropFirst().makeIterator()
        options.mode = arguments.next() ?? ""
        while let argument = arguments.next() {
            switch argument {
            case "--address": options.address = arguments.next() ?? ""
            case "--clients": options.clients = arguments.next().flatMap(Int.init) ?? options.clients
            case "--calls": options.calls = arguments.next().flatMap(Int.init) ?? options.calls
            case "--subscribers": options.subscribers = arguments.next().flatMap(Int.init) ?? options.subscribers
            case "--rounds": options.rounds = arguments.next().flatMap(Int.init) ?? options.rounds
            case "--stuck": options.stuck = arguments.next().flatMap(Int.init) ?? options.stuck
            case "--pid": options.servicePID = arguments.next().flatMap(Int32.init)
            case "--bus-pid": options.busPID = arguments.next().flatMap(Int32.init)
            case "--reference": options.reference = arguments.next()
            case "--target": options.target = (0..<4).compactMap { _ in arguments.next() }
            default: usage()
            }
        }
        guard ["calls", "fanout", "stuck"].contains(options.mode), !options.address.isEmpty else { usage() }
        return options
    }

    static func usage() -> Never {
        print("usage: guidedaccess-load calls|fanout|stuck --address ADDR [options]; see the source")
        exit(2)
    }
}

// MARK: Helpers

enum Clock {
    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}

/// VmRSS and VmHWM of a process, in kB.
func memory(of pid: Int32?) -> (rss: Int, hwm: Int) {
    guard let pid, let file = fopen("/proc/\(pid)/status", "r") else { return (0, 0) }
    defer { fclose(file) }
    var rss = 0, hwm = 0
    var line = [CChar](repeating: 0, count: 256)
    while fgets(&line, Int32(line.count), file) != nil {
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let fields = text.split(whereSeparator: { $0 == " " || $0 == "\t" })
        guard fields.count >= 2, let value = Int(fields[1]) else { continue }
        if fields[0] == "VmRSS:" { rss = value }
        if fields[0] == "VmHWM:" { hwm = value }
    }
    return (rss, hwm)
}

/// CPU time of every thread of a process, in seconds (schedstat's
/// nanoseconds: /proc/PID/stat counts in 10 ms ticks).
func cpuSeconds(of pid: Int32?) -> Double {
    guard let pid, let dir = opendir("/proc/\(pid)/task") else { return 0 }
    defer { closedir(dir) }
    var total = 0.0
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        guard !name.hasPrefix("."), let file = fopen("/proc/\(pid)/task/\(name)/schedstat", "r") else { continue }
        var line = [CChar](repeating: 0, count: 128)
        let read = fgets(&line, Int32(line.count), file) != nil
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let nanoseconds = read ? UInt64(text.split(separator: " ").first ?? "") ?? 0 : 0
        fclose(file)
        total += Double(nanoseconds) / 1e9
    }
    return total
}

/// Milliseconds with two decimals.
func ms(_ seconds: Double) -> String { String((seconds * 1e5).rounded() / 100) }

/// Count, p50, p90, p99 and max of latencies in seconds, as `key=ms` text.
func percentiles(_ samples: [Double], prefix: String = "") -> String {
    guard !samples.isEmpty else { return "\(prefix)n=0" }
    let sorted = samples.sorted()
    func at(_ q: Double) -> String { ms(sorted[min(sorted.count - 1, Int(q * Double(sorted.count)))]) }
    return "\(prefix)n=\(sorted.count) \(prefix)p50=\(at(0.5)) \(prefix)p90=\(at(0.9)) \(prefix)p99=\(at(0.99)) \(prefix)max=\(ms(sorted.last!))"
}

/// One connection per client needs one descriptor each: the soft limit
/// (1024) is too low for a thousand subscribers.
func raiseDescriptorLimit() {
    var limit = rlimit()
    getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    limit.rlim_cur = limit.rlim_max
    setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
}

enum Names {
    static let service = GuidedAccessBus.name
    static let path = GuidedAccessBus.path
    static let interface = GuidedAccessBus.interface
    static let properties = "org.freedesktop.DBus.Properties"
    static let restriction = "org.example.bench.printing"
}

/// What clients saw: latencies by kind of call, errors by name.
struct Tally: Sendable {
    var latencies: [String: [Double]] = [:]
    var errors: [String: Int] = [:]

    mutating func merge(_ other: Tally) {
        for (kind, values) in other.latencies { latencies[kind, default: []] += values }
        for (name, count) in other.errors { errors[name, default: 0] += count }
    }

    var errorCount: Int { errors.values.reduce(0, +) }
    var callCount: Int { latencies.values.reduce(0) { $0 + $1.count } }
}

/// One call a client makes, and how it is counted.
struct Call: Sendable {
    let kind: String
    var destination = Names.service
    var path = Names.path
    let interface: String
    let member: String
    var values: [DBusValue] = []

    static func configure(_ on: Bool) -> Call {
        Call(
            kind: "ConfigureForSession", interface: Names.interface, member: "ConfigureForSession",
            values: [.array(.string, [.string("invert-colors")]), .bool(on)])
    }

    static func get(_ property: GuidedAccessProperty) -> Call {
        Call(
            kind: "Properties.Get", interface: Names.properties, member: "Get",
            values: [.string(Names.interface), .string(property.rawValue)])
    }

    static let startSession = Call(
        kind: "StartSession", interface: Names.interface, member: "StartSession",
        values: [.dictionary(key: .string, value: .variant, [])])
    static let endSession = Call(kind: "EndSession", interface: Names.interface, member: "EndSession")

    /// Made, timed, into the tally; an error is counted, not thrown.
    func timed(on connection: Connection, into tally: inout Tally) async {
        let start = Clock.now()
        do {
            _ = try await connection.call(
                destination: destination, path: try ObjectPath(validating: path), interface: interface,
                member: member, values)
        } catch {
            tally.errors[error.name, default: 0] += 1
        }
        tally.latencies[kind, default: []].append(Clock.now() - start)
    }

    /// Made; an error is thrown.
    func make(on connection: Connection) async throws {
        _ = try await connection.call(
            destination: destination, path: try ObjectPath(validating: path), interface: interface, member: member,
            values)
    }
}

// MARK: The modes

/// A connection and the call it makes at each turn.
typealias Work = (Connection, @Sendable (Int) -> Call)

struct Load: Sendable {
    let options: Options
    let loop: EventLoop
    /// Warnings only: a thousand connections closing are a thousand notices.
    let logger: Logger = {
        var logger = Logger(label: "guidedaccess-load")
        logger.logLevel = .warning
        return logger
    }()

    func connect(_ count: Int) async throws -> [Connection] {
        var connections: [Connection] = []
        for _ in 0..<count {
            connections.append(try await Connection.connect(to: .address(options.address), loop: loop, logger: logger))
        }
        return connections
    }

    /// Runs `body` on the loop the connections share, so that calls are
    /// made and answered on one thread with no hops.
    func onLoop<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await Task(executorPreference: loop) { try await body() }.value
    }

    /// Each connection makes its calls in turn, all connections at once.
    func run(_ work: [Work], calls: Int) async throws -> Tally {
        let loop = loop
        return try await onLoop {
            await withTaskGroup(of: Tally.self) { group in
                for (connection, next) in work {
                    group.addTask(executorPreference: loop) {
                        var tally = Tally()
                        for index in 0..<calls { await next(index).timed(on: connection, into: &tally) }
                        return tally
                    }
                }
                var total = Tally()
                for await tally in group { total.merge(tally) }
                return total
            }
        }
    }

    func calls() async throws {
        let connections = try await connect(options.clients)
        let owner = connections[0]
        let work: [Work]
        if let target = options.target {
            let get = Call(
                kind: "Properties.Get", destination: target[0], path: target[1], interface: Names.properties,
                member: "Get", values: [.string(target[2]), .string(target[3])])
            let next: @Sendable (Int) -> Call = { _ in get }
            work = connections.map { ($0, next) }
        } else {
            try await Call.startSession.make(on: owner)
            try await Call(
                kind: "RegisterRestrictions", interface: Names.interface, member: "RegisterRestrictions",
                values: [.array(.structure([.string, .string, .string]), [
                    .structure([.string(Names.restriction), .string("Printing"), .string("")])
                ])]
            ).make(on: owner)
            let reads: [Call] = [
                .get(.enabledFeatures),
                Call(
                    kind: "GetRestrictionState", interface: Names.interface, member: "GetRestrictionState",
                    values: [.string(Names.restriction)]),
                .get(.sessionActive),
                Call(kind: "ListRestrictions", interface: Names.interface, member: "ListRestrictions"),
            ]
            // The owner turns a feature on and off between reads; the others read.
            let ownerCalls: @Sendable (Int) -> Call = { $0 % 2 == 0 ? .configure($0 % 4 == 0) : reads[$0 % reads.count] }
            var list: [Work] = [(owner, ownerCalls)]
            for (client, connection) in connections.dropFirst().enumerated() {
                let next: @Sendable (Int) -> Call = { reads[(client + $0) % reads.count] }
                list.append((connection, next))
            }
            work = list
        }
        let before = memory(of: options.servicePID)
        let (start, cpuStart) = (Clock.now(), cpuSeconds(of: options.servicePID))
        let total = try await run(work, calls: options.calls)
        let (seconds, cpu) = (Clock.now() - start, cpuSeconds(of: options.servicePID) - cpuStart)
        if options.target == nil { try await Call.endSession.make(on: owner) }
        try await loop.sleep(for: .milliseconds(500))
        let after = memory(of: options.servicePID)
        print(
            "all: calls=\(total.callCount) errors=\(total.errorCount) seconds=\(ms(seconds / 1000)) rate=\(Int(Double(total.callCount) / seconds)) \(percentiles(total.latencies.values.flatMap { $0 })) rss_before=\(before.rss) rss_after=\(after.rss) hwm=\(after.hwm) cpu_us_per_call=\(ms(cpu * 1000 / Double(max(total.callCount, 1))))"
        )
        for (kind, values) in total.latencies.sorted(by: { $0.key < $1.key }) {
            print("\(kind): \(percentiles(values))")
        }
        for (name, count) in total.errors.sorted(by: { $0.key < $1.key }) { print("error: name=\(name) count=\(count)") }
        for connection in connections { await connection.close() }
    }

    func fanout() async throws {
        raiseDescriptorLimit()
        let subscribers = options.subscribers
        let caller = try await connect(1)[0]
        let connectStart = Clock.now()
        let connections = try await connect(subscribers)
        let connectSeconds = Clock.now() - connectStart
        let receipts = Receipts()
        let (loop, reference) = (loop, options.reference)
        try await onLoop {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, connection) in connections.enumerated() {
                    group.addTask(executorPreference: loop) {
                        _ = try await connection.subscribe(
                            MatchRule(
                                sender: Names.service, path: try ObjectPath(validating: Names.path),
                                interface: Names.interface, member: "SessionChanged")
                        ) { message in
                            guard case .bool(let active)? = try? message.arguments().first else { return }
                            receipts.record(active ? "started" : "ended", subscriber: index)
                        }
                        if let reference {
                            _ = try await connection.subscribe(
                                MatchRule(sender: reference, interface: "org.guidedaccess.Test1", member: "Pinged")
                            ) { _ in receipts.record("pinged", subscriber: index) }
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
        print("subscribers: n=\(subscribers) connect_seconds=\(ms(connectSeconds / 1000))")

        /// Calls, then waits up to 10 s for every subscriber's receipt.
        func round(_ label: String, _ kind: String, _ call: Call) async throws {
            receipts.reset(kind, subscribers: subscribers)
            let sent = Clock.now()
            try await call.make(on: caller)
            let replied = Clock.now()
            while receipts.received.count < subscribers, Clock.now() < replied + 10 {
                try await loop.sleep(for: .milliseconds(1))
            }
            let times = receipts.received
            let last = times.max() ?? .nan, first = times.min() ?? .nan
            print(
                "\(label): received=\(times.count) of=\(subscribers) reply_to_last=\(ms(last - replied)) call_to_last=\(ms(last - sent)) call_to_first=\(ms(first - sent)) call=\(ms(replied - sent))"
            )
        }
        for _ in 0..<options.rounds {
            try await round("StartSession", "started", .startSession)
            try await round("EndSession", "ended", .endSession)
            if let reference {
                try await round(
                    "reference", "pinged",
                    Call(
                        kind: "Emit", destination: reference, path: "/org/guidedaccess/Test1",
                        interface: "org.guidedaccess.Test1", member: "Emit", values: [.string("fan-out")]))
            }
        }
        for connection in connections { await connection.close() }
        await caller.close()
    }

    func stuck() async throws {
        let connections = try await connect(2)
        let owner = connections[0], reader = connections[1]
        try await Call.startSession.make(on: owner)

        /// The owner turning a feature on and off (each call announces
        /// PropertiesChanged) while the reader reads, as fast as answered.
        func load(calls: Int) async throws -> Phase {
            var phase = Phase(before: memory(of: options.servicePID), busBefore: memory(of: options.busPID))
            let (cpuStart, busCPUStart) = (cpuSeconds(of: options.servicePID), cpuSeconds(of: options.busPID))
            let toggle: @Sendable (Int) -> Call = { .configure($0 % 2 == 0) }
            let read: @Sendable (Int) -> Call = { _ in .get(.enabledFeatures) }
            phase.tally = try await run([(owner, toggle), (reader, read)], calls: calls)
            phase.cpu = cpuSeconds(of: options.servicePID) - cpuStart
            phase.busCPU = cpuSeconds(of: options.busPID) - busCPUStart
            try await loop.sleep(for: .milliseconds(500))
            (phase.after, phase.busAfter) = (memory(of: options.servicePID), memory(of: options.busPID))
            return phase
        }
        _ = try await load(calls: max(options.calls / 5, 1))  // warm-up
        // Alone before and after, so that the order does not favour either.
        let first = try await load(calls: options.calls)
        var stuck = try (0..<options.stuck).map { _ in try StuckConnection(address: options.address) }
        let with = try await load(calls: options.calls)
        print("unread: connections=\(stuck.count) bytes=\(stuck.map(\.unread).reduce(0, +))")
        stuck = []
        var alone = try await load(calls: options.calls)
        alone.merge(first)
        print("alone: \(alone)")
        print("stuck: \(with)")
        try await Call.endSession.make(on: owner)
        for connection in connections { await connection.close() }
    }
}

/// One load of the never-reading measurement: calls, CPU and memory.
struct Phase: CustomStringConvertible {
    var before: (rss: Int, hwm: Int)
    var busBefore: (rss: Int, hwm: Int)
    var after = (rss: 0, hwm: 0)
    var busAfter = (rss: 0, hwm: 0)
    var tally = Tally()
    var cpu = 0.0
    var busCPU = 0.0

    /// Latencies and CPU of both; memory of the other (the first one's).
    mutating func merge(_ other: Phase) {
        tally.merge(other.tally)
        cpu += other.cpu
        busCPU += other.busCPU
        (before, after, busBefore, busAfter) = (other.before, other.after, other.busBefore, other.busAfter)
    }

    var description: String {
        let calls = Double(max(tally.callCount, 1))
        return "calls=\(tally.callCount) errors=\(tally.errorCount) rss_before=\(before.rss) rss_after=\(after.rss) bus_rss_before=\(busBefore.rss) bus_rss_after=\(busAfter.rss) cpu_us_per_call=\(ms(cpu * 1000 / calls)) bus_cpu_us_per_call=\(ms(busCPU * 1000 / calls)) \(percentiles(tally.latencies["ConfigureForSession"] ?? [], prefix: "configure_")) \(percentiles(tally.latencies["Properties.Get"] ?? [], prefix: "get_"))"
    }
}

/// Receipt times of the signal of the current round, one per subscriber.
final class Receipts: Sendable {
    private let state = Mutex<(kind: String, times: [Double?])>(("", []))

    func reset(_ kind: String, subscribers: Int) {
        state.withLock { $0 = (kind, [Double?](repeating: nil, count: subscribers)) }
    }

    func record(_ kind: String, subscriber: Int) {
        let time = Clock.now()
        state.withLock { state in
            guard state.kind == kind, state.times[subscriber] == nil else { return }
            state.times[subscriber] = time
        }
    }

    var received: [Double] { state.withLock { $0.times.compactMap { $0 } } }
}

/// A connection that subscribes to everything the service sends and then
/// never reads: plain libdbus, with no loop to read its socket.
final class StuckConnection {
    let raw: OpaquePointer

    init(address: String) throws {
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        guard let raw = dbus_connection_open_private(address, &error) else {
            throw DBusError.failed("cannot connect a stuck connection")
        }
        self.raw = raw
        guard dbus_bus_register(raw, &error) != 0 else { throw DBusError.failed("cannot register a stuck connection") }
        dbus_bus_add_match(raw, "type='signal',sender='\(Names.service)'", &error)
        guard dbus_error_is_set(&error) == 0 else { throw DBusError.failed("AddMatch failed") }
    }

    /// Bytes the bus wrote to it that wait unread in its socket.
    var unread: Int {
        var fd: Int32 = -1
        guard dbus_connection_get_unix_fd(raw, &fd) != 0 else { return 0 }
        var count: Int32 = 0
        return ioctl(fd, UInt(FIONREAD), &count) == 0 ? Int(count) : 0
    }

    deinit {
        dbus_connection_close(raw)
        dbus_connection_unref(raw)
    }
}

let options = Options.parse()
let load = Load(options: options, loop: EventLoop.spawn())
switch options.mode {
case "calls": try await load.calls()
case "fanout": try await load.fanout()
default: try await load.stuck()
}
