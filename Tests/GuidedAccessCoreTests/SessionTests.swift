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
        // Each says the way out: what the owner does instead, how another gets its turn.
        #expect(
            throws: GuidedAccessError.sessionBusy(
                "the caller :1.10 already owns the active session: change its features with ConfigureForSession, or end it with EndSession")
        ) {
            try Session.decide(.startSession(hasOptions: false), session: session, caller: kiosk)
        }
        #expect(throws: GuidedAccessError.sessionBusy("a session owned by :1.10 is active; \(Session.wayOut)")) {
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

    // MARK: (1.2) A page's tab as the owner

    func page(_ origin: String, tab: String, launcher: String = ":1.20", uid: UInt32 = 1000, program: String = "launcher")
        -> BusCaller
    {
        BusCaller(
            uniqueName: launcher, identity: CallerIdentity(uid: uid, executable: programs.executable(program), origin: origin), tab: tab)
    }

    func pageSession(_ owner: BusCaller) throws -> Session {
        Session(owner: owner, options: try SessionParameters(parsing: [:], defaults: SessionDefaults()), nowUsec: 0)
    }

    @Test func onlyTheOwningTabOwnsAPagesSession() throws {
        let owner = page("https://kiosk.example", tab: "T1")
        let session = try pageSession(owner)
        #expect(session.ownerProperty == ":1.20" && session.ownerOriginProperty == "https://kiosk.example")
        #expect(session.role(of: owner) == .owner)
        // Another tab of the same browser, same origin: not the owner while the owner is there.
        #expect(session.role(of: page("https://kiosk.example", tab: "T2")) == .other)
        // The launcher itself, on the bus: not the owner either.
        #expect(session.role(of: BusCaller(uniqueName: ":1.20", identity: owner.identity)) == .other)
    }

    @Test func aTabOfTheSameOriginAndLauncherIdentityTakesOverOnceTheOwningTabIsGone() throws {
        var session = try pageSession(page("https://kiosk.example", tab: "T1"))
        let otherTabClosed = session.pageLeft(":1.20", tab: "T2")
        #expect(!otherTabClosed)  // another tab closing changes nothing
        let ownerClosed = session.pageLeft(":1.20", tab: "T1")
        #expect(ownerClosed)
        #expect(session.ownerProperty == "" && session.ownerOriginProperty == "")
        // A new tab, also of a new launcher (the browser restarted): the same origin and launcher program.
        let successor = page("https://kiosk.example", tab: "T9", launcher: ":1.31")
        #expect(try Session.decide(.configureForSession, session: session, caller: successor) == .takeOver)
        #expect(session.role(of: page("https://other.example", tab: "T9", launcher: ":1.31")) == .other)
        #expect(session.role(of: page("https://kiosk.example", tab: "T9", launcher: ":1.31", uid: 1001)) == .other)
        #expect(session.role(of: page("https://kiosk.example", tab: "T9", launcher: ":1.31", program: "other")) == .other)
        // A bus caller running the launcher's program: not a successor of a page.
        #expect(session.role(of: BusCaller(uniqueName: ":1.40", identity: CallerIdentity(uid: 1000, executable: programs.executable("launcher")))) == .other)
        session.takeOver(by: successor)
        #expect(session.role(of: successor) == .owner && session.ownerProperty == ":1.31")
    }

    @Test func theBrowserGoingLeavesAPagesSessionOwnerless() throws {
        var session = try pageSession(page("https://kiosk.example", tab: "T1"))
        let otherBrowser = session.pageLeft(":1.99", tab: nil)
        #expect(!otherBrowser)
        let itsBrowser = session.pageLeft(":1.20", tab: nil)
        #expect(itsBrowser)
        #expect(session.owner == nil)
        // A bus owner's session is not a page's: a browser going does not touch it.
        var bus = try self.session()
        let busOwners = bus.pageLeft(kiosk.uniqueName, tab: nil)
        #expect(!busOwners)
        #expect(bus.owner == kiosk.uniqueName)
    }

    @Test func originsAreExactAndNeverOpaque() {
        for good in ["https://kiosk.example", "http://127.0.0.1:8080", "http://localhost:3000", "https://[::1]:8443"] {
            #expect(BrowserOrigin.problem(good) == nil, "\(good)")
        }
        for bad in [
            "file://", "data:text/html,x", "null", "", "https://kiosk.example/", "https://Kiosk.example", "http://host:80",
            "https://host:443", "http://host:0", "http://host:99999", "ftp://host", "https://", "http://a b",
        ] {
            #expect(BrowserOrigin.problem(bad) != nil, "\(bad)")
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
