#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
@testable import GuidedAccessCore

/// Program files in a temporary directory: identities compare executables
/// as files, so the files must exist.
final class TestPrograms {
    let directory = SessionJournalTests.TemporaryDirectory()

    func path(_ name: String) -> String { directory.path + "/" + name }

    /// The program `name` (made on first use), as a process running it shows it.
    func executable(_ name: String) -> Executable {
        let path = path(name)
        if FileIdentity(atPath: path) == nil { _ = FileManager.default.createFile(atPath: path, contents: Data()) }
        return Executable(path: path, file: FileIdentity(atPath: path)!)
    }
}
