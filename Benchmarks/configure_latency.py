#!/usr/bin/python3
"""Latency benchmarks of guidedaccessd, run by scripts/bench-service.

  configure_latency.py configure --address ADDR [--count N] [--feature F]
      One connection: StartSession, then N ConfigureForSession([F], on/off)
      calls alternating on and off, each timed with time.perf_counter (with
      --interval MS, MS apart: isolated calls, not back to back), then
      EndSession. Also times N Properties.Get(Version) calls on the same
      connection as the floor (client + bus + dispatch, no work).
      Prints one line: `configure p50=… p90=… max=… get_p50=… (ms)`.

  configure_latency.py dconf-change --address ADDR [--count N] [--feature F] [--interval MS]
      The floor of ConfigureForSession's settings write: the same client
      calling dconf-service's ca.desrt.dconf.Writer.Change directly with the
      change set the service sends for F (its keys set, then reset), N times
      alternating, each timed as `configure` times its calls.
      Prints `dconf-change n=… p50=… p90=… max=… (ms)`.

  configure_latency.py first-reply --address ADDR --runs R -- COMMAND...
      R times: start COMMAND (the daemon), and poll NameHasOwner then
      Properties.Get(Version) every 1 ms until a reply arrives; the time is
      from just before Popen to that reply. Stops the daemon (SIGTERM) and
      waits for its exit before the next run. Prints `first-reply ms=a,b,…`.

  configure_latency.py fsync --dir DIR [--count N] [--pattern classic|recycled] [--interval MS]
      The journal's write pattern without the service (see fsync_pattern), N
      times, back to back or MS apart. Prints `fsync n=… p50=… p90=… max=… (ms)`:
      the floor of a journaled call.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import dbus

NAME = "org.guidedaccess.GuidedAccess1"
PATH = "/org/guidedaccess/GuidedAccess1"
IFACE = "org.guidedaccess.GuidedAccess1"
PROPS = "org.freedesktop.DBus.Properties"


def percentile(values, p):
    ordered = sorted(values)
    # nearest-rank
    index = max(0, min(len(ordered) - 1, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[index]


def pause(seconds, spin):
    if not spin:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def call(bus, method, signature, args, iface=IFACE):
    return bus.call_blocking(NAME, PATH, iface, method, signature, args, timeout=25.0)


def configure(options):
    bus = dbus.bus.BusConnection(options.address)
    call(bus, "StartSession", "a{sv}", [dbus.Dictionary({}, signature="sv")])
    try:
        # Warm-up (not counted): first GSettings objects, first journal write.
        for i in range(options.warmup):
            call(bus, "ConfigureForSession", "asb", [[options.feature], i % 2 == 0])
        if options.warmup % 2 == 1:
            call(bus, "ConfigureForSession", "asb", [[options.feature], False])
        times = []
        for i in range(options.count):
            if options.interval:
                pause(options.interval / 1000.0, options.spin)
            start = time.perf_counter()
            call(bus, "ConfigureForSession", "asb", [[options.feature], i % 2 == 0])
            times.append((time.perf_counter() - start) * 1000.0)
        gets = []
        for _ in range(options.count):
            start = time.perf_counter()
            call(bus, "Get", "ss", [IFACE, "Version"], iface=PROPS)
            gets.append((time.perf_counter() - start) * 1000.0)
    finally:
        call(bus, "EndSession", "", [])
    print(
        "configure n=%d p50=%.3f p90=%.3f max=%.3f mean=%.3f get_p50=%.3f (ms)"
        % (
            len(times),
            percentile(times, 50),
            percentile(times, 90),
            max(times),
            statistics.fmean(times),
            percentile(gets, 50),
        )
    )


# The keys each benchmarked feature writes when turned on (settings-mapping.md),
# by dconf path, as GVariant type and value; turned off, they are reset.
FEATURE_KEYS = {
    "invert-colors": {
        "/org/gnome/desktop/a11y/applications/screen-magnifier-enabled": ("b", True),
        "/org/gnome/desktop/a11y/magnifier/mag-factor": ("d", 1.0),
        "/org/gnome/desktop/a11y/magnifier/screen-position": ("s", "full-screen"),
        "/org/gnome/desktop/a11y/magnifier/invert-lightness": ("b", True),
    },
    "high-contrast": {
        "/org/gnome/desktop/a11y/interface/high-contrast": ("b", True),
    },
}


def dconf_change(options):
    from gi.repository import GLib

    def changeset(on):
        entries = {}
        for path, (kind, value) in FEATURE_KEYS[options.feature].items():
            entries[path] = GLib.Variant(kind, value) if on else None
        data = GLib.Variant("a{smv}", entries).get_data_as_bytes().get_data()
        return dbus.ByteArray(data)

    sets = [changeset(True), changeset(False)]
    bus = dbus.bus.BusConnection(options.address)

    def change(on):
        bus.call_blocking("ca.desrt.dconf", "/ca/desrt/dconf/Writer/user", "ca.desrt.dconf.Writer", "Change",
                          "ay", [sets[0 if on else 1]], timeout=25.0)

    for i in range(options.warmup):
        change(i % 2 == 0)
    if options.warmup % 2 == 1:
        change(False)
    times = []
    for i in range(options.count):
        if options.interval:
            pause(options.interval / 1000.0, False)
        start = time.perf_counter()
        change(i % 2 == 0)
        times.append((time.perf_counter() - start) * 1000.0)
    change(False)
    print("dconf-change n=%d p50=%.3f p90=%.3f max=%.3f (ms)"
          % (len(times), percentile(times, 50), percentile(times, 90), max(times)))


def first_reply(options):
    bus = dbus.bus.BusConnection(options.address)
    results = []
    for _ in range(options.runs):
        if bus.name_has_owner(NAME):
            sys.exit("first-reply: %s is already owned before the start" % NAME)
        log = open(options.log, "ab") if options.log else subprocess.DEVNULL
        start = time.perf_counter()
        proc = subprocess.Popen(options.command, stdout=subprocess.DEVNULL, stderr=log)
        elapsed = None
        while time.perf_counter() - start < options.timeout:
            try:
                if bus.name_has_owner(NAME):
                    call(bus, "Get", "ss", [IFACE, "Version"], iface=PROPS)
                    elapsed = (time.perf_counter() - start) * 1000.0
                    break
            except dbus.exceptions.DBusException:
                pass
            if proc.poll() is not None:
                break
            time.sleep(0.001)
        proc.terminate()
        proc.wait(timeout=10)
        if log is not subprocess.DEVNULL:
            log.close()
        if elapsed is None:
            sys.exit("first-reply: no reply within %.0f s (exit status %s)" % (options.timeout, proc.returncode))
        results.append(elapsed)
        # The bus has to see the old owner go before the next start.
        deadline = time.monotonic() + 5
        while bus.name_has_owner(NAME) and time.monotonic() < deadline:
            time.sleep(0.005)
    print("first-reply ms=" + ",".join("%.1f" % r for r in results)
          + " median=%.1f" % statistics.median(results))


def fsync_pattern(options):
    """The journal's write without the service. classic: a new temporary file,
    fsync, rename over, fsync the directory. recycled (what guidedaccessd
    does, DurableFile.replaceRecycling): the content padded to 4096 bytes
    into the one of two kept files the journal does not name, fdatasync, a
    second name for it renamed over the journal, fsync the directory."""
    path = os.path.join(options.dir, "journal.json")
    temporary = path + ".tmp"
    payload = b"{\n" + b"  \"x\" : 1,\n" * 40 + b"}\n"
    slots = [os.path.join(options.dir, ".journal.json.slot-" + s) for s in "ab"]
    fresh = os.path.join(options.dir, ".journal.json.new")
    padded = payload + b" " * (4095 - len(payload)) + b"\n"
    if options.pattern == "recycled":
        for slot in slots:
            fd = os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.write(fd, padded)
            os.fsync(fd)
            os.close(fd)
    times = []
    for i in range(options.count):
        if options.interval:
            time.sleep(options.interval / 1000.0)
        start = time.perf_counter()
        if options.pattern == "recycled":
            slot = slots[i % 2]
            fd = os.open(slot, os.O_WRONLY | os.O_CLOEXEC)
            os.pwrite(fd, padded, 0)
            os.fdatasync(fd)
            os.close(fd)
            os.link(slot, fresh)
            os.rename(fresh, path)
        else:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            os.write(fd, payload)
            os.fsync(fd)
            os.close(fd)
            os.rename(temporary, path)
        dirfd = os.open(options.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        os.fsync(dirfd)
        os.close(dirfd)
        times.append((time.perf_counter() - start) * 1000.0)
    print("fsync n=%d p50=%.3f p90=%.3f max=%.3f (ms)"
          % (len(times), percentile(times, 50), percentile(times, 90), max(times)))


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("configure")
    c.add_argument("--address", required=True)
    c.add_argument("--count", type=int, default=400)
    c.add_argument("--warmup", type=int, default=10)
    c.add_argument("--feature", default="invert-colors")
    c.add_argument("--interval", type=float, default=0.0,
                   help="ms to wait before each timed call (isolated calls, not back to back)")
    c.add_argument("--spin", action="store_true", help="wait --interval by spinning, not sleeping")
    d = sub.add_parser("dconf-change")
    d.add_argument("--address", required=True)
    d.add_argument("--count", type=int, default=400)
    d.add_argument("--warmup", type=int, default=10)
    d.add_argument("--feature", default="invert-colors", choices=sorted(FEATURE_KEYS))
    d.add_argument("--interval", type=float, default=0.0)
    f = sub.add_parser("first-reply")
    f.add_argument("--address", required=True)
    f.add_argument("--runs", type=int, default=5)
    f.add_argument("--timeout", type=float, default=10.0)
    f.add_argument("--log", help="append the daemon's stderr here")
    f.add_argument("command", nargs=argparse.REMAINDER)
    s = sub.add_parser("fsync")
    s.add_argument("--dir", required=True)
    s.add_argument("--count", type=int, default=200)
    s.add_argument("--pattern", choices=["classic", "recycled"], default="recycled")
    s.add_argument("--interval", type=float, default=0.0, help="ms to sleep before each write")
    options = parser.parse_args()
    if options.what == "configure":
        configure(options)
    elif options.what == "fsync":
        fsync_pattern(options)
    elif options.what == "dconf-change":
        dconf_change(options)
    else:
        if options.command and options.command[0] == "--":
            options.command = options.command[1:]
        if not options.command:
            parser.error("first-reply needs a command after --")
        first_reply(options)


if __name__ == "__main__":
    main()
