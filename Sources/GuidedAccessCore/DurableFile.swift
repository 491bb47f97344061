import Glibc

/// A system call on a file that failed.
public struct FileError: Error, Hashable, Sendable, CustomStringConvertible {
    public let path: String
    public let operation: String
    public let errno: Int32

    public init(path: String, operation: String, errno: Int32) {
        self.path = path
        self.operation = operation
        self.errno = errno
    }

    public var description: String { "\(operation) \(path): \(String(cString: strerror(errno)))" }
}

/// Replacing a file so that a crash leaves either the old or the new
/// content, never a mix: the bytes go to `temporary` (same directory), are
/// fsynced, renamed over `path`, and the directory is fsynced. Used by the
/// session journal and by the dconf backend's keyfiles.
public enum DurableFile {
    /// Returns when the new content is durable. `mode` is set explicitly, so
    /// the umask cannot change it. On a failure `temporary` is removed and
    /// `path` is as it was.
    public static func replace(
        _ path: String, with bytes: [UInt8], mode: mode_t, temporary: String, directory: String
    ) throws(FileError) {
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw FileError(path: temporary, operation: "open", errno: errno) }
        var failure: FileError?
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 {
                if errno == EINTR { continue }
                failure = FileError(path: temporary, operation: "write", errno: errno)
                break
            }
            offset += n
        }
        if failure == nil, fchmod(fd, mode) != 0 { failure = FileError(path: temporary, operation: "fchmod", errno: errno) }
        if failure == nil, fsync(fd) != 0 { failure = FileError(path: temporary, operation: "fsync", errno: errno) }
        if close(fd) != 0, failure == nil { failure = FileError(path: temporary, operation: "close", errno: errno) }
        if let failure {
            unlink(temporary)
            throw failure
        }
        guard rename(temporary, path) == 0 else {
            let code = errno
            unlink(temporary)
            throw FileError(path: path, operation: "rename", errno: code)
        }
        try syncDirectory(directory)
    }

    /// fsync of a directory, so a rename or unlink in it is durable.
    public static func syncDirectory(_ directory: String) throws(FileError) {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw FileError(path: directory, operation: "open", errno: errno) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw FileError(path: directory, operation: "fsync", errno: errno) }
    }
}
