import DBus
import GuidedAccessCore

/// The drivers seen from the service: what they deliver becomes
/// `SupportedFeatures` and `Desktop`, their changes are announced and
/// applied to the session, and what they report reaches the log and the
/// audit (spec: "Making features real").
extension GuidedAccessService {
    /// Starts every driver, then computes what they deliver.
    func startDrivers() async {
        let loop = connection.loop
        await store.startDrivers { [self] name, event in
            Task(executorPreference: loop) { await self.driverEvent(name, event) }
        }
        logSupport()
    }

    private func driverEvent(_ driver: String, _ event: DriverEvent) async {
        switch event {
        case .changed:
            let (changed, problems) = await store.driversChanged()
            if changed { logSupport() }
            for problem in problems { logger.error("after \(driver) changed, applying the session again: \(problem)") }
            if changed { await announce() }
        case .recordChanged:
            if let problem = store.noteRecords() { logger.error("\(driver): \(problem)") }
        case .featureLost(let feature, let message, let fields):
            guard session?.features.contains(feature) == true else { return }
            settings.audit.record(.programGaveUp, caller: nil, message, fields: fields)
        }
    }

    /// A call asks for `features`: drivers that could deliver the ones not
    /// supported now look again (a browser started after the service), so
    /// that what came since is used.
    func lookAgain(for features: Set<Feature>) async {
        let missing = features.subtracting(store.support.supported)
        guard !missing.isEmpty else { return }
        for driver in store.drivers { await driver.lookAgain(for: missing) }
        if store.updateSupport() {
            logSupport()
            await announce()
        }
    }

    /// For `SupportedFeatures` and `Desktop`: a client reading them lets
    /// the drivers that find what they depend on only by looking, look
    /// (without waiting). nil when no driver does.
    nonisolated var readLookout: (@Sendable () -> Void)? {
        guard driversFollowReads else { return nil }
        let loop = connection.loop
        return { Task(executorPreference: loop) { await self.supportWasRead() } }
    }

    private func supportWasRead() {
        for driver in store.drivers { driver.supportWasRead() }
    }

    func logSupport() {
        let support = store.support
        let missing = Feature.allCases.compactMap { support.reasons[$0] }
        let notSupported = missing.isEmpty ? "" : "; not supported: " + missing.joined(separator: "; ")
        logger.info(
            "backend \(settings.backendName), desktop \(support.desktop): supported features \(support.supported.sortedWireNames.joined(separator: ", "))\(notSupported)"
        )
    }

    func log(_ notes: [DriverNote]) {
        for note in notes {
            switch note.level {
            case .info: logger.info("\(note.text)")
            case .notice: logger.notice("\(note.text)")
            case .error: logger.error("\(note.text)")
            }
        }
    }
}
