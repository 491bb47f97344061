import GuidedAccessClient

// docs/client-library.md's example, kept compiling (never called: it needs the service).
func readmeExample() async throws {
    let guidedAccess = try await GuidedAccessClient.connect()          // .system in system mode
    try await guidedAccess.requestSession(enabled: [.screenReader], options: .init(timeLimit: .seconds(30 * 60)))
    // … the visit …
    try await guidedAccess.endSession()                                  // every setting back as it was
}
