#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Glibc
import Testing
@testable import GuidedAccessCore

@Suite struct SessionJournalTests {
    /// A fresh directory per test, removed afterwards.
    final class TemporaryDirectory {
        let path: String
        init() {
            var template = Array("/tmp/guidedaccess-journal-XXXXXX".utf8CString)
            path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
        }
        var files: [String] { (try? FileManager.default.contentsOfDirectory(atPath: path))?.sorted() ?? [] }
        /// Without the journal's recycled dot files (`.journal.json.slot-a`, …).
        var visibleFiles: [String] { files.filter { !$0.hasPrefix(".") } }
        func write(_ text: String, to name: String) {
            _ = FileManager.default.createFile(atPath: path + "/" + name, contents: Data(text.utf8))
        }
        func read(_ name: String) -> String? {
            FileManager.default.contents(atPath: path + "/" + name).map { String(decoding: $0, as: UTF8.self) }
        }
        deinit { try? FileManager.default.removeItem(atPath: path) }
    }

    let directory = TemporaryDirectory()
    var journal: SessionJournal { SessionJournal(directory: directory.path) }

    var sampleState: JournalState {
        let session = Session(
            owner: ":1.42", ownerIdentity: OwnerIdentity(uid: 1000, executablePath: "/usr/bin/kiosk"),
            features: [.zoom, .invertColors, .reduceMotion], zoomFactor: 2.5, textScale: 1.5, inhibitSleep: false,
            deadlineUsec: 1_800_000_000_000_000)
        return JournalState(
            session: session,
            restrictions: [
                Restriction(identifier: "com.example.a", text: "A", detail: "", state: .deny),
                Restriction(identifier: "com.example.b", text: "B", detail: "Détail", state: .allow),
            ],
            drivers: SessionStoreTests.settingsRecord([
                .magFactor: .set(.double(1.25)), .invertLightness: .unset,
                .screenPosition: .set(.string("top-half")), .enableAnimations: .set(.bool(true)),
            ]))
    }

    /// Loads the journal as the service does with the settings driver: its
    /// record checked by the driver.
    func load() throws(JournalError) -> JournalState? {
        try journal.load { name, record throws(DriverRecordError) in
            if name == "settings" { _ = try SettingsDriver.snapshot(of: record) }
        }
    }

    @Test func noJournalLoadsAsNil() throws {
        #expect(try journal.load() == nil)
    }

    @Test func aRecordedStateLoadsBackTheSame() throws {
        try journal.record(sampleState)
        #expect(try journal.load() == sampleState)
    }

    @Test func aPagesSessionKeepsItsOriginAndComesBackOwnerless() throws {
        var state = sampleState
        state.session?.ownerIdentity.origin = "https://kiosk.example"
        state.session?.ownerTab = "6A0B9C"
        try journal.record(state)
        let loaded = try #require(try journal.load()?.session)
        #expect(loaded.ownerIdentity == OwnerIdentity(uid: 1000, executablePath: "/usr/bin/kiosk", origin: "https://kiosk.example"))
        // The tab is not journaled: a page of the origin takes it over.
        #expect(loaded.owner == nil && loaded.ownerTab == nil)
        #expect(try #require(directory.read("journal.json")).contains(#""ownerOrigin" : "https://kiosk.example""#))
        // A bus owner's journal has no origin.
        try journal.record(sampleState)
        #expect(try journal.load() == sampleState)
        #expect(try #require(directory.read("journal.json")).contains("ownerOrigin") == false)
    }

    @Test func anOwnerOriginThatIsNoOriginMakesTheJournalCorrupt() throws {
        var state = sampleState
        state.session?.ownerIdentity.origin = "file://"
        try journal.record(state)
        #expect(throws: JournalError.self) { try journal.load() }
    }

    @Test func eachDriversRecordIsKeptUnderItsNameAndLoadsBack() throws {
        var state = sampleState
        state.drivers["session-programs"] = .object([("programs", .array([.object([("unit", .string("u"))])]))])
        try journal.record(state)
        #expect(try journal.load() == state)
        let text = try #require(directory.read("journal.json"))
        #expect(text.contains(#""drivers" : {"#) && text.contains(#""session-programs" : {"#))
    }

    @Test func aRecordItsDriverRefusesMakesTheJournalCorrupt() throws {
        var state = sampleState
        state.drivers["session-programs"] = .object([("programs", .string("not a list"))])
        try journal.record(state)
        do {
            _ = try journal.load { name, _ throws(DriverRecordError) in
                if name == "session-programs" { throw DriverRecordError("'programs' is not an array") }
            }
            Issue.record("the journal loaded")
        } catch {
            guard case .corrupt(_, _, let why) = error else {
                Issue.record("\(error)")
                return
            }
            #expect(why == "the record of 'session-programs': 'programs' is not an array")
        }
        #expect(directory.visibleFiles.allSatisfy { $0.hasPrefix("journal.corrupt-") })
    }

    @Test func aDriverNameThatIsNoDriversIsCorrupt() throws {
        var state = sampleState
        state.drivers["../etc"] = .null
        try journal.record(state)
        #expect(keptAsideAsCorrupt(because: "is not a driver's name"))
    }

    /// A journal of version 1, as the service before drivers wrote it: the
    /// settings' snapshot in the session, owed keys at the top, the programs
    /// in the session.
    static let version1 = #"""
        {
          "owed" : [ { "key" : "color-saturation", "schema" : "org.gnome.desktop.a11y.magnifier", "unset" : true },
                     { "double" : 3.0, "key" : "mag-factor", "schema" : "org.gnome.desktop.a11y.magnifier", "unset" : false } ],
          "restrictions" : [ ],
          "session" : {
            "deadlineUsec" : 0, "features" : [ "screen-reader", "zoom" ], "inhibitSleep" : true,
            "owner" : ":1.7", "ownerExecutable" : "/usr/bin/kiosk", "ownerUID" : 1000,
            "programs" : [ { "feature" : "screen-reader", "unit" : "guidedaccess-screen-reader-42-1.service" } ],
            "snapshot" : [ { "double" : 2.0, "key" : "mag-factor", "schema" : "org.gnome.desktop.a11y.magnifier", "unset" : false } ],
            "textScale" : 1.5, "zoomFactor" : 2.0
          },
          "version" : 1
        }
        """#

    @Test func aJournalOfVersion1IsReadAsTheDriversRecords() throws {
        directory.write(Self.version1, to: "journal.json")
        let state = try #require(try load())
        #expect(state.session?.features == [.screenReader, .zoom] && state.session?.owner == ":1.7")
        // The session's value from before it wins over the owed one of the same key.
        #expect(try SettingsDriver.snapshot(of: try #require(state.drivers["settings"])) == [
            .magFactor: .set(.double(2.0)), .colorSaturation: .unset,
        ])
        #expect(state.drivers["session-programs"] == .object([("programs", .array([.object([
            ("feature", .string("screen-reader")), ("unit", .string("guidedaccess-screen-reader-42-1.service")),
        ])]))]))
        // Written again, it is version 2.
        try journal.record(state)
        #expect(directory.read("journal.json")?.contains("\"version\" : 2") == true)
        #expect(try load() == state)
    }

    @Test func aStateWithoutSessionKeepsTheRestrictions() throws {
        let state = JournalState(session: nil, restrictions: [Restriction(identifier: "x", text: "X", detail: "")])
        try journal.record(state)
        #expect(try journal.load() == state)
    }

    @Test func theOwnerGoneIsStoredAsNoOwner() throws {
        var state = sampleState
        state.session?.owner = nil
        try journal.record(state)
        #expect(try journal.load()?.session?.owner == nil)
    }

    @Test func recordingLeavesOnlyTheJournalAndItsTwoSlotsBehind() throws {
        try journal.record(sampleState)
        try journal.record(JournalState(session: nil, restrictions: []))
        try journal.record(sampleState)
        #expect(directory.files == [".journal.json.slot-a", ".journal.json.slot-b", "journal.json"])
    }

    @Test func theJournalCarriesAVersion() throws {
        try journal.record(sampleState)
        #expect(directory.read("journal.json")?.contains("\"version\" : 2") == true)
    }

    @Test func aCorruptJournalIsReportedAndKeptAside() throws {
        directory.write("{ not json", to: "journal.json")
        var reported: JournalError?
        do { _ = try journal.load() } catch { reported = error }
        guard case .corrupt(_, let movedTo, _) = reported else {
            Issue.record("expected a corrupt-journal error, got \(String(describing: reported))")
            return
        }
        #expect(movedTo.hasPrefix(directory.path + "/journal.corrupt-"))
        #expect(directory.visibleFiles.count == 1)
        #expect(directory.visibleFiles.first?.hasPrefix("journal.corrupt-") == true)
        #expect(directory.read(String(movedTo.dropFirst(directory.path.count + 1))) == "{ not json")
        #expect(try journal.load() == nil)
    }

    @Test func aJournalWithAnUnknownFeatureIsCorrupt() throws {
        try journal.record(sampleState)
        let text = directory.read("journal.json")!.replacing("\"zoom\"", with: "\"warp\"")
        directory.write(text, to: "journal.json")
        #expect(throws: JournalError.self) { try journal.load() }
        #expect(directory.visibleFiles.allSatisfy { $0.hasPrefix("journal.corrupt-") })
    }

    @Test func aJournalFromANewerVersionIsLeftInPlace() throws {
        directory.write(#"{"version": 3, "restrictions": []}"#, to: "journal.json")
        #expect(throws: JournalError.unsupportedVersion(path: journal.path, version: 3)) { try journal.load() }
        #expect(directory.files == ["journal.json"])
    }

    @Test func aStaleTemporaryFileFromACrashIsReplaced() throws {
        directory.write("half-linked", to: ".journal.json.new")
        try journal.record(sampleState)
        #expect(directory.files == [".journal.json.slot-a", "journal.json"])
        #expect(try journal.load() == sampleState)
    }

    @Test func aTemporaryNameLeftLinkedToASlotByACrashIsReplaced() throws {
        try journal.record(sampleState)
        try journal.record(sampleState)
        // Killed between link and rename: the slot it wrote has a second name.
        #expect(link(directory.path + "/.journal.json.slot-a", directory.path + "/.journal.json.new") == 0)
        let state = JournalState(session: nil, restrictions: [Restriction(identifier: "x", text: "X", detail: "")])
        try journal.record(state)
        #expect(try journal.load() == state)
        #expect(directory.files == [".journal.json.slot-a", ".journal.json.slot-b", "journal.json"])
        try journal.record(sampleState)
        #expect(try journal.load() == sampleState)
    }

    @Test func theJournalsBytesAreTheSerializedRecordPaddedToABlock() throws {
        try journal.record(sampleState)
        let expected = JournalRecord(sampleState).json().serialized()
        let text = try #require(directory.read("journal.json"))
        #expect(text.utf8.count == 4096)
        #expect(text.hasPrefix(expected))
        #expect(text.utf8.dropFirst(expected.utf8.count).dropLast().allSatisfy { $0 == UInt8(ascii: " ") })
        #expect(text.hasSuffix("\n"))
    }

    @Test func aDirectoryRemovedAfterTheFirstRecordIsMadeAgain() throws {
        let journal = SessionJournal(directory: directory.path + "/state")
        try journal.record(sampleState)
        for name in [".journal.json.slot-a", "journal.json"] { unlink(journal.directory + "/" + name) }
        #expect(rmdir(journal.directory) == 0)
        try journal.record(sampleState)
        #expect(try journal.load() == sampleState)
        var status = stat()
        #expect(lstat(journal.directory, &status) == 0 && status.st_mode & 0o7777 == 0o700)
    }

    @Test func aDirectoryReplacedByAFileFailsCleanlyAndIsMadeAgainOnceItIsGone() throws {
        let journal = SessionJournal(directory: directory.path + "/state")
        try journal.record(sampleState)
        for name in [".journal.json.slot-a", "journal.json"] { unlink(journal.directory + "/" + name) }
        #expect(rmdir(journal.directory) == 0)
        directory.write("not a directory", to: "state")
        #expect(throws: JournalError.self) { try journal.record(sampleState) }
        #expect(directory.read("state") == "not a directory")
        #expect(unlink(journal.directory) == 0)
        try journal.record(sampleState)
        #expect(try journal.load() == sampleState)
    }

    // MARK: Trusted no more than a caller

    /// Whether loading moved the journal aside as corrupt, with a reason containing `reason`.
    func keptAsideAsCorrupt(because reason: String) -> Bool {
        do {
            _ = try load()
        } catch {
            guard case .corrupt(_, _, let why) = error, why.contains(reason) else {
                Issue.record("expected a corrupt journal (\(reason)), got \(error)")
                return false
            }
            return !directory.visibleFiles.contains(SessionJournal.fileName)
                && directory.visibleFiles.contains { $0.hasPrefix("journal.corrupt-") }
        }
        Issue.record("the journal loaded")
        return false
    }

    @Test(.timeLimit(.minutes(1))) func aFIFOInPlaceOfTheJournalIsKeptAsideWithoutWaitingForAWriter() throws {
        #expect(mkfifo(journal.path, 0o600) == 0)
        #expect(keptAsideAsCorrupt(because: "not a regular file"))
    }

    @Test func aSymbolicLinkInPlaceOfTheJournalIsKeptAsideNotFollowed() throws {
        try journal.record(sampleState)
        #expect(rename(journal.path, directory.path + "/elsewhere.json") == 0)
        #expect(symlink(directory.path + "/elsewhere.json", journal.path) == 0)
        #expect(keptAsideAsCorrupt(because: "symbolic link"))
    }

    @Test(arguments: [
        ("\"zoomFactor\" : 2.5", "\"zoomFactor\" : -5", "zoom factor"),
        ("\"textScale\" : 1.5", "\"textScale\" : 1e308", "text scale"),
        ("\"owner\" : \":1.42\"", "\"owner\" : \"\\u001b]0;x\"", "unique bus name"),
        ("\"features\" : [", "\"features\" : [\"zoom\",", "appears twice"),
        ("\"key\" : \"mag-factor\"", "\"key\" : \"picture-uri\"", "never writes"),
    ])
    func aSessionNoCallerCouldHaveMadeIsCorrupt(_ good: String, _ bad: String, _ reason: String) throws {
        try journal.record(sampleState)
        let text = directory.read("journal.json")!
        #expect(text.contains(good))
        directory.write(text.replacing(good, with: bad), to: "journal.json")
        #expect(keptAsideAsCorrupt(because: reason))
    }

    @Test func moreRestrictionsThanTheLimitAreCorrupt() throws {
        let many = (0..<300).map { Restriction(identifier: "org.example.r\($0)", text: "R", detail: "") }
        try journal.record(JournalState(session: nil, restrictions: many))
        #expect(keptAsideAsCorrupt(because: "more than the 256 that may exist"))
    }

    @Test func aRestrictionIdentifierWithAnEscapeSequenceIsCorrupt() throws {
        try journal.record(JournalState(session: nil, restrictions: [Restriction(identifier: "ok", text: "T", detail: "")]))
        let text = directory.read("journal.json")!.replacing("\"identifier\" : \"ok\"", with: "\"identifier\" : \"\\u001b[2J\"")
        directory.write(text, to: "journal.json")
        #expect(keptAsideAsCorrupt(because: "restrictions:"))
    }

    @Test func anEndUnderWayIsRecordedAndLoadsBack() throws {
        var state = sampleState
        state.session?.isEnding = true
        try journal.record(state)
        #expect(directory.read("journal.json")?.contains("\"ending\" : true") == true)
        #expect(try journal.load() == state)
        try journal.record(sampleState)
        #expect(directory.read("journal.json")?.contains("ending") == false)
    }

}

@Suite struct RecyclingReplaceTests {
    let directory = SessionJournalTests.TemporaryDirectory()
    var path: String { directory.path + "/state" }

    func replace(_ text: String) throws {
        try DurableFile.replaceRecycling(path, with: Array(text.utf8), mode: 0o600, directory: directory.path)
    }

    func status(_ name: String) -> stat? {
        var result = stat()
        return lstat(directory.path + "/" + name, &result) == 0 ? result : nil
    }

    func sameFile(_ a: String, _ b: String) -> Bool {
        guard let x = status(a), let y = status(b) else { return false }
        return x.st_ino == y.st_ino && x.st_dev == y.st_dev
    }

    @Test func theTwoSlotsTakeTurnsAndThePathNamesTheNewest() throws {
        try replace("one")
        #expect(sameFile("state", ".state.slot-a"))
        try replace("two")
        #expect(sameFile("state", ".state.slot-b"))
        #expect(status(".state.slot-a")?.st_nlink == 1)
        try replace("three")
        #expect(sameFile("state", ".state.slot-a"))
        #expect(directory.read("state")?.hasPrefix("three ") == true)
        #expect(directory.files == [".state.slot-a", ".state.slot-b", "state"])
    }

    @Test func theContentIsPaddedWithWhitespaceToWholeBlocks() throws {
        try replace("{}")
        let text = directory.read("state")!
        #expect(text.utf8.count == 4096)
        #expect(text.hasPrefix("{} ") && text.hasSuffix(" \n"))
        #expect(text.dropFirst(2).allSatisfy { $0 == " " || $0 == "\n" })
        let long = String(repeating: "x", count: 5000)
        try replace(long)
        #expect(directory.read("state")?.utf8.count == 8192)
        try replace("short")
        try replace("short again")  // back in the slot that held 8192 bytes
        #expect(directory.read("state")?.utf8.count == 4096)
        #expect(directory.read("state")?.hasPrefix("short again ") == true)
    }

    @Test func aFileKeptAsideUnderAnotherNameIsNeverWrittenAgain() throws {
        try replace("good")
        try replace("corrupt")
        // As the journal's moveAside does: the bad file leaves under another name.
        #expect(rename(path, directory.path + "/kept") == 0)
        for text in ["after 1", "after 2", "after 3"] { try replace(text) }
        #expect(directory.read("kept")?.hasPrefix("corrupt ") == true)
        #expect(directory.read("state")?.hasPrefix("after 3 ") == true)
        #expect(!sameFile("kept", ".state.slot-a") && !sameFile("kept", ".state.slot-b"))
    }

    @Test func aFileWrittenInPlaceThroughThePathIsNotReused() throws {
        try replace("one")
        try replace("two")
        // Someone rewrites the current file through its name (same inode, linked twice).
        let fd = open(path, O_WRONLY | O_TRUNC)
        #expect(fd >= 0)
        close(fd)
        try replace("three")
        try replace("four")
        #expect(directory.read("state")?.hasPrefix("four ") == true)
        #expect(directory.files == [".state.slot-a", ".state.slot-b", "state"])
    }

    @Test func theModeIsSetWhateverTheUmask() throws {
        let old = umask(0o077)
        defer { umask(old) }
        try replace("x")
        _ = umask(0)
        try DurableFile.replaceRecycling(path, with: Array("y".utf8), mode: 0o640, directory: directory.path)
        #expect(status("state").map { $0.st_mode & 0o7777 } == 0o640)
    }

    @Test func aFailureLeavesThePathAsItWas() throws {
        try replace("kept")
        // A directory where the next slot would be: it can be neither opened nor unlinked.
        #expect(mkdir(directory.path + "/.state.slot-b", 0o700) == 0)
        #expect(mkdir(directory.path + "/.state.slot-b/x", 0o700) == 0)
        #expect(throws: FileError.self) { try replace("lost") }
        #expect(directory.read("state")?.hasPrefix("kept ") == true)
    }
}
