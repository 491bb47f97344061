#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Testing
@testable import GuidedAccessCore

@Suite struct SessionTests {
    let programs = TestPrograms()
    var kiosk: BusCaller { BusCaller(uniqueName: ":1.10", identity: CallerIdentity(uid: 1000, executable: programs.executable("kiosk"))) }
    var kioskRestarted: BusCaller { BusCaller(uniqueName: ":1.11", identity: CallerIdentity(uid: 1000, executable: programs.executable("kiosk"))) }
    var otherApp: BusCaller { BusCaller(uniqueName: ":1.12", identity: CallerIdentity(uid: 1000, executable: programs.executable("other"))) }
    var otherUser: BusCaller { BusCaller(uniqueName: ":1.13", identity: CallerIdentity(uid: 1001, executable: programs.executable("kiosk"))) }

    func session(ownerGone: Bool = false) throws -> Session {
        var session = Session(owner: kiosk, options: try SessionParameters(parsing: [:], defaults: SessionDefaults()), nowUsec: 0)
        if ownerGone { session.connectionLeft(kiosk.uniqueName) }
        return session
    }

    @Test func startSessionWithNoSessionStarts() throws {
        #expect(try Session.decide(.startSession(hasOptions: true), session: nil, caller: kiosk) == .start)
    }

    @Test func startSessionWhileActiveIsSessionBusyEvenForTheOwner() throws {
        let session = try session()
        #expect(throws: GuidedAccessError.sessionBusy("the caller :1.10 already owns the active session")) {
            try Session.decide(.startSession(hasOptions: false), session: session, caller: kiosk)
        }
        #expect(throws: GuidedAccessError.sessionBusy("a session owned by :1.10 is active")) {
            try Session.decide(.startSession(hasOptions: false), session: session, caller: kioskRestarted)
        }
    }

    @Test func startSessionWithNoOptionsTakesOverFromAGoneOwnerOfTheSameIdentity() throws {
        #expect(try Session.decide(.startSession(hasOptions: false), session: session(ownerGone: true), caller: kioskRestarted) == .takeOver)
    }

    @Test func takingOverWithOptionsIsInvalidArgs() throws {
        let session = try session(ownerGone: true)
        #expect(throws: GuidedAccessError.self) {
            try Session.decide(.startSession(hasOptions: true), session: session, caller: kioskRestarted)
        }
        do { _ = try Session.decide(.startSession(hasOptions: true), session: session, caller: kioskRestarted) } catch {
            #expect(error.dbusErrorName == "org.freedesktop.DBus.Error.InvalidArgs")
        }
    }

    @Test func anotherIdentityCannotTakeOverAGoneOwner() throws {
        let session = try session(ownerGone: true)
        #expect(session.role(of: otherApp) == .other)
        #expect(session.role(of: otherUser) == .other)
        #expect(throws: GuidedAccessError.self) {
            try Session.decide(.startSession(hasOptions: false), session: session, caller: otherUser)
        }
        #expect(throws: GuidedAccessError.self) {
            try Session.decide(.configureForSession, session: session, caller: otherApp)
        }
    }

    @Test func anUnknownExecutableMatchesNoOwner() throws {
        let session = try session(ownerGone: true)
        let unknownExe = BusCaller(uniqueName: ":1.20", identity: CallerIdentity(uid: 1000, executable: nil))
        #expect(session.role(of: unknownExe) == .other)
    }

    @Test func anotherFileShownAtTheOwnersPathCannotTakeOver() throws {
        // A mount namespace of the caller's can put any program at the owner's path.
        let session = try session(ownerGone: true)
        let impostor = Executable(path: programs.path("kiosk"), file: programs.executable("other").file)
        #expect(session.role(of: BusCaller(uniqueName: ":1.21", identity: CallerIdentity(uid: 1000, executable: impostor))) == .other)
    }

    @Test func theProgramNowAtTheOwnersPathTakesOver() throws {
        // An upgrade replaced the owner's program: the new file is the owner's program.
        let session = try session(ownerGone: true)
        try FileManager.default.removeItem(atPath: programs.path("kiosk"))
        #expect(session.role(of: kioskRestarted) == .successor)
    }

    @Test func configureAndEndTakeOverFromAGoneOwner() throws {
        let session = try session(ownerGone: true)
        #expect(try Session.decide(.configureForSession, session: session, caller: kioskRestarted) == .takeOver)
        #expect(try Session.decide(.endSession, session: session, caller: kioskRestarted) == .takeOver)
    }

    @Test func aConnectedOwnerCannotBeTakenOverBySameIdentity() throws {
        #expect(throws: GuidedAccessError.notAuthorized(
            ":1.11 (uid 1000 running \(programs.path("kiosk"))) does not own the session of uid 1000 running \(programs.path("kiosk"))")) {
            try Session.decide(.configureForSession, session: session(), caller: kioskRestarted)
        }
    }

    @Test func notInSessionComesBeforeOwnership() {
        #expect(throws: GuidedAccessError.notInSession("no session is active (caller :1.12)")) {
            try Session.decide(.configureForSession, session: nil, caller: otherApp)
        }
        #expect(throws: GuidedAccessError.notInSession("no session is active (caller :1.12)")) {
            try Session.decide(.endSession, session: nil, caller: otherApp)
        }
    }

    @Test func endSessionByAnotherCallerNeedsAnOperator() throws {
        #expect(try Session.decide(.endSession, session: session(), caller: otherUser) == .needsOperator)
    }

    @Test func theOwnerGoesOnlyWhenItsOwnConnectionLeaves() throws {
        var session = try session()
        let strangerLeft = session.connectionLeft(":1.99")
        let ownerLeft = session.connectionLeft(":1.10")
        #expect(!strangerLeft)
        #expect(ownerLeft)
        #expect(session.ownerProperty == "")
        session.takeOver(by: kioskRestarted)
        #expect(session.ownerProperty == ":1.11")
    }

    @Test func theDeadlineIsTheTimeLimitAfterTheStartInMicroseconds() throws {
        let options = try SessionParameters(parsing: ["time-limit": .uint64(60)], defaults: SessionDefaults())
        let session = Session(owner: kiosk, options: options, nowUsec: 1_000_000)
        #expect(session.deadlineUsec == 61_000_000)
        #expect(!session.isExpired(nowUsec: 60_999_999))
        #expect(session.isExpired(nowUsec: 61_000_000))
        #expect(try self.session().deadlineUsec == 0)
    }
}
