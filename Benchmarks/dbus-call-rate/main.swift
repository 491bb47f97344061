// Sequential call rate of one client against the test service's
// Properties.Get, and against the bus daemon's own GetId in the same run.
// GetId is answered by the daemon itself (one hop); Properties.Get goes
// through the daemon to our service and back (two hops), so the ratio
// measures what our layer adds.
//
//   dbus-call-rate --address ADDR [--count N] [--rounds R]
//                  [--target DESTINATION PATH INTERFACE PROPERTY LABEL]

import DBus
import Glibc

var address: String?
var count = 20_000
var rounds = 5
// The object whose property is read: the test service by default.
var target = ["org.guidedaccess.Test1", "/org/guidedaccess/Test1", "org.guidedaccess.Test1", "Counter"]
var label = "ours"
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    switch argument {
    case "--address": address = arguments.next()
    case "--count": count = arguments.next().flatMap(Int.init) ?? count
    case "--rounds": rounds = arguments.next().flatMap(Int.init) ?? rounds
    case "--target":
        // --target DESTINATION PATH INTERFACE PROPERTY LABEL
        target = (0..<4).compactMap { _ in arguments.next() }
        label = arguments.next() ?? "target"
    default:
        print("usage: dbus-call-rate --address ADDR [--count N] [--rounds R]")
        exit(2)
    }
}
guard let address else {
    print("dbus-call-rate: --address is required")
    exit(2)
}

func now() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

let connection = try await Connection.connect(to: .address(address))

/// Runs the calls on the client connection's own loop thread, so that the
/// client adds no thread hops of its own to either measurement.
func measure(_ connection: Connection, target: [String], count: Int, rounds: Int) async throws -> (
    get: Double, id: Double, calls: Double
) {
    let path = try ObjectPath(validating: target[1])
    let get = { () async throws in
        _ = try await connection.call(
            destination: target[0], path: path, interface: "org.freedesktop.DBus.Properties", member: "Get",
            [.string(target[2]), .string(target[3])])
    }
    let getID = { () async throws in _ = try await connection.busID() }

    // Warm up both paths.
    for _ in 0..<500 {
        try await get()
        try await getID()
    }
    var getSeconds = 0.0
    var idSeconds = 0.0
    let perRound = max(count / rounds, 1)
    // Alternate in rounds so that drift on the machine hits both alike.
    for _ in 0..<rounds {
        var start = now()
        for _ in 0..<perRound { try await get() }
        getSeconds += now() - start
        start = now()
        for _ in 0..<perRound { try await getID() }
        idSeconds += now() - start
    }
    return (getSeconds, idSeconds, Double(perRound * rounds))
}

let (getSeconds, idSeconds, calls) = try await Task(executorPreference: connection.loop) { [count, rounds, target] in
    try await measure(connection, target: target, count: count, rounds: rounds)
}.value
let getRate = calls / getSeconds
let idRate = calls / idSeconds
func fmt(_ x: Double, _ digits: Int = 0) -> String {
    var scale = 1.0
    for _ in 0..<digits { scale *= 10 }
    let v = (x * scale).rounded() / scale
    return digits == 0 ? String(Int(v)) : String(v)
}
print("calls per kind:".padding(27) + "\(Int(calls)) in \(rounds) alternating rounds")
print("Properties.Get (\(label)):".padding(27) + "\(fmt(getRate)) calls/s, \(fmt(getSeconds / calls * 1e6, 1)) µs/call")
print("GetId (bus daemon):".padding(27) + "\(fmt(idRate)) calls/s, \(fmt(idSeconds / calls * 1e6, 1)) µs/call")
print("ratio \(label)/GetId:".padding(27) + "\(fmt(getRate / idRate, 3))  (target ≥ 0.75)")
await connection.close()

extension String {
    func padding(_ width: Int) -> String {
        count >= width ? self : self + String(repeating: " ", count: width - count)
    }
}
