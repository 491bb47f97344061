import Foundation
import KeyFile
import Testing

/// A temporary directory for one test, removed when it ends.
final class TemporaryDirectory {
    let path: String

    init() throws {
        path = FileManager.default.temporaryDirectory
            .appendingPathComponent("keyfile-tests-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    @discardableResult
    func write(_ name: String, _ text: String) throws -> String {
        let file = path + "/" + name
        try FileManager.default.createDirectory(
            atPath: (file as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        return file
    }
}

/// The entries of the files `KeyFile.loadLayeredFiles` loads, in the order they apply.
func layeredEntries(_ mainFile: String, optional: Bool = false) throws(KeyFileError) -> [KeyFileEntry] {
    try KeyFile.loadLayeredFiles(mainFile: mainFile, optional: optional).flatMap(\.entries)
}

@Suite struct KeyFileTests {
    @Test func validFileGivesGroupsKeysAndRawValues() throws {
        let dir = try TemporaryDirectory()
        let file = try dir.write(
            "guidedaccess.conf",
            """
            # comment
            [Session]
            Features=zoom;screen-reader
            ZoomFactor = 2.5
            Enabled=true
            Timeout=300
            Title='a b'

            [Restrictions]
            Lock=false
            """)
        let keyFile = try KeyFile.load(path: file)
        #expect(keyFile.groups == ["Session", "Restrictions"])
        #expect(keyFile.keys(in: "Session") == ["Features", "ZoomFactor", "Enabled", "Timeout", "Title"])
        #expect(keyFile.keys(in: "Nope") == [])
        #expect(keyFile.string(group: "Session", key: "ZoomFactor") == "2.5")
        #expect(keyFile.string(group: "Session", key: "Title") == "'a b'")
        #expect(keyFile.string(group: "Session", key: "Missing") == nil)
        #expect(
            keyFile.entries.map { "\($0.group)/\($0.key)=\($0.rawValue)" } == [
                "Session/Features=zoom;screen-reader", "Session/ZoomFactor=2.5", "Session/Enabled=true",
                "Session/Timeout=300", "Session/Title='a b'", "Restrictions/Lock=false",
            ])
    }

    @Test func syntaxErrorNamesFileAndLine() throws {
        let dir = try TemporaryDirectory()
        let file = try dir.write("bad.conf", "[Session]\nZoomFactor=2\n\nthis is not a key\nEnabled=true\n")
        let error = #expect(throws: KeyFileError.self) { try KeyFile.load(path: file) }
        #expect(error?.kind == .syntax)
        #expect(error?.line == 4)
        #expect(error?.message.hasPrefix("\(file):4: ") == true)
        #expect(error?.message.contains("this is not a key") == true)
    }

    @Test func keyBeforeAnyGroupIsASyntaxErrorOnItsLine() throws {
        let dir = try TemporaryDirectory()
        let file = try dir.write("bad.conf", "# header\nZoomFactor=2\n")
        let error = #expect(throws: KeyFileError.self) { try KeyFile.load(path: file) }
        #expect(error?.kind == .syntax)
        #expect(error?.line == 2)
    }

    @Test func missingFileIsAnErrorNamingIt() throws {
        let dir = try TemporaryDirectory()
        let file = dir.path + "/absent.conf"
        let error = #expect(throws: KeyFileError.self) { try KeyFile.load(path: file) }
        #expect(error?.kind == .missing)
        #expect(error?.file == file)
        #expect(error?.message.hasPrefix(file + ": ") == true)
    }

    @Test func dropInsFollowTheMainFileInNameOrder() throws {
        let dir = try TemporaryDirectory()
        let main = try dir.write("ga.conf", "[Session]\nZoomFactor=2.0\nEnabled=true\n")
        let late = try dir.write("ga.conf.d/20-late.conf", "[Session]\nZoomFactor=4.0\n")
        let early = try dir.write("ga.conf.d/10-early.conf", "[Session]\nZoomFactor=3.0\n[Other]\nX=1\n")
        try dir.write("ga.conf.d/30-ignored.txt", "[Session]\nZoomFactor=9.0\n")
        try dir.write("ga.conf.d/.hidden.conf", "[Session]\nZoomFactor=9.0\n")
        try FileManager.default.createDirectory(
            atPath: dir.path + "/ga.conf.d/40-dir.conf", withIntermediateDirectories: true)

        let entries = try layeredEntries(main)
        #expect(
            entries == [
                KeyFileEntry(file: main, group: "Session", key: "ZoomFactor", rawValue: "2.0"),
                KeyFileEntry(file: main, group: "Session", key: "Enabled", rawValue: "true"),
                KeyFileEntry(file: early, group: "Session", key: "ZoomFactor", rawValue: "3.0"),
                KeyFileEntry(file: early, group: "Other", key: "X", rawValue: "1"),
                KeyFileEntry(file: late, group: "Session", key: "ZoomFactor", rawValue: "4.0"),
            ])
        // Applied in order, the last drop-in wins.
        let last = entries.last { $0.group == "Session" && $0.key == "ZoomFactor" }
        #expect(last?.rawValue == "4.0")
    }

    @Test func missingMainFileIsAnErrorUnlessOptional() throws {
        let dir = try TemporaryDirectory()
        let main = dir.path + "/ga.conf"
        let error = #expect(throws: KeyFileError.self) { try layeredEntries(main) }
        #expect(error?.kind == .missing)
        #expect(error?.file == main)
        #expect(try layeredEntries(main, optional: true) == [])

        let dropIn = try dir.write("ga.conf.d/10-a.conf", "[Session]\nEnabled=false\n")
        #expect(
            try layeredEntries(main, optional: true) == [
                KeyFileEntry(file: dropIn, group: "Session", key: "Enabled", rawValue: "false")
            ])
    }

    @Test func brokenDropInIsNamedInTheError() throws {
        let dir = try TemporaryDirectory()
        let main = try dir.write("ga.conf", "[Session]\nEnabled=true\n")
        let broken = try dir.write("ga.conf.d/10-broken.conf", "[Session\nEnabled=true\n")
        let error = #expect(throws: KeyFileError.self) { try layeredEntries(main) }
        #expect(error?.kind == .syntax)
        #expect(error?.file == broken)
        #expect(error?.line == 1)
    }
}
