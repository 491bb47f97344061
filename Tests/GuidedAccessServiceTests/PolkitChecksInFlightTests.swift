import Testing

@testable import GuidedAccessService

@Suite struct PolkitChecksInFlightTests {
    @Test func aUserHasAFewChecksInFlightAtMost() {
        var checks = PolkitChecksInFlight(perUser: 2, total: 8)
        #expect(checks.begin(65534) == nil)
        #expect(checks.begin(65534) == nil)
        #expect(checks.begin(65534) == "too many polkit checks in flight for uid 65534 (2)")
        checks.end(65534)
        #expect(checks.begin(65534) == nil)
    }

    @Test func anotherUserGetsRoomWhileOneFloods() {
        // The operator's check goes to polkit however many the flooder sent.
        var checks = PolkitChecksInFlight(perUser: 2, total: 8)
        for _ in 0..<300 { _ = checks.begin(65534) }
        #expect(checks.count == 2)
        #expect(checks.begin(1000) == nil)
    }

    @Test func allUsersTogetherHaveTheTotalAtMost() {
        var checks = PolkitChecksInFlight(perUser: 2, total: 3)
        #expect(checks.begin(1) == nil)
        #expect(checks.begin(2) == nil)
        #expect(checks.begin(3) == nil)
        #expect(checks.begin(4) == "too many polkit checks in flight (3)")
        checks.end(2)
        #expect(checks.begin(4) == nil)
        #expect(checks.count == 3)
    }
}
