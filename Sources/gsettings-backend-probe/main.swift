// Runs GSettingsBackend in a process of its own, so a test can hand GLib a
// private session bus and private config dirs through the environment.
//
// Each argument is one command; one output line per command:
//   get SCHEMA KEY                 → the user value in GVariant text, or `unset`
//   set SCHEMA KEY VALUE           → applies one value: `ok` or an error line
//   reset SCHEMA KEY               → applies one reset
//   stage SCHEMA KEY VALUE|-       → adds a value (or a reset, `-`) to a batch
//   apply                          → applies the staged batch at once
//   check SCHEMA KEY VALUE         → `ok` or an error line (nothing written)
//   availability SCHEMA KEY VALUE  → available, missingSchema, missingKey, wrongType(expected: T)
//   time-set SCHEMA KEY VALUE N    → N applies of one value: `p50 … p90 … max …` in µs
//   time-toggle SCHEMA KEY BOOL N  → the same, the boolean flipped each time
//   store                          → the store in use: dconf or gsettings
//   writer                         → the dconf writer's object path, or `libdconf`
//   threads                        → this process's thread names (/proc/self/task/*/comm), sorted
//   memory                         → VmRSS and RssAnon of this process, from /proc/self/status
// GUIDEDACCESS_PROBE_STORE=dconf|gsettings picks the backend's store (default:
// what GSETTINGS_BACKEND implies, as in the service).
// VALUE is GVariant text: true, false, a number (a double), or a 'string'.
// Error lines read `error KIND: MESSAGE`. Exits 2 on a malformed command.
import DBus
import Glibc
import GSettingsBackend
import GuidedAccessCore

func fail(_ message: String) -> Never {
    print("usage error: \(message)")
    exit(2)
}

func parseValue(_ text: String) -> SettingValue? {
    switch text {
    case "true": return .bool(true)
    case "false": return .bool(false)
    default: break
    }
    if text.count >= 2, text.hasPrefix("'"), text.hasSuffix("'") {
        var result = ""
        var escaping = false
        for c in text.dropFirst().dropLast() {
            if !escaping && c == "\\" { escaping = true; continue }
            escaping = false
            result.append(c)
        }
        return .string(result)
    }
    return Double(text).map(SettingValue.double)
}

func errorLine(_ error: SettingsBackendError) -> String {
    "error \(error.kind): \(error.message)"
}

/// The commands in order, on the loop the backend's dconf writer waits on,
/// as in the service.
func probe(loop: EventLoop) async {
let backend = GSettingsBackend(
    store: getenv("GUIDEDACCESS_PROBE_STORE").flatMap { GSettingsBackend.Store(rawValue: String(cString: $0)) } ?? .automatic,
    loop: loop)
var staged: [SettingKey: SettingValue?] = [:]

for command in CommandLine.arguments.dropFirst() {
    let words = command.split(separator: " ", maxSplits: 3).map(String.init)
    guard let verb = words.first else { fail("empty command") }
    func key() -> SettingKey {
        guard words.count >= 3 else { fail("\(verb) needs SCHEMA KEY") }
        return SettingKey(schema: words[1], key: words[2])
    }
    func value() -> SettingValue {
        guard words.count >= 4 else { fail("\(verb) needs a VALUE") }
        guard let value = parseValue(words[3]) else { fail("not a value: \(words[3])") }
        return value
    }
    func run(_ body: () async throws(SettingsBackendError) -> String) async {
        do throws(SettingsBackendError) {
            print(try await body())
        } catch {
            print(errorLine(error))
        }
    }
    switch verb {
    case "get":
        await run { () throws(SettingsBackendError) in try backend.userValue(of: key())?.gvariantText ?? "unset" }
    case "set":
        await run { () throws(SettingsBackendError) in try await backend.apply([key(): value()]); return "ok" }
    case "reset":
        await run { () throws(SettingsBackendError) in try await backend.apply([key(): SettingValue?.none] as [SettingKey: SettingValue?]); return "ok" }
    case "stage":
        let change: SettingValue? = words.count >= 4 && words[3] == "-" ? nil : value()
        staged.updateValue(change, forKey: key())
        print("ok")
    case "apply":
        await run { () throws(SettingsBackendError) in try await backend.apply(staged); staged = [:]; return "ok" }
    case "check":
        await run { () throws(SettingsBackendError) in _ = try backend.check([key(): value()]); return "ok" }
    case "availability":
        print(backend.availability(of: key(), for: value()))
    case "time-set", "time-toggle":
        let parts = words.count >= 4 ? words[3].split(separator: " ").map(String.init) : []
        guard parts.count == 2, let first = parseValue(parts[0]), let count = Int(parts[1]), count > 0 else {
            fail("\(verb) needs SCHEMA KEY VALUE N")
        }
        // time-toggle: a boolean key written alternately VALUE and its opposite.
        var value = first
        let toggle = verb == "time-toggle"
        if toggle, case .bool = first {} else if toggle { fail("time-toggle needs a boolean VALUE") }
        let k = key()
        var micros: [Double] = []
        let clock = ContinuousClock()
        await run { () throws(SettingsBackendError) in
            for _ in 0..<count {
                let start = clock.now
                try await backend.apply([k: value])
                let elapsed = clock.now - start
                if toggle, case .bool(let b) = value { value = .bool(!b) }
                micros.append(Double(elapsed.components.seconds) * 1e6 + Double(elapsed.components.attoseconds) / 1e12)
            }
            micros.sort()
            func at(_ q: Double) -> Int { Int(micros[min(micros.count - 1, Int(Double(micros.count) * q))]) }
            return "p50 \(at(0.5)) p90 \(at(0.9)) max \(Int(micros.last!)) µs over \(count)"
        }
    case "store":
        print(backend.store.rawValue)
    case "writer":
        print(backend.dconfWriterPath ?? "libdconf")
    case "threads":
        var names: [String] = []
        if let dir = opendir("/proc/self/task") {
            while let entry = readdir(dir) {
                let tid = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
                guard tid.first?.isNumber == true, let file = fopen("/proc/self/task/\(tid)/comm", "r") else { continue }
                var buffer = [CChar](repeating: 0, count: 64)
                if fgets(&buffer, Int32(buffer.count), file) != nil {
                    names.append(buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }.filter { $0 != "\n" })
                }
                fclose(file)
            }
            closedir(dir)
        }
        print(names.sorted().joined(separator: " "))
    case "memory":
        var lines: [String] = []
        if let status = fopen("/proc/self/status", "r") {
            var buffer = [CChar](repeating: 0, count: 256)
            while fgets(&buffer, Int32(buffer.count), status) != nil {
                let line = buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
                if line.hasPrefix("VmRSS:") || line.hasPrefix("RssAnon:") {
                    lines.append(line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).joined(separator: " "))
                }
            }
            fclose(status)
        }
        print(lines.joined(separator: ", "))
    default:
        fail("unknown command \(verb)")
    }
}
}

let loop = EventLoop()
Task(executorPreference: loop) {
    await probe(loop: loop)
    exit(0)
}
loop.run()
