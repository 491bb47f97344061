import Glibc
import Testing
@testable import GuidedAccessCore

@Suite struct AccessPolicyTests {
    static let users: [String: UInt32] = ["root": 0, "kiosk": 1000, "admin": 1002]
    static let groups: [String: UInt32] = ["wheel": 10, "kiosks": 500]

    func policy(_ mode: ServiceMode, serviceUID: UInt32 = 1000, _ entries: [(String, String, String)] = []) throws -> AccessPolicy {
        var configuration = ServiceConfiguration(defaultsFor: mode)
        for (group, key, value) in entries { try configuration.apply(group: group, key: key, value: value, file: "test.conf") }
        return try AccessPolicy(
            configuration: configuration, mode: mode, serviceUID: serviceUID, file: "test.conf",
            userID: { Self.users[$0] }, groupID: { Self.groups[$0] })
    }

    let programs = TestPrograms()
    let root = CallerIdentity(uid: 0)
    var kiosk: CallerIdentity { CallerIdentity(uid: 1000, gids: [1000], executable: programs.executable("kiosk-browser")) }
    var stranger: CallerIdentity { CallerIdentity(uid: 1001, gids: [1001], executable: programs.executable("other")) }

    @Test func aPageIsAClientNeverAnOperatorEvenInTheBrowserOfAnOperator() throws {
        // (1.2) The service's own user, whom user mode makes an operator, running the launcher.
        var page = kiosk
        page.origin = "https://kiosk.example"
        for mode in [ServiceMode.user, .system] {
            let policy = try policy(mode, [("Clients", "AllowUsers", ""), ("Operators", "AllowUsers", "kiosk")])
            #expect(policy.isOperator(kiosk) || mode == .user)
            #expect(policy.isClient(page))
            #expect(!policy.isOperator(page))
            #expect(policy.verdict(for: page, action: .endSession) == .askPolkit(action: PolkitAction.endSession.id))
        }
    }

    @Test func inSystemModeRootIsAlwaysClientAndOperator() throws {
        let policy = try policy(.system, serviceUID: 0, [("Clients", "AllowUsers", ""), ("Operators", "AllowUsers", "")])
        #expect(policy.verdict(for: root, action: .startSession) == .admitted)
        #expect(policy.verdict(for: root, action: .endSession) == .admitted)
        #expect(policy.verdict(for: root, action: .manageRestrictions) == .admitted)
    }

    @Test func inSystemModeAnUnlistedUserIsAskedAboutThroughPolkit() throws {
        let policy = try policy(.system, serviceUID: 0)
        #expect(policy.verdict(for: kiosk, action: .startSession) == .askPolkit(action: "org.guidedaccess.GuidedAccess1.start-session"))
        #expect(policy.verdict(for: kiosk, action: .endSession) == .askPolkit(action: "org.guidedaccess.GuidedAccess1.end-session"))
        #expect(policy.verdict(for: kiosk, action: .manageRestrictions) == .askPolkit(action: "org.guidedaccess.GuidedAccess1.manage-restrictions"))
    }

    @Test func inUserModeWithoutGroupsTheBusUserIsClientAndOperator() throws {
        let policy = try policy(.user)
        #expect(policy.isClient(kiosk))
        #expect(policy.isOperator(kiosk))
        #expect(!policy.isClient(stranger))
    }

    @Test func inUserModeAClientsGroupReplacesTheBusUserRule() throws {
        let policy = try policy(.user, [("Clients", "AllowExecutables", programs.path("kiosk-browser"))])
        #expect(policy.isClient(kiosk))
        let shell = CallerIdentity(uid: 1000, executable: programs.executable("bash"))
        #expect(!policy.isClient(shell))
        // No [Operators] group: the bus's own user is still an operator.
        #expect(policy.isOperator(shell))
    }

    @Test func inUserModeAnEmptyOperatorsGroupLeavesOperatorsToPolkit() throws {
        let policy = try policy(.user, [("Operators", "AllowGroups", "")])
        #expect(policy.verdict(for: kiosk, action: .endSession) == .askPolkit(action: "org.guidedaccess.GuidedAccess1.end-session"))
        #expect(policy.verdict(for: kiosk, action: .startSession) == .admitted)
    }

    @Test func rootIsNotSpecialInUserMode() throws {
        let policy = try policy(.user, [("Clients", "AllowUsers", "kiosk")])
        #expect(!policy.isClient(root))
    }

    @Test func clientsMatchByUserGroupExecutableOrUnit() throws {
        let policy = try policy(.system, serviceUID: 0, [
            ("Clients", "AllowUsers", "kiosk;1003"),
            ("Clients", "AllowGroups", "kiosks"),
            ("Clients", "AllowExecutables", programs.path("app")),
            ("Clients", "AllowUnits", "kiosk-app.service"),
        ])
        #expect(policy.isClient(CallerIdentity(uid: 1000)))
        #expect(policy.isClient(CallerIdentity(uid: 1003)))
        #expect(policy.isClient(CallerIdentity(uid: 2000, gids: [500])))
        #expect(policy.isClient(CallerIdentity(uid: 2000, executable: programs.executable("app"))))
        #expect(policy.isClient(CallerIdentity(uid: 2000, systemdUnit: "kiosk-app.service")))
        #expect(!policy.isClient(CallerIdentity(uid: 2000, gids: [10], executable: programs.executable("other"), systemdUnit: "other.service")))
    }

    @Test func anAllowedExecutableIsTheFileAtItsPathNotThePathACallerShows() throws {
        let app = programs.executable("app")
        let policy = try policy(.system, serviceUID: 0, [("Clients", "AllowExecutables", app.path)])
        #expect(policy.isClient(CallerIdentity(uid: 2000, executable: app)))
        // Another program a mount namespace shows at the allowed path:
        let impostor = Executable(path: programs.path("app"), file: programs.executable("other").file)
        #expect(!policy.isClient(CallerIdentity(uid: 2000, executable: impostor)))
        // The allowed program reached by another path (usrmerge's /bin → /usr/bin):
        #expect(symlink(app.path, programs.path("app-link")) == 0)
        let viaLink = try self.policy(.system, serviceUID: 0, [("Clients", "AllowExecutables", programs.path("app-link"))])
        #expect(viaLink.isClient(CallerIdentity(uid: 2000, executable: app)))
    }

    @Test func operatorsMatchByUserOrGroup() throws {
        let policy = try policy(.system, serviceUID: 0, [("Operators", "AllowGroups", "wheel"), ("Operators", "AllowUsers", "admin")])
        #expect(policy.isOperator(CallerIdentity(uid: 2000, gids: [10])))
        #expect(policy.isOperator(CallerIdentity(uid: 1002)))
        #expect(!policy.isOperator(kiosk))
        #expect(!policy.isClient(CallerIdentity(uid: 1002)))
    }

    @Test func agentAllowUsersTakesNamesAndUidsAndNeverRoot() throws {
        #expect(try policy(.system, serviceUID: 0).agentUIDs == nil)
        #expect(try policy(.system, serviceUID: 0, [("Agent", "AllowUsers", "kiosk;1003")]).agentUIDs == [1000, 1003])
        #expect(try policy(.system, serviceUID: 0, [("Agent", "AllowUsers", "")]).agentUIDs == [])
        for root in ["root", "0", "kiosk;0"] {
            #expect(throws: ConfigurationError(
                file: "test.conf", group: "Agent", key: "AllowUsers", value: root,
                reason: "root is never the session agent: name the kiosk user")) {
                try policy(.system, serviceUID: 0, [("Agent", "AllowUsers", root)])
            }
        }
        #expect(throws: ConfigurationError(
            file: "test.conf", group: "Agent", key: "AllowUsers", value: "ghost", reason: "no user 'ghost' on this system")) {
            try policy(.system, serviceUID: 0, [("Agent", "AllowUsers", "ghost")])
        }
    }

    @Test func anUnknownUserNameIsAConfigurationError() {
        #expect(throws: ConfigurationError(
            file: "test.conf", group: "Clients", key: "AllowUsers", value: "kiosk;ghost", reason: "no user 'ghost' on this system")) {
            try policy(.system, serviceUID: 0, [("Clients", "AllowUsers", "kiosk;ghost")])
        }
    }

    @Test func endSessionAdmitsTheOwnersIdentityWithoutPolkit() throws {
        let policy = try policy(.system, serviceUID: 0)
        let owner = BusCaller(uniqueName: ":1.5", identity: kiosk)
        let session = Session(owner: owner, options: try SessionParameters(parsing: [:], defaults: SessionDefaults()), nowUsec: 0)
        #expect(policy.admission(for: .endSession, session: session, caller: owner) == .admitted)
        #expect(policy.admission(for: .endSession, session: session, caller: BusCaller(uniqueName: ":1.6", identity: stranger))
            == .askPolkit(action: "org.guidedaccess.GuidedAccess1.end-session"))
        #expect(policy.admission(for: .startSession(hasOptions: false), session: session, caller: owner)
            == .askPolkit(action: "org.guidedaccess.GuidedAccess1.start-session"))
    }
}
