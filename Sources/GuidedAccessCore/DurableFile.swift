import Glibc
import Synchronization

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

/// A whole small file read at once.
public enum FileContents {
    /// The file's bytes; nil when it does not exist.
    public static func read(_ path: String) throws(FileError) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw FileError(path: path, operation: "open", errno: errno)
        }
        defer { close(fd) }
        return try readAll(fd, path: path, limit: Int.max)
    }

    /// What `readRegular` found at a path.
    public enum Regular: Equatable {
        case missing
        case bytes([UInt8])
        /// Something not to read as a file of ours, and why: a symbolic
        /// link, a FIFO, a device, a directory, too large.
        case unfit(String)
    }

    /// The bytes of a regular file of at most `limit` bytes, for a file
    /// only the service should write (its journal): never through a
    /// symbolic link, never waiting on a FIFO or device that `open` or
    /// `read` would block on.
    public static func readRegular(_ path: String, limit: Int) throws(FileError) -> Regular {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY)
        guard fd >= 0 else {
            switch errno {
            case ENOENT: return .missing
            case ELOOP: return .unfit("it is a symbolic link")
            default: throw FileError(path: path, operation: "open", errno: errno)
            }
        }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else { throw FileError(path: path, operation: "fstat", errno: errno) }
        guard status.st_mode & S_IFMT == S_IFREG else { return .unfit("it is not a regular file") }
        guard status.st_size <= limit else { return .unfit("it has \(status.st_size) bytes, more than \(limit)") }
        let bytes = try readAll(fd, path: path, limit: limit)
        return bytes.count > limit ? .unfit("it has more than \(limit) bytes") : .bytes(bytes)
    }

    /// Reads to the end, or to one byte past `limit`.
    private static func readAll(_ fd: Int32, path: String, limit: Int) throws(FileError) -> [UInt8] {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while bytes.count <= limit {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw FileError(path: path, operation: "read", errno: errno)
            }
            if n == 0 { break }
            bytes.append(contentsOf: buffer[0..<n])
        }
        return bytes
    }
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

extension DurableFile {
    /// `replace`'s guarantee — a crash leaves the old or the new content,
    /// never a mix — for a small file rewritten on every call (the session
    /// journal), at about half the cost.
    ///
    /// The temporary file is not created anew each time: two files beside
    /// `path`, `.NAME.slot-a` and `.NAME.slot-b`, take turns. The bytes go
    /// into the one that `path` does not name, in place: its blocks are
    /// allocated already, so `fdatasync` only writes the data (a new file's
    /// fsync also writes its inode and allocation). A second name for it,
    /// `.NAME.new`, is renamed over `path`, and the directory is fsynced. So
    /// it is still temporary file, sync, rename, fsync of the directory.
    ///
    /// The content is padded with spaces and a final newline to a multiple of
    /// 4096 bytes, so the file's size — which `fdatasync` would have to write
    /// too — rarely changes; the format read from `path` must allow trailing
    /// whitespace (JSON does).
    ///
    /// A slot is reused only while nothing but its own name links it: never
    /// the file `path` names, nor a copy kept aside under another name (a
    /// corrupt journal renamed away). Otherwise it is unlinked and made anew.
    /// That the slot is no longer `path`'s file must be true on disk too, not
    /// only in the kernel's view: the directory is fsynced before the first
    /// in-place write of a process (an earlier process may have been killed
    /// between its rename and its fsync of the directory) and after any
    /// failure. Where the file system cannot link (EPERM, EOPNOTSUPP), this
    /// falls back to `replace`.
    public static func replaceRecycling(
        _ path: String, with bytes: [UInt8], mode: mode_t, directory: String
    ) throws(FileError) {
        try replaceRecycling(RecycledFile(path, directory: directory), with: bytes, mode: mode)
    }

    /// A file replaced through two recycled slots: its paths, worked out once.
    public struct RecycledFile: Sendable {
        public let path: String
        public let directory: String
        let slots: [String]
        let fresh: String

        public init(_ path: String, directory: String) {
            self.path = path
            self.directory = directory
            let name = path.utf8.lastIndex(of: UInt8(ascii: "/")).map { String(path[path.utf8.index(after: $0)...]) } ?? path
            slots = ["a", "b"].map { directory + "/." + name + ".slot-" + $0 }
            fresh = directory + "/." + name + ".new"
        }
    }

    public static func replaceRecycling(_ file: RecycledFile, with bytes: [UInt8], mode: mode_t) throws(FileError) {
        let (path, directory, slots, fresh) = (file.path, file.directory, file.slots, file.fresh)
        if !syncedDirectories.withLock({ $0.contains(directory) }) {
            try syncDirectory(directory)
            syncedDirectories.withLock { _ = $0.insert(directory) }
        }
        do {
            try writeRecycled(path, bytes, mode: mode, slots: slots, fresh: fresh, directory: directory)
        } catch {
            syncedDirectories.withLock { _ = $0.remove(directory) }
            throw error
        }
    }

    /// Directories whose entries are known to be on disk as this process sees them.
    private static let syncedDirectories = Mutex<Set<String>>([])

    /// For each path, the slot this process last renamed over it: the other
    /// one is looked at first. Only an order; nothing is assumed from it.
    private static let lastSlots = Mutex<[String: Int]>([:])

    private static func writeRecycled(
        _ path: String, _ bytes: [UInt8], mode: mode_t, slots: [String], fresh: String, directory: String
    ) throws(FileError) {
        let (index, found) = try freeSlot(slots, besides: path)
        let slot = slots[index]

        // No fstat: the status `freeSlot` read is the opened file's. Were the
        // slot replaced between the lstat and the open, its check that only
        // the slot's name links the file would be void as well; the slots
        // have one writer (two would pick the same slot). Hence no O_CREAT
        // for a slot that was there: had it gone meanwhile, this fails. A
        // missing slot is created (O_EXCL: not one that appeared meanwhile),
        // so it is empty, with the umask's mode, and gets size and mode below.
        let fd = found == nil
            ? open(slot, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
            : open(slot, O_WRONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw FileError(path: slot, operation: "open", errno: errno) }
        var failure: FileError?
        let size = (bytes.count + 4095) / 4096 * 4096
        let padded = bytes.count == size ? bytes : [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
            let end = buffer.initialize(fromContentsOf: bytes)
            buffer[end..<size - 1].initialize(repeating: 0x20)
            buffer[size - 1] = 0x0A
            count = size
        }
        var offset = 0
        while offset < padded.count {
            let n = padded.withUnsafeBytes { pwrite(fd, $0.baseAddress! + offset, $0.count - offset, off_t(offset)) }
            if n < 0 {
                if errno == EINTR { continue }
                failure = FileError(path: slot, operation: "write", errno: errno)
                break
            }
            offset += n
        }
        if failure == nil, (found?.st_size ?? 0) != off_t(size), ftruncate(fd, off_t(size)) != 0 {
            failure = FileError(path: slot, operation: "ftruncate", errno: errno)
        }
        if failure == nil, found.map({ $0.st_mode & 0o7777 != mode }) ?? true, fchmod(fd, mode) != 0 {
            failure = FileError(path: slot, operation: "fchmod", errno: errno)
        }
        if failure == nil, fdatasync(fd) != 0 { failure = FileError(path: slot, operation: "fdatasync", errno: errno) }
        if close(fd) != 0, failure == nil { failure = FileError(path: slot, operation: "close", errno: errno) }
        if let failure { throw failure }

        // `.new` is there only if a crash came between link and rename: then
        // it is stale, and removed. Not unlinked beforehand on every call,
        // where it would fail with ENOENT nearly always: link fails with
        // EEXIST instead, and changes nothing.
        var linked = link(slot, fresh) == 0
        if !linked, errno == EEXIST {
            if unlink(fresh) != 0, errno != ENOENT { throw FileError(path: fresh, operation: "unlink", errno: errno) }
            linked = link(slot, fresh) == 0
        }
        guard linked else {
            let code = errno
            guard code == EPERM || code == EOPNOTSUPP else { throw FileError(path: fresh, operation: "link", errno: code) }
            // No hard links here: a new temporary file each time.
            try replace(path, with: padded, mode: mode, temporary: fresh, directory: directory)
            return
        }
        guard rename(fresh, path) == 0 else {
            let code = errno
            unlink(fresh)
            throw FileError(path: path, operation: "rename", errno: code)
        }
        lastSlots.withLock { $0[path] = index }
        try syncDirectory(directory)
    }

    /// The slot to write, with its status; nil for a missing one, to be
    /// created. One that only its own name links (so not `path`'s file
    /// either, which would be a second link), or a missing one; else one that
    /// is not `path`'s file, unlinked (its copies keep it) to be made anew.
    /// The slot not renamed over `path` last is looked at first, so `path`
    /// needs no look in the steady state.
    private static func freeSlot(_ slots: [String], besides path: String) throws(FileError) -> (Int, stat?) {
        let first = lastSlots.withLock { $0[path] }.map { ($0 + 1) % slots.count } ?? 0
        var statuses: [stat?] = Array(repeating: nil, count: slots.count)
        for step in slots.indices {
            let index = (first + step) % slots.count
            var status = stat()
            guard lstat(slots[index], &status) == 0 else {
                if errno == ENOENT { return (index, nil) }
                throw FileError(path: slots[index], operation: "lstat", errno: errno)
            }
            if status.st_mode & S_IFMT == S_IFREG, status.st_nlink == 1 { return (index, status) }
            statuses[index] = status
        }
        var current = stat()
        let pathExists = lstat(path, &current) == 0
        var replaceable: Int?
        for (index, status) in statuses.enumerated() {
            guard let status else { continue }
            let isPath = pathExists && status.st_dev == current.st_dev && status.st_ino == current.st_ino
            if !isPath, replaceable == nil { replaceable = index }
        }
        let index = replaceable ?? slots.count - 1
        guard unlink(slots[index]) == 0 || errno == ENOENT else {
            throw FileError(path: slots[index], operation: "unlink", errno: errno)
        }
        return (index, nil)
    }
}
