/// A program the service started in the kiosk's session, as the journal
/// keeps it so that a restarted service finds it again.
public enum ProgramRecord: Hashable, Sendable, CustomStringConvertible {
    /// A child process: its pid, and what makes the pid that process and no
    /// later one — its start time (clock ticks after boot, `/proc/PID/stat`
    /// field 22) on this boot.
    case process(pid: Int32, startTime: UInt64, bootID: String)
    /// A transient unit of the user's systemd manager, by name.
    case unit(String)

    public var description: String {
        switch self {
        case .process(let pid, _, _): return "pid \(pid)"
        case .unit(let name): return "unit \(name)"
        }
    }
}

/// When a supervised program that exits is started again: at once and then
/// with a doubling delay, until more than `burst` exits fall within
/// `interval` — then it gives up (like systemd's StartLimitBurst).
public struct RestartPolicy: Hashable, Sendable {
    public enum Decision: Hashable, Sendable {
        case restart(afterMilliseconds: Int)
        /// `exits`: how many fell within the interval.
        case giveUp(exits: Int)
    }

    public let burst: Int
    public let intervalMilliseconds: Int
    public let firstDelayMilliseconds: Int
    /// Times of the recent exits, milliseconds on a monotonic clock.
    private var exits: [Int] = []

    public init(burst: Int = 5, intervalMilliseconds: Int = 60_000, firstDelayMilliseconds: Int = 100) {
        self.burst = burst
        self.intervalMilliseconds = intervalMilliseconds
        self.firstDelayMilliseconds = firstDelayMilliseconds
    }

    /// Records an exit at `now` and says what to do.
    public mutating func exited(atMilliseconds now: Int) -> Decision {
        exits.removeAll { now - $0 >= intervalMilliseconds }
        exits.append(now)
        guard exits.count <= burst else { return .giveUp(exits: exits.count) }
        return .restart(afterMilliseconds: firstDelayMilliseconds << (exits.count - 1))
    }

    /// Forgets the exits (the program was stopped on purpose).
    public mutating func reset() {
        exits = []
    }
}
