import CDBus
import CLinux
import Glibc
import Synchronization

/// A libdbus pointer that crosses threads inside this file's bookkeeping.
struct UnsafeHandle: @unchecked Sendable, Hashable {
    let pointer: OpaquePointer
}

/// Connects one libdbus connection to an `EventLoop` through libdbus's
/// watch, timeout, dispatch-status and wake-up functions — the integration
/// its documentation prescribes. We never touch the connection's socket.
///
/// libdbus calls the add/remove/toggle functions with the connection's lock
/// held, possibly from any thread (a toggle can come from a message unref):
/// they only update this table and epoll, and never call into the connection.
final class MainLoopIntegration: @unchecked Sendable {
    private struct WatchedFD {
        var token: EventLoop.SourceToken
        var watches: [UnsafeHandle]
        var interest: UInt32
    }

    private struct Timer {
        var fd: Int32
        var token: EventLoop.SourceToken
    }

    private struct Table {
        var fds: [Int32: WatchedFD] = [:]
        var timers: [UnsafeHandle: Timer] = [:]
        var dispatchScheduled = false
    }

    let loop: EventLoop
    let connection: UnsafeHandle
    private let table = Mutex(Table())
    /// Messages dispatched in one turn before the loop looks at other work.
    private let dispatchBatch = 64

    init(loop: EventLoop, connection: OpaquePointer) {
        self.loop = loop
        // A reference of our own: a dispatch already scheduled on the loop
        // must find the connection alive even after its owner let it go.
        self.connection = UnsafeHandle(pointer: dbus_connection_ref(connection))
    }

    deinit {
        dbus_connection_unref(connection.pointer)
    }

    /// Installs the functions; libdbus then adds its current watches and
    /// timeouts through them.
    func install() {
        let raw = connection.pointer
        let watchData = Unmanaged.passRetained(self).toOpaque()
        dbus_connection_set_watch_functions(
            raw,
            { watch, data in
                Unmanaged<MainLoopIntegration>.fromOpaque(data!).takeUnretainedValue().add(watch: watch!) ? 1 : 0
            },
            { watch, data in
                Unmanaged<MainLoopIntegration>.fromOpaque(data!).takeUnretainedValue().remove(watch: watch!)
            },
            { watch, data in
                Unmanaged<MainLoopIntegration>.fromOpaque(data!).takeUnretainedValue().toggled(watch: watch!)
            },
            watchData,
            { data in Unmanaged<MainLoopIntegration>.fromOpaque(data!).release() })

        let timeoutData = Unmanaged.passRetained(self).toOpaque()
        dbus_connection_set_timeout_functions(
            raw,
            { timeout, data in
                Unmanaged<MainLoopIntegration>.fromOpaque(data!).takeUnretainedValue().add(timeout: timeout!)
                    ? 1 : 0
            },
            { timeout, data in
                Unmanaged<MainLoopIntegration>.fromOpaque(data!).takeUnretainedValue().remove(timeout: timeout!)
            },
            { timeout, data in
                Unmanaged<MainLoopIntegration>.fromOpaque(data!).takeUnretainedValue().toggled(timeout: timeout!)
            },
            timeoutData,
            { data in Unmanaged<MainLoopIntegration>.fromOpaque(data!).release() })

        let statusData = Unmanaged.passRetained(self).toOpaque()
        dbus_connection_set_dispatch_status_function(
            raw,
            { _, status, data in
                // Never dispatch from here: libdbus may hold locks. Schedule it.
                if status == DBUS_DISPATCH_DATA_REMAINS {
                    Unmanaged<MainLoopIntegration>.fromOpaque(data!).takeUnretainedValue().scheduleDispatch()
                }
            },
            statusData,
            { data in Unmanaged<MainLoopIntegration>.fromOpaque(data!).release() })

        let wakeData = Unmanaged.passRetained(self).toOpaque()
        dbus_connection_set_wakeup_main_function(
            raw,
            { data in Unmanaged<MainLoopIntegration>.fromOpaque(data!).takeUnretainedValue().loop.wake() },
            wakeData,
            { data in Unmanaged<MainLoopIntegration>.fromOpaque(data!).release() })

        if dbus_connection_get_dispatch_status(raw) == DBUS_DISPATCH_DATA_REMAINS {
            scheduleDispatch()
        }
    }

    /// Removes the functions (and with them every watch and timeout). Only
    /// on the loop's thread, outside a dispatch: libdbus calls the
    /// dispatch-status function with the data it read under its lock after
    /// releasing it, and frees the data replaced here at once.
    func uninstall() {
        let raw = connection.pointer
        dbus_connection_set_watch_functions(raw, nil, nil, nil, nil, nil)
        dbus_connection_set_timeout_functions(raw, nil, nil, nil, nil, nil)
        dbus_connection_set_dispatch_status_function(raw, nil, nil, nil)
        dbus_connection_set_wakeup_main_function(raw, nil, nil, nil)
    }

    // MARK: Dispatch

    private func scheduleDispatch() {
        let first = table.withLock { t in
            defer { t.dispatchScheduled = true }
            return !t.dispatchScheduled
        }
        if first {
            loop.execute { [self] in dispatchPending() }
        }
    }

    /// Runs on the loop thread: hands queued messages to the filters and
    /// pending-call handlers, a batch at a time so other work interleaves.
    private func dispatchPending() {
        table.withLock { $0.dispatchScheduled = false }
        let raw = connection.pointer
        for _ in 0..<dispatchBatch {
            if dbus_connection_dispatch(raw) != DBUS_DISPATCH_DATA_REMAINS { return }
        }
        scheduleDispatch()
    }

    // MARK: Watches

    private static func epollEvents(of watch: OpaquePointer) -> UInt32 {
        guard dbus_watch_get_enabled(watch) != 0 else { return 0 }
        let flags = dbus_watch_get_flags(watch)
        var events: UInt32 = 0
        if flags & DBUS_WATCH_READABLE.rawValue != 0 { events |= EPOLLIN.rawValue }
        if flags & DBUS_WATCH_WRITABLE.rawValue != 0 { events |= EPOLLOUT.rawValue }
        return events
    }

    private func add(watch: OpaquePointer) -> Bool {
        let fd = dbus_watch_get_unix_fd(watch)
        guard fd >= 0 else { return false }
        table.withLock { t in
            var entry = t.fds[fd] ?? WatchedFD(token: EventLoop.SourceToken(value: 0), watches: [], interest: 0)
            entry.watches.append(UnsafeHandle(pointer: watch))
            t.fds[fd] = entry
            updateInterest(fd: fd, in: &t)
        }
        return true
    }

    private func remove(watch: OpaquePointer) {
        let fd = dbus_watch_get_unix_fd(watch)
        table.withLock { t in
            guard var entry = t.fds[fd] else { return }
            entry.watches.removeAll { $0.pointer == watch }
            t.fds[fd] = entry
            updateInterest(fd: fd, in: &t)
            if entry.watches.isEmpty { t.fds[fd] = nil }
        }
    }

    private func toggled(watch: OpaquePointer) {
        let fd = dbus_watch_get_unix_fd(watch)
        table.withLock { t in updateInterest(fd: fd, in: &t) }
    }

    /// Keeps epoll's registration equal to the union of the enabled watches.
    /// A descriptor with no enabled watch is taken out of epoll altogether,
    /// since epoll reports hang-ups even for an empty event mask.
    private func updateInterest(fd: Int32, in t: inout Table) {
        guard var entry = t.fds[fd] else { return }
        let interest = entry.watches.reduce(UInt32(0)) { $0 | Self.epollEvents(of: $1.pointer) }
        let registered = entry.token.value != 0
        if interest == 0 {
            if registered {
                loop.removeSource(entry.token, fd: fd)
                entry.token = EventLoop.SourceToken(value: 0)
            }
        } else if !registered {
            entry.token = loop.addSource(fd: fd, events: interest) { [self] events in
                handle(fd: fd, events: events)
            }
        } else if interest != entry.interest {
            loop.updateSource(entry.token, fd: fd, events: interest)
        }
        entry.interest = interest
        t.fds[fd] = entry
    }

    /// Runs on the loop thread when `fd` is ready.
    private func handle(fd: Int32, events: UInt32) {
        let watches = table.withLock { $0.fds[fd]?.watches ?? [] }
        for watch in watches {
            // An earlier dbus_watch_handle may have removed this watch.
            let stillThere = table.withLock { $0.fds[fd]?.watches.contains(watch) ?? false }
            guard stillThere, dbus_watch_get_enabled(watch.pointer) != 0 else { continue }
            let wanted = dbus_watch_get_flags(watch.pointer)
            var flags: UInt32 = 0
            if events & EPOLLIN.rawValue != 0, wanted & DBUS_WATCH_READABLE.rawValue != 0 {
                flags |= DBUS_WATCH_READABLE.rawValue
            }
            if events & EPOLLOUT.rawValue != 0, wanted & DBUS_WATCH_WRITABLE.rawValue != 0 {
                flags |= DBUS_WATCH_WRITABLE.rawValue
            }
            if events & EPOLLHUP.rawValue != 0 { flags |= DBUS_WATCH_HANGUP.rawValue }
            if events & EPOLLERR.rawValue != 0 { flags |= DBUS_WATCH_ERROR.rawValue }
            guard flags != 0 else { continue }
            _ = dbus_watch_handle(watch.pointer, flags)
            // libdbus reads at most 2 KiB per call: read on while the socket
            // has more (up to `readsPerWakeUp`), so that the messages behind
            // a flood of one sender's calls are read — and routed — now, not
            // after the work the flood's first messages made.
            guard flags == DBUS_WATCH_READABLE.rawValue else { continue }
            for _ in 1..<Self.readsPerWakeUp {
                var available: Int32 = 0
                guard ioctl(fd, UInt(FIONREAD), &available) == 0, available > 0,
                    table.withLock({ $0.fds[fd]?.watches.contains(watch) ?? false }),
                    dbus_watch_get_enabled(watch.pointer) != 0
                else { break }
                _ = dbus_watch_handle(watch.pointer, flags)
            }
        }
    }

    /// `dbus_watch_handle` calls per readable wake-up: 32 of 2 KiB.
    static let readsPerWakeUp = 32

    // MARK: Timeouts

    /// Each libdbus timeout is a timerfd: epoll wakes the loop when it
    /// expires, and there is no deadline bookkeeping to get wrong.
    private func add(timeout: OpaquePointer) -> Bool {
        let fd = timerfd_create(CLOCK_MONOTONIC, Int32(TFD_NONBLOCK | TFD_CLOEXEC))
        guard fd >= 0 else { return false }
        let handle = UnsafeHandle(pointer: timeout)
        let token = loop.addSource(fd: fd, events: EPOLLIN.rawValue) { [self] _ in
            fire(timeout: handle, fd: fd)
        }
        table.withLock { $0.timers[handle] = Timer(fd: fd, token: token) }
        arm(timeout: timeout, fd: fd)
        return true
    }

    private func remove(timeout: OpaquePointer) {
        guard let timer = table.withLock({ $0.timers.removeValue(forKey: UnsafeHandle(pointer: timeout)) }) else {
            return
        }
        loop.removeSource(timer.token, fd: timer.fd)
        close(timer.fd)
    }

    private func toggled(timeout: OpaquePointer) {
        guard let timer = table.withLock({ $0.timers[UnsafeHandle(pointer: timeout)] }) else { return }
        arm(timeout: timeout, fd: timer.fd)
    }

    /// Arms the timer with the timeout's current interval, repeating, or
    /// disarms it when the timeout is disabled.
    private func arm(timeout: OpaquePointer, fd: Int32) {
        var spec = itimerspec()
        if dbus_timeout_get_enabled(timeout) != 0 {
            let ms = Int(max(dbus_timeout_get_interval(timeout), 1))
            spec.it_value.tv_sec = ms / 1000
            spec.it_value.tv_nsec = (ms % 1000) * 1_000_000
            spec.it_interval = spec.it_value
        }
        _ = timerfd_settime(fd, 0, &spec, nil)
    }

    private func fire(timeout: UnsafeHandle, fd: Int32) {
        var expirations: UInt64 = 0
        guard read(fd, &expirations, 8) == 8 else { return }
        guard table.withLock({ $0.timers[timeout] != nil }),
            dbus_timeout_get_enabled(timeout.pointer) != 0
        else { return }
        _ = dbus_timeout_handle(timeout.pointer)
    }
}
