/// The features' settings keys (settings-mapping.md), written to a
/// `SettingsBackend` (GSettings, a dconf system database, memory) and put
/// back: the first driver of every list.
///
/// Crash-safe by writing ahead: `prepare` records in the snapshot, for every
/// key the change writes, its value from before the session — the store
/// journals that before `apply` writes. Keys given back leave the snapshot
/// once their restore is written, and the journal catches up later. So after
/// a crash the journal knows every key that may have been written and what
/// to put back — at worst a key is restored that was never changed. A write
/// whose outcome is unknown (the store did not answer in time) counts as
/// made: its keys stay in the snapshot, and the next change or the end puts
/// them back. Outside a session the snapshot holds only such keys: they are
/// still owed a restore (`SessionStore.settle`).
///
/// The keys themselves deliver nothing by their own: what acts on them is
/// the desktop (another driver says so), except for the memory backend,
/// which stands for a whole kiosk by itself (tests, benchmarks).
package final class SettingsDriver: FeatureDriver {
    package let name = "settings"
    package let backend: any SettingsBackend
    package let keyMap: FeatureKeyMap
    /// For each value of the journal's `snapshot`: the key's value before the session.
    package private(set) var snapshot: [SettingKey: StoredValue] = [:] {
        didSet { cachedRecord = nil }
    }
    /// `record`, made once per snapshot: the store reads it at every journal write.
    private var cachedRecord: JSON??
    package let capabilities: [Feature: FeatureCapability]
    package var desktopPart: DesktopPart? { nil }
    /// The target whose keys the backend holds now, and their values.
    private var current = DriverTarget.none {
        didSet { held = keyMap.keyValues(for: current.features, options: current.keyMapOptions) }
    }
    private var held: [SettingKey: SettingValue] = [:]
    private var prepared: Prepared?
    private var restoredAtEnd = 0

    private struct Prepared {
        let target: DriverTarget
        let checked: CheckedChange
        /// The snapshot before `prepare` added to it.
        let before: [SettingKey: StoredValue]
        /// Keys the change puts back to their snapshot value.
        let restores: [SettingKey]
    }

    /// Asks the backend which keys this system has (`FeatureKeyMap.probe`).
    package init(backend: any SettingsBackend) {
        self.backend = backend
        var available: [SettingKey: Bool] = [:]
        for requirement in FeatureKeyMap.allRequirements {
            available[requirement.key] = backend.availability(of: requirement.key, for: requirement.exampleValue) == .available
        }
        let (supported, keyMap) = FeatureKeyMap.probe { available[$0.key] == true }
        self.keyMap = keyMap
        var capabilities: [Feature: FeatureCapability] = [:]
        for feature in Feature.allCases {
            if supported.contains(feature) {
                if backend.realisesEveryFeature { capabilities[feature] = .delivers(.part) }
            } else {
                let missing = FeatureKeyMap.requirements(of: feature).filter { !$0.isOptional && available[$0.key] != true }
                capabilities[feature] = .impossible(
                    "this system's settings (\(backend.name) backend) lack "
                        + missing.map { "\($0.key)" }.joined(separator: ", ")
                        + ": their schemas come with gsettings-desktop-schemas, in a version that has these keys")
            }
        }
        self.capabilities = capabilities
    }

    package nonisolated(nonsending) func start(_ events: @escaping @Sendable (DriverEvent) -> Void) async {}

    // MARK: The transaction

    /// The keys the target needs written (those whose value differs from what
    /// the backend holds of ours), and every snapshot key it no longer needs
    /// back to its value from before — also keys owed by a write of unknown
    /// outcome. Checked against the schemas; the snapshot learns the keys
    /// about to be written.
    package func prepare(_ target: DriverTarget) throws(DriverFailure) {
        prepared = nil
        let wanted = keyMap.keyValues(for: target.features, options: target.keyMapOptions)
        var changes: [SettingKey: SettingValue?] = [:]
        for (key, value) in wanted where held[key] != value { changes[key] = .some(value) }
        var restores: [SettingKey] = []
        for (key, stored) in snapshot where wanted[key] == nil {
            changes[key] = .some(stored.settingValue)
            restores.append(key)
        }
        let checked: CheckedChange
        do {
            checked = try backend.check(changes)
        } catch {
            throw DriverFailure(.unsupported, error.message)
        }
        let before = snapshot
        do {
            for key in wanted.keys where changes[key] != nil && snapshot[key] == nil {
                snapshot[key] = StoredValue(try backend.userValue(of: key))
            }
        } catch {
            snapshot = before
            throw DriverFailure(.failed, "\(backend.name) backend: \(error.message)")
        }
        prepared = Prepared(target: target, checked: checked, before: before, restores: restores)
    }

    package func cancel() {
        guard let prepared else { return }
        snapshot = prepared.before
        self.prepared = nil
    }

    package nonisolated(nonsending) func apply(_ target: DriverTarget) async throws(DriverFailure) -> Bool {
        if prepared?.target != target { try prepare(target) }
        let change = prepared!
        prepared = nil
        let ending = target.features.isEmpty && !change.restores.isEmpty
        if !change.checked.isEmpty {
            do {
                try await backend.apply(change.checked)
            } catch {
                let what = ending ? "\(backend.name) backend: cannot restore the settings" : "\(backend.name) backend"
                if error.kind == .outcomeUnknown {
                    // It may have been written: the snapshot keeps its keys,
                    // which the next change or the end puts back.
                    throw DriverFailure(.outcomeUnknown, "\(what): \(error.message)")
                }
                // Nothing was changed: backends apply all or nothing.
                snapshot = change.before
                throw DriverFailure(.failed, "\(what): \(error.message)")
            }
        }
        if current != target { current = target }
        for key in change.restores { snapshot[key] = nil }
        if target.features.isEmpty { restoredAtEnd = change.restores.count }
        return false
    }

    package var endSummary: DriverSummary? {
        DriverSummary(text: "\(restoredAtEnd) keys restored", fields: ["RESTORED_KEYS": String(restoredAtEnd)])
    }

    // MARK: The journal

    package var record: JSON? {
        if let cachedRecord { return cachedRecord }
        let record: JSON? = snapshot.isEmpty ? nil : .object([("snapshot", .array(JournalRecord.entries(snapshot).map { $0.json() }))])
        cachedRecord = .some(record)
        return record
    }

    package func validate(_ record: JSON) throws(DriverRecordError) {
        _ = try Self.snapshot(of: record)
    }

    static func snapshot(of record: JSON) throws(DriverRecordError) -> [SettingKey: StoredValue] {
        guard case .array(let items)? = record["snapshot"] else { throw DriverRecordError("'snapshot' is not an array") }
        do {
            return try JournalRecord.snapshot(items.map { item throws(JournalRecord.Invalid) in
                try JournalRecord.SnapshotEntry(json: item)
            })
        } catch {
            throw DriverRecordError(error.reason)
        }
    }

    /// A record holding `snapshot`, as a journal of version 1 kept it.
    static func record(of snapshot: [JSON]) -> JSON {
        .object([("snapshot", .array(snapshot))])
    }

    // MARK: Recovery

    package nonisolated(nonsending) func recover(
        _ record: JSON?, target: DriverTarget?, endsNow: Bool
    ) async -> [DriverNote] {
        snapshot = (try? record.map(Self.snapshot(of:))) ?? [:]
        var notes: [DriverNote] = []
        guard let target else {
            current = .none
            if !snapshot.isEmpty {
                do {
                    try await backend.apply(try backend.check(snapshot.mapValues(\.settingValue)))
                    snapshot = [:]
                } catch {
                    notes.append(DriverNote(.error, "cannot put back yet the keys a session that did not start may have changed (\(error.message)); retrying"))
                }
            }
            do {
                let released = try backend.startedWithoutSession()
                if !released.isEmpty {
                    notes.append(DriverNote(.notice, "no session in the journal: \(released.map { "\($0)" }.joined(separator: ", ")) no longer imposed"))
                }
            } catch {
                notes.append(DriverNote(.error, "no session in the journal, but what the backend still applies stays: \(error.message)"))
            }
            return notes
        }
        var values: [SettingKey: SettingValue?] = [:]
        for key in snapshot.keys.sorted() {
            do {
                values[key] = .some(try backend.userValue(of: key))
            } catch {
                notes.append(DriverNote(.error, "cannot read \(key) to check it against the journal: \(error.message)"))
            }
        }
        let plan = SettingsRecoveryPlan(
            features: target.features, options: target.keyMapOptions, keyMap: keyMap, snapshot: snapshot,
            currentValues: values, endsNow: endsNow)
        var forget = plan.givenBack
        if !plan.changes.isEmpty {
            let keys = plan.changes.keys.sorted().map { "\($0)" }.joined(separator: ", ")
            do {
                try await backend.apply(try backend.check(plan.changes))
                notes.append(DriverNote(.notice, "the journal was ahead of the settings (a crash mid-call): \(keys) put in line with it"))
            } catch {
                notes.append(DriverNote(.error, "cannot put \(keys) in line with the journal: \(error.message)"))
                // Those still to be restored stay in the snapshot: the session's end restores them.
                forget.removeAll { plan.changes[$0] != nil }
            }
        }
        for key in forget { snapshot[key] = nil }
        current = target
        return notes
    }
}

extension DriverTarget {
    var keyMapOptions: FeatureKeyMap.Options { FeatureKeyMap.Options(zoomFactor: zoomFactor, textScale: textScale) }
}

/// How a restarted service takes up the journal's snapshot for a session
/// that goes on: a pure function of the session's features, the key map,
/// the snapshot and the keys' values now.
///
/// The journal is written before the settings, and keys a call gives back
/// leave its snapshot only at a later write. So a resumed session may be one
/// call ahead of the keys, or still list keys it gave back. The plan puts
/// the keys in line with it:
/// - a key its features require gets their value;
/// - a listed key they do not require is put back to its snapshot value only
///   while it still has a value the session would have written (the restore
///   never happened); otherwise it was given back already — perhaps changed
///   by the user since — and is left alone. Either way it leaves the
///   snapshot, so the session's end does not touch it; only a key whose
///   restore fails stays, for the end to restore.
/// A session about to end (`endsNow`: its time limit passed, or its end was
/// under way) gets no writes: its end restores what the snapshot keeps. A
/// key that could not be read (absent from `currentValues`) is left as the
/// journal has it.
package struct SettingsRecoveryPlan: Equatable {
    /// Writes that put keys in line with the session.
    package var changes: [SettingKey: SettingValue?]
    /// Keys that leave the snapshot (those in `changes` only once written).
    package var givenBack: [SettingKey]

    package init(
        features: Set<Feature>, options: FeatureKeyMap.Options, keyMap: FeatureKeyMap,
        snapshot: [SettingKey: StoredValue], currentValues: [SettingKey: SettingValue?], endsNow: Bool
    ) {
        changes = [:]
        givenBack = []
        let wanted = keyMap.keyValues(for: features, options: options)
        for (key, stored) in snapshot.sorted(by: { $0.key < $1.key }) {
            guard let current = currentValues[key] else { continue }
            if let value = wanted[key] {
                if !endsNow && current != value { changes[key] = .some(value) }
                continue
            }
            let sessionValues = Feature.allCases.filter { !features.contains($0) }.compactMap {
                keyMap.keyValues(for: features.union([$0]), options: options)[key]
            }
            if let current, sessionValues.contains(current), current != stored.settingValue {
                // The restore never happened.
                guard !endsNow else { continue }
                changes[key] = .some(stored.settingValue)
            }
            givenBack.append(key)
        }
    }
}
