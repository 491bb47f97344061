import CGio

/// An error reading a key file. `message` names the file, and for a syntax
/// error the line, followed by GLib's own words.
public struct KeyFileError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Kind: Hashable, Sendable {
        /// The file (or drop-in directory) does not exist.
        case missing
        /// It exists but cannot be read (permissions, not a regular file, …).
        case unreadable
        /// GLib's key-file parser rejected it.
        case syntax
    }

    public let kind: Kind
    public let file: String
    /// The 1-based line GLib's parser stopped at, for `.syntax`.
    public let line: Int?
    public let message: String

    public init(_ kind: Kind, file: String, line: Int? = nil, message: String) {
        self.kind = kind
        self.file = file
        self.line = line
        self.message = message
    }

    public var description: String { message }
}

/// One `key=value` of a file, as written (unparsed), with the file it came from.
public struct KeyFileEntry: Hashable, Sendable {
    public let file: String
    public let group: String
    public let key: String
    public let rawValue: String

    public init(file: String, group: String, key: String, rawValue: String) {
        self.file = file
        self.group = group
        self.key = key
        self.rawValue = rawValue
    }
}

/// A parsed key file (GLib's `GKeyFile`: `[group]` headers, `key=value`
/// lines, `#` comments). Read-only once loaded.
public final class KeyFile {
    /// The path it was loaded from, for error messages.
    public let path: String
    private let handle: OpaquePointer

    private init(path: String, handle: OpaquePointer) {
        self.path = path
        self.handle = handle
    }

    deinit {
        g_key_file_free(handle)
    }

    /// Loads and parses `path`. A syntax error names the file and the line.
    public static func load(path: String) throws(KeyFileError) -> KeyFile {
        let handle = g_key_file_new()!
        var error: UnsafeMutablePointer<GError>? = nil
        guard g_key_file_load_from_file(handle, path, G_KEY_FILE_NONE, &error) != 0 else {
            g_key_file_free(handle)
            let failure = GLibError(error)
            if failure.domain == g_file_error_quark() {
                let kind: KeyFileError.Kind =
                    failure.code == Int32(G_FILE_ERROR_NOENT.rawValue) ? .missing : .unreadable
                throw KeyFileError(kind, file: path, message: "\(path): \(failure.message)")
            }
            let line = failingLine(of: path)
            throw KeyFileError(
                .syntax, file: path, line: line,
                message: "\(path)\(line.map { ":\($0)" } ?? ""): \(failure.message)")
        }
        return KeyFile(path: path, handle: handle)
    }

    /// The groups in file order.
    public var groups: [String] {
        var length: gsize = 0
        return strings(g_key_file_get_groups(handle, &length))
    }

    /// The keys of a group in file order; empty when there is no such group.
    public func keys(in group: String) -> [String] {
        var length: gsize = 0
        var error: UnsafeMutablePointer<GError>? = nil
        let keys = g_key_file_get_keys(handle, group, &length, &error)
        if error != nil { _ = GLibError(error) }
        return strings(keys)
    }

    /// The value as written (escapes and all), or nil when the key is absent.
    public func string(group: String, key: String) -> String? {
        var error: UnsafeMutablePointer<GError>? = nil
        guard let value = g_key_file_get_value(handle, group, key, &error) else {
            _ = GLibError(error)
            return nil
        }
        defer { g_free(value) }
        return String(cString: value)
    }

    /// Every key of every group, in file order.
    public var entries: [KeyFileEntry] {
        groups.flatMap { group in
            keys(in: group).compactMap { key in
                string(group: group, key: key).map {
                    KeyFileEntry(file: path, group: group, key: key, rawValue: $0)
                }
            }
        }
    }

    /// `mainFile` followed by the `*.conf` drop-ins in `mainFile.d/`, in name
    /// order, loaded: applying their groups and entries in order lets later
    /// files override earlier ones. A missing main file is an error unless
    /// `optional`; a missing drop-in directory is not. Hidden files and
    /// entries that are not regular files are skipped.
    public static func loadLayeredFiles(mainFile: String, optional: Bool = false) throws(KeyFileError) -> [KeyFile] {
        var files: [KeyFile] = []
        do {
            files.append(try load(path: mainFile))
        } catch where error.kind == .missing && optional {}
        for path in try dropIns(of: mainFile) {
            files.append(try load(path: path))
        }
        return files
    }

    // MARK: Internals

    /// The `*.conf` files of `FILE.d/`, sorted by name (bytewise).
    private static func dropIns(of mainFile: String) throws(KeyFileError) -> [String] {
        let directory = mainFile + ".d"
        var error: UnsafeMutablePointer<GError>? = nil
        guard let dir = g_dir_open(directory, 0, &error) else {
            let failure = GLibError(error)
            if failure.domain == g_file_error_quark() && failure.code == Int32(G_FILE_ERROR_NOENT.rawValue) {
                return []
            }
            throw KeyFileError(.unreadable, file: directory, message: "\(directory): \(failure.message)")
        }
        defer { g_dir_close(dir) }
        var names: [String] = []
        while let name = g_dir_read_name(dir) {
            let name = String(cString: name)
            guard name.hasSuffix(".conf"), !name.hasPrefix("."),
                g_file_test(directory + "/" + name, G_FILE_TEST_IS_REGULAR) != 0
            else { continue }
            names.append(name)
        }
        return names.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }.map { directory + "/" + $0 }
    }

    /// GLib's parser reports no line numbers; it parses line by line, so the
    /// failing line is the shortest prefix of the file it rejects.
    private static func failingLine(of path: String) -> Int? {
        var contents: UnsafeMutablePointer<gchar>? = nil
        var length: gsize = 0
        guard g_file_get_contents(path, &contents, &length, nil) != 0, let contents else { return nil }
        defer { g_free(contents) }
        let bytes = UnsafeBufferPointer(start: contents, count: Int(length))
        var ends: [Int] = []  // the byte count up to and including each line
        for (i, byte) in bytes.enumerated() where byte == 0x0A { ends.append(i + 1) }
        if ends.last != bytes.count { ends.append(bytes.count) }

        func rejects(_ lines: Int) -> Bool {
            let probe = g_key_file_new()!
            defer { g_key_file_free(probe) }
            var error: UnsafeMutablePointer<GError>? = nil
            let ok = g_key_file_load_from_data(probe, contents, gsize(ends[lines - 1]), G_KEY_FILE_NONE, &error)
            if error != nil { _ = GLibError(error) }
            return ok == 0
        }
        guard !ends.isEmpty, rejects(ends.count) else { return nil }
        var low = 1, high = ends.count
        while low < high {
            let mid = (low + high) / 2
            if rejects(mid) { high = mid } else { low = mid + 1 }
        }
        return low
    }
}

/// A GError taken apart and freed.
private struct GLibError {
    let domain: GQuark
    let code: Int32
    let message: String

    init(_ error: UnsafeMutablePointer<GError>?) {
        guard let error else {
            (domain, code, message) = (0, 0, "unknown error")
            return
        }
        domain = error.pointee.domain
        code = error.pointee.code
        message = error.pointee.message.map { String(cString: $0) } ?? "unknown error"
        g_error_free(error)
    }
}

/// The strings of a NULL-terminated `gchar **`, which this frees.
private func strings(_ vector: UnsafeMutablePointer<UnsafeMutablePointer<gchar>?>?) -> [String] {
    guard let vector else { return [] }
    defer { g_strfreev(vector) }
    var result: [String] = []
    var i = 0
    while let item = vector[i] {
        result.append(String(cString: item))
        i += 1
    }
    return result
}
