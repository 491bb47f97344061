@testable import GuidedAccessCore

/// The memory backend under another name (`test`), standing for a kiosk or
/// not (`realisesEveryFeature`), whose next write can be held until the
/// test lets it go.
final class TestBackend: SettingsBackend {
    let inner: MemorySettingsBackend
    let realisesEveryFeature: Bool
    var holdNext = false
    private var held: CheckedContinuation<Void, Never>?

    init(_ inner: MemorySettingsBackend = MemorySettingsBackend(), realisesEveryFeature: Bool = false) {
        self.inner = inner
        self.realisesEveryFeature = realisesEveryFeature
    }

    var name: String { "test" }

    func availability(of key: SettingKey, for value: SettingValue) -> SettingAvailability {
        inner.availability(of: key, for: value)
    }

    func check(_ changes: [SettingKey: SettingValue?]) throws(SettingsBackendError) -> CheckedChange {
        try inner.check(changes)
    }

    func userValue(of key: SettingKey) throws(SettingsBackendError) -> SettingValue? { try inner.userValue(of: key) }

    nonisolated(nonsending) func apply(_ change: CheckedChange) async throws(SettingsBackendError) {
        if holdNext {
            holdNext = false
            await withCheckedContinuation { held = $0 }
        }
        try await inner.apply(change)
    }

    /// Waits until a write is held, then lets it go after `meanwhile`.
    nonisolated(nonsending) func release(after meanwhile: () throws -> Void) async rethrows {
        while held == nil { await Task.yield() }
        try meanwhile()
        held!.resume()
        held = nil
    }
}
