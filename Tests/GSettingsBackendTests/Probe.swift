import Foundation
import GSettingsBackend
import Testing
import TestSupport

/// gsettings-backend-probe runs the backend in a process of its own, in the
/// private dconf's environment.
extension PrivateDconf {
    /// A private dconf whose probes use `store`.
    convenience init(store: GSettingsBackend.Store) throws {
        try self.init(environment: ["GUIDEDACCESS_PROBE_STORE": store.rawValue])
    }

    /// Runs gsettings-backend-probe with these commands; its output lines.
    func probe(_ commands: String..., extra: [String: String] = [:]) throws -> [String] {
        let output = try run(Self.probePath, commands, extra: extra)
        #expect(output.status == 0, "probe exited \(output.status): \(output.stdout)")
        return output.lines
    }

    /// The probe is built next to the test bundle.
    static let probePath: String = {
        let candidates: [String?] = [
            Bundle.main.executableURL?.deletingLastPathComponent().path,
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path,
        ]
        for case let dir? in candidates where FileManager.default.isExecutableFile(atPath: dir + "/gsettings-backend-probe") {
            return dir + "/gsettings-backend-probe"
        }
        return (candidates.compactMap { $0 }.first ?? ".") + "/gsettings-backend-probe"
    }()
}
