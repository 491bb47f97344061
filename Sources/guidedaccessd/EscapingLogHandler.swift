import GuidedAccessService
import Logging

/// The daemon's log, as a reader may trust it: one event is one line of a
/// few KiB at most, whatever text from outside it quotes. Every event passes
/// to the sink (journald's stream, or stderr) with its message, metadata and
/// error escaped and bounded by `LogText`: a control character in a caller's
/// executable path cannot end the line — on journald's stream, a new entry
/// with a priority the caller chose — and no call can write megabytes.
struct EscapingLogHandler: LogHandler {
    private var sink: any LogHandler

    init(_ sink: any LogHandler) {
        self.sink = sink
    }

    var logLevel: Logger.Level {
        get { sink.logLevel }
        set { sink.logLevel = newValue }
    }

    var metadata: Logger.Metadata {
        get { sink.metadata }
        set { sink.metadata = newValue.mapValues(Self.escaped) }
    }

    var metadataProvider: Logger.MetadataProvider? {
        get { sink.metadataProvider }
        set { sink.metadataProvider = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { sink[metadataKey: key] }
        set { sink[metadataKey: key] = newValue.map(Self.escaped) }
    }

    func log(event: LogEvent) {
        var event = event
        event.message = "\(LogText.escaped(event.message.description))"
        event.metadata = event.metadata?.mapValues(Self.escaped)
        event.error = event.error.map { EscapedError(description: LogText.escaped("\($0)")) }
        sink.log(event: event)
    }

    private static func escaped(_ value: Logger.Metadata.Value) -> Logger.Metadata.Value {
        switch value {
        case .string(let text): return .string(LogText.escaped(text))
        case .stringConvertible(let item): return .string(LogText.escaped(item.description))
        case .dictionary(let entries): return .dictionary(entries.mapValues(escaped))
        case .array(let items): return .array(items.map(escaped))
        }
    }

    /// An error as the sink shows it: its description, escaped.
    private struct EscapedError: Error, CustomStringConvertible {
        let description: String
    }
}
