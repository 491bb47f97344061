"""Shared helpers for guidedaccessd's integration tests and stress_kill.py.

- GAEnv: a private session bus with real dconf behind it (dconf-service is
  D-Bus-activated from /usr/share/dbus-1/services) and a private HOME,
  XDG_CONFIG_HOME, XDG_CACHE_HOME, XDG_RUNTIME_DIR for the daemon and for
  every client run through it (busctl, gdbus, gsettings, dconf).
- Daemon: guidedaccessd in that environment (`--user --address BUS
  --state-dir ROOT/state`), ready once org.guidedaccess.GuidedAccess1 has an
  owner; kill -9 and restart.
- snapshot(): every mapped key through the real `dconf read` (None = unset).
- Recorder: a dbus-python connection on the GLib main loop that records
  SessionChanged, RestrictionChanged and PropertiesChanged in arrival order,
  and the replies of calls made through it, in the same list.
- ErrorMonitor: a bus monitor (BecomeMonitor) that sees the error replies the
  daemon sends, so that a busctl call's error NAME can be checked (busctl
  itself prints only the message).

Written against docs/dbus-api.md and docs/settings-mapping.md, not
against the implementation. Standalone: needs no pytest.
"""

import atexit
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
DAEMON_BINARY = Path(os.environ.get("GUIDEDACCESSD", REPO_ROOT / ".build" / "debug" / "guidedaccessd"))
BUS_CONFIG_TEMPLATE = HERE / "bus.conf.in"

NAME = "org.guidedaccess.GuidedAccess1"
PATH = "/org/guidedaccess/GuidedAccess1"
IFACE = "org.guidedaccess.GuidedAccess1"
PROPERTIES = "org.freedesktop.DBus.Properties"
PEER = "org.freedesktop.DBus.Peer"
GA_ERROR = "org.guidedaccess.GuidedAccess1.Error."
DBUS_ERROR = "org.freedesktop.DBus.Error."

STARTUP_TIMEOUT = 15.0
CLIENT_TIMEOUT = 15.0

# The spec's vocabulary, written out.
FEATURES = sorted([
    "screen-reader", "zoom", "invert-colors", "grayscale",
    "high-contrast", "large-text", "on-screen-keyboard", "reduce-motion",
])

# (schema, key) of every mapped key (settings-mapping.md), with its dconf path.
A11Y_APPS = "org.gnome.desktop.a11y.applications"
MAGNIFIER = "org.gnome.desktop.a11y.magnifier"
A11Y_IFACE = "org.gnome.desktop.a11y.interface"
DESKTOP_IFACE = "org.gnome.desktop.interface"
MAPPED_KEYS = [
    (A11Y_APPS, "screen-reader-enabled"),
    (A11Y_APPS, "screen-magnifier-enabled"),
    (A11Y_APPS, "screen-keyboard-enabled"),
    (MAGNIFIER, "mag-factor"),
    (MAGNIFIER, "screen-position"),
    (MAGNIFIER, "invert-lightness"),
    (MAGNIFIER, "color-saturation"),
    (A11Y_IFACE, "high-contrast"),
    # GNOME >= 50 only; on GNOME 43 it must stay untouched (unset).
    (A11Y_IFACE, "reduced-motion"),
    (DESKTOP_IFACE, "text-scaling-factor"),
    (DESKTOP_IFACE, "enable-animations"),
]


def dconf_path(schema, key):
    return "/" + schema.replace(".", "/") + "/" + key


KEY_PATHS = [dconf_path(s, k) for s, k in MAPPED_KEYS]


def P(schema, key):
    return dconf_path(schema, key)


def expected_values(features, zoom_factor=2.0, text_scale=1.5):
    """The values the mapping sets for this set of features, {dconf path: value};
    keys the mapping does not set are absent (settings-mapping.md's table)."""
    features = set(features)
    values = {}
    if "screen-reader" in features:
        values[P(A11Y_APPS, "screen-reader-enabled")] = True
    magnifier = features & {"zoom", "invert-colors", "grayscale"}
    if magnifier:
        values[P(A11Y_APPS, "screen-magnifier-enabled")] = True
        values[P(MAGNIFIER, "mag-factor")] = zoom_factor if "zoom" in features else 1.0
        values[P(MAGNIFIER, "screen-position")] = "full-screen"
    if "invert-colors" in features:
        values[P(MAGNIFIER, "invert-lightness")] = True
    if "grayscale" in features:
        values[P(MAGNIFIER, "color-saturation")] = 0.0
    if "high-contrast" in features:
        values[P(A11Y_IFACE, "high-contrast")] = True
    if "large-text" in features:
        values[P(DESKTOP_IFACE, "text-scaling-factor")] = text_scale
    if "on-screen-keyboard" in features:
        values[P(A11Y_APPS, "screen-keyboard-enabled")] = True
    if "reduce-motion" in features:
        values[P(DESKTOP_IFACE, "enable-animations")] = False
    return values


def feature_keys(feature):
    """The dconf paths a feature's mapping may write (for the magnifier
    features: the shared magnifier keys too)."""
    return set(expected_values([feature]))


# Schema defaults (GNOME 43), by dconf path: what an unset key reads as
# through gsettings.
DEFAULTS = {
    P(A11Y_APPS, "screen-reader-enabled"): False,
    P(A11Y_APPS, "screen-magnifier-enabled"): False,
    P(A11Y_APPS, "screen-keyboard-enabled"): False,
    P(MAGNIFIER, "mag-factor"): 2.0,
    P(MAGNIFIER, "screen-position"): "full-screen",
    P(MAGNIFIER, "invert-lightness"): False,
    P(MAGNIFIER, "color-saturation"): 1.0,
    P(A11Y_IFACE, "high-contrast"): False,
    P(DESKTOP_IFACE, "text-scaling-factor"): 1.0,
    P(DESKTOP_IFACE, "enable-animations"): True,
}


# ---------------------------------------------------------------- processes

_STARTED = []  # every Popen this module started, killed at exit at the latest


def _die_with_parent():
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _children(pid):
    try:
        text = "".join(p.read_text() for p in Path(f"/proc/{pid}/task").glob("*/children"))
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _stop(process):
    if process.poll() is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


@atexit.register
def _cleanup():
    for process in _STARTED:
        if process.poll() is None:
            for child in _children(process.pid):
                _kill_pid(child)
            _stop(process)


def parse_gvariant(text):
    """dconf/gsettings output → Python value; "" (unset) → None."""
    text = text.strip()
    if not text:
        return None
    from gi.repository import GLib

    return GLib.Variant.parse(None, text, None, None).unpack()


# ---------------------------------------------------------------- environment

GNOME_DESKTOP_CONFIG = "[Service]\nDesktop=gnome-shell\n"
GNOME_SESSION_NAME = "org.gnome.SessionManager"



class GAEnv:
    """A private session bus with real dconf and a private environment."""

    def __init__(self, prefix="/tmp/ga-it-", max_replies_per_connection=50000):
        # Short path: a unix socket path must fit in 108 bytes. Reachable by
        # other users (for the setpriv tests): the root is 0755, the socket 0777.
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        os.chmod(self.root, 0o755)
        for name in ("home", "config", "cache", "runtime", "state"):
            (self.root / name).mkdir(mode=0o700)
        os.chmod(self.root / "runtime", 0o700)
        self.state_dir = self.root / "state"
        self.socket = self.root / "bus"
        self.address = f"unix:path={self.socket}"
        self.env = {
            "HOME": str(self.root / "home"),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_CACHE_HOME": str(self.root / "cache"),
            "XDG_RUNTIME_DIR": str(self.root / "runtime"),
            "XDG_STATE_HOME": str(self.root / "home" / ".local" / "state"),
            "DBUS_SESSION_BUS_ADDRESS": self.address,
            # No system bus: polkit and logind are absent, deterministically.
            "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={self.root}/no-system-bus",
            "GSETTINGS_BACKEND": "dconf",
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "NO_AT_BRIDGE": "1",
        }
        if "XDG_DATA_DIRS" in os.environ:
            self.env["XDG_DATA_DIRS"] = os.environ["XDG_DATA_DIRS"]
        # session.conf's limit of pending replies per connection, unless told
        # otherwise (None: dbus-daemon's built-in 128, the system bus's).
        config = BUS_CONFIG_TEMPLATE.read_text().replace("@TYPE@", "session").replace("@SOCKET@", str(self.socket))
        if max_replies_per_connection is not None:
            config = config.replace(
                "</busconfig>",
                f'  <limit name="max_replies_per_connection">{max_replies_per_connection}</limit>\n</busconfig>')
        (self.root / "bus.conf").write_text(config)
        self.bus_log_path = self.root / "dbus-daemon.log"
        self._bus_log = open(self.bus_log_path, "wb")
        self.bus_process = subprocess.Popen(
            ["dbus-daemon", f"--config-file={self.root}/bus.conf", "--nofork", "--nopidfile", "--print-address=1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._bus_log,
            env=self.env, preexec_fn=_die_with_parent,
        )
        _STARTED.append(self.bus_process)
        line = self.bus_process.stdout.readline().decode()
        if not line.startswith(f"unix:path={self.socket}"):
            raise RuntimeError(f"dbus-daemon did not start: {line!r} {self.bus_log_path.read_text()}")
        os.chmod(self.socket, 0o777)
        self.daemons = []
        self._connections = []
        self._extra_processes = []
        self.stand_for_gnome()

    def stand_for_gnome(self):
        """What a bare bus stands for in these tests: a GNOME session. The
        service is told its desktop ([Service] Desktop=gnome-shell in the
        user's default configuration file, the spec's way where detection
        cannot), and gnome-session's name is on the bus, so the session, not
        the service, starts Orca from `screen-reader-enabled`: every feature
        is its keys, as settings-mapping.md maps them."""
        config = Path(self.env["XDG_CONFIG_HOME"]) / "guidedaccess" / "guidedaccess.conf"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(GNOME_DESKTOP_CONFIG)
        self.gnome_session = self.connect(mainloop=False)
        self.gnome_session.request_name(GNOME_SESSION_NAME)

    def stand_for_no_desktop(self):
        """Undoes stand_for_gnome: a bare bus, nothing to detect."""
        (Path(self.env["XDG_CONFIG_HOME"]) / "guidedaccess" / "guidedaccess.conf").unlink()
        self.gnome_session.release_name(GNOME_SESSION_NAME)

    def start_system_bus(self):
        """A second private bus, of type system, for fakes of system
        services (logind); daemons started afterwards see it as their
        system bus. Returns its address."""
        socket = self.root / "system-bus"
        config = (
            BUS_CONFIG_TEMPLATE.read_text().replace("@TYPE@", "system").replace("@SOCKET@", str(socket))
            .replace("<servicedir>/usr/share/dbus-1/services</servicedir>", "")
        )
        (self.root / "system-bus.conf").write_text(config)
        process = subprocess.Popen(
            ["dbus-daemon", f"--config-file={self.root}/system-bus.conf", "--nofork", "--nopidfile",
             "--print-address=1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._bus_log,
            env=self.env, preexec_fn=_die_with_parent,
        )
        _STARTED.append(process)
        self._extra_processes.append(process)
        line = process.stdout.readline().decode()
        if not line.startswith(f"unix:path={socket}"):
            raise RuntimeError(f"system dbus-daemon did not start: {line!r}")
        process.stdout.close()
        self.env["DBUS_SYSTEM_BUS_ADDRESS"] = f"unix:path={socket}"
        return self.env["DBUS_SYSTEM_BUS_ADDRESS"]

    def start_helper(self, argv, name):
        """A helper process (a fake system service) that prints one line when
        ready; stopped with the environment."""
        log = open(self.root / f"{name}.log", "wb")
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                   env=self.env, preexec_fn=_die_with_parent)
        _STARTED.append(process)
        self._extra_processes.append(process)
        line = process.stdout.readline().decode()
        if not line.strip():
            raise RuntimeError(f"{name} did not start: {(self.root / f'{name}.log').read_text()}")
        return process

    # -- clients run in this environment

    def run(self, argv, timeout=CLIENT_TIMEOUT, prefix=()):
        completed = subprocess.run(
            [*prefix, *argv], stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=timeout, env=self.env,
        )
        return completed.returncode, completed.stdout, completed.stderr

    def busctl(self, *args, options=(), prefix=(), timeout=CLIENT_TIMEOUT):
        """busctl --address=BUS [options] -- args..."""
        return self.run(["busctl", f"--address={self.address}", *options, "--", *args], timeout=timeout, prefix=prefix)

    def busctl_call(self, member, *args, prefix=(), options=()):
        """busctl call NAME PATH IFACE member args..."""
        return self.busctl("call", NAME, PATH, IFACE, member, *args, prefix=prefix, options=options)

    def gdbus_call(self, method, *args):
        return self.run(["gdbus", "call", "--address", self.address, "--dest", NAME,
                         "--object-path", PATH, "--method", f"{IFACE}.{method}", *args])

    def gsettings_set(self, schema, key, value):
        rc, out, err = self.run(["gsettings", "set", schema, key, value])
        assert rc == 0, err

    def gsettings_get(self, schema, key):
        rc, out, err = self.run(["gsettings", "get", schema, key])
        assert rc == 0, err
        return parse_gvariant(out)

    def dconf_read(self, path):
        rc, out, err = self.run(["dconf", "read", path])
        assert rc == 0, err
        return parse_gvariant(out)

    def snapshot(self):
        """{dconf path: value or None (unset)} of every mapped key, each read
        with the real `dconf read` (run concurrently)."""
        procs = {
            path: subprocess.Popen(["dconf", "read", path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=self.env)
            for path in KEY_PATHS
        }
        result = {}
        for path, proc in procs.items():
            out, err = proc.communicate(timeout=CLIENT_TIMEOUT)
            assert proc.returncode == 0, f"dconf read {path}: {err}"
            result[path] = parse_gvariant(out)
        return result

    def effective(self):
        """{dconf path: value through gsettings (default when unset)}."""
        out = {}
        for schema, key in MAPPED_KEYS:
            if key == "reduced-motion":
                continue  # not in GNOME 43's schema
            out[dconf_path(schema, key)] = self.gsettings_get(schema, key)
        return out

    # -- the daemon and connections

    def daemon(self, config=None, args=(), extra_env=None, stderr=None):
        """A Daemon that is not started yet."""
        daemon = Daemon(self, config=config, args=args, extra_env=extra_env, stderr=stderr)
        self.daemons.append(daemon)
        return daemon

    def start_daemon(self, config=None, args=(), extra_env=None, stderr=None):
        daemon = Daemon(self, config=config, args=args, extra_env=extra_env, stderr=stderr)
        self.daemons.append(daemon)
        daemon.start()
        return daemon

    def connect(self, mainloop=True):
        import dbus
        import dbus.bus

        if mainloop:
            from dbus.mainloop.glib import DBusGMainLoop

            connection = dbus.bus.BusConnection(self.address, mainloop=DBusGMainLoop())
        else:
            connection = dbus.bus.BusConnection(self.address)
        self._connections.append(connection)
        return connection

    def write_config(self, text, name="guidedaccess.conf"):
        path = self.root / name
        path.write_text(text)
        return path

    def logs(self):
        sections = []
        for i, daemon in enumerate(self.daemons):
            sections.append((f"guidedaccessd #{i} stderr (all runs)", daemon.log()))
        self._bus_log.flush()
        sections.append(("dbus-daemon stderr", self.bus_log_path.read_text(errors="replace")))
        return sections

    def stop(self):
        for connection in self._connections:
            try:
                connection.close()
            except Exception:
                pass
        for daemon in self.daemons:
            daemon.stop()
        for process in self._extra_processes:
            _stop(process)
        # dconf-service and anything else the bus activated.
        for child in _children(self.bus_process.pid):
            _kill_pid(child)
        _stop(self.bus_process)
        self.bus_process.stdout.close()
        self._bus_log.close()
        shutil.rmtree(self.root, ignore_errors=True)


class Daemon:
    """guidedaccessd in a GAEnv; start, kill -9, restart (same state dir).

    `extra_env`: more environment variables for it; `stderr`: a file
    descriptor (or file) to give it as its stderr instead of its log file
    (e.g. one end of a socketpair that a test stops reading); its stdout
    and the run headers still go to the log file."""

    def __init__(self, env, config=None, args=(), extra_env=None, stderr=None):
        if not DAEMON_BINARY.exists():
            raise FileNotFoundError(
                f"{DAEMON_BINARY} does not exist: build it with 'swift build --product guidedaccessd' "
                "or set GUIDEDACCESSD")
        self.env = env
        self.process_env = {**env.env, **(extra_env or {})}
        self.argv = [str(DAEMON_BINARY), "--user", "--address", env.address, "--state-dir", str(env.state_dir)]
        if config is not None:
            self.argv += ["--config", str(config)]
        self.argv += list(args)
        self.log_path = env.root / f"guidedaccessd-{len(env.daemons)}.log"
        self._log = open(self.log_path, "ab")
        self.stderr = stderr
        self.process = None
        self.runs = 0
        self._probe = None

    def _bus(self):
        if self._probe is None:
            import dbus.bus

            self._probe = dbus.bus.BusConnection(self.env.address)
        return self._probe

    def has_name(self):
        return bool(self._bus().call_blocking(
            "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
            "NameHasOwner", "s", (NAME,), timeout=5))

    def unique_name(self):
        return str(self._bus().call_blocking(
            "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
            "GetNameOwner", "s", (NAME,), timeout=5))

    def start(self, timeout=STARTUP_TIMEOUT):
        self.runs += 1
        self._log.write(f"\n===== run {self.runs}: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=self._log if self.stderr is None else self.stderr,
            env=self.process_env, preexec_fn=_die_with_parent,
        )
        _STARTED.append(self.process)
        deadline = time.monotonic() + timeout
        while True:
            if self.has_name():
                return
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(f"guidedaccessd exited with {code} before owning {NAME}\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"guidedaccessd did not own {NAME} within {timeout} s\n{self.log()[-4000:]}")
            time.sleep(0.01)

    def expect_start_failure(self, timeout=10.0):
        """Runs the daemon, which must exit non-zero without ever owning the
        name; returns (exit code, its log of this run)."""
        self.runs += 1
        self._log.write(f"\n===== run {self.runs}: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        offset = self.log_path.stat().st_size
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            env=self.process_env, preexec_fn=_die_with_parent,
        )
        _STARTED.append(self.process)
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            if self.has_name():
                raise AssertionError(f"guidedaccessd took {NAME} although it should have refused to start")
            if time.monotonic() > deadline:
                raise AssertionError(f"guidedaccessd still runs after {timeout} s; it should have refused to start")
            time.sleep(0.01)
        return self.process.returncode, self.log_path.read_text(errors="replace")[offset:]

    def kill9(self):
        """SIGKILL, then wait until the bus has dropped the name."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=5)
        deadline = time.monotonic() + 5
        while self.has_name():
            if time.monotonic() > deadline:
                raise TimeoutError("the bus still lists the name 5 s after kill -9")
            time.sleep(0.005)

    def restart_after_kill9(self):
        self.kill9()
        self.start()

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def log(self):
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.process is not None:
            _stop(self.process)
        if self._probe is not None:
            try:
                self._probe.close()
            except Exception:
                pass
            self._probe = None
        self._log.close()


# ---------------------------------------------------------------- GLib pumping


def poll(condition, timeout, interval=0.01):
    """condition() every `interval` s until it is true or `timeout` s have
    passed (no main loop: for state read from files and processes); its
    last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def pump(condition, timeout):
    """Runs the default GLib main context until condition() is true or
    `timeout` seconds have passed; returns condition()."""
    from gi.repository import GLib

    context = GLib.MainContext.default()
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return condition()
        if not context.iteration(False):
            time.sleep(0.001)
    return True


def pump_for(seconds):
    """Runs the default GLib main context for `seconds`."""
    pump(lambda: False, seconds)


def plain(value):
    """dbus-python value → plain Python (str, int, float, bool, list, dict, tuple)."""
    import dbus

    if isinstance(value, dbus.Boolean):
        return bool(value)
    if isinstance(value, (dbus.String, dbus.ObjectPath, dbus.Signature)):
        return str(value)
    if isinstance(value, (dbus.Byte, dbus.Int16, dbus.UInt16, dbus.Int32, dbus.UInt32, dbus.Int64, dbus.UInt64)):
        return int(value)
    if isinstance(value, dbus.Double):
        return float(value)
    if isinstance(value, dbus.Dictionary) or isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, dbus.Struct) or isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, (dbus.Array, list)):
        return [plain(v) for v in value]
    return value


FEATURE_NAMES = ("screen-reader", "zoom", "invert-colors", "grayscale", "high-contrast", "large-text",
                 "on-screen-keyboard", "reduce-motion")


class SupportChanged:
    """Equals the recorder's event of a PropertiesChanged for what the
    drivers deliver: Desktop and SupportedFeatures as given, and in the same
    signal (and nothing else) UnsupportedReasons naming every other feature,
    each reason starting with its feature's name (the UnsupportedFeature
    message). Usable with `in` and `count` on Recorder.events."""

    def __init__(self, desktop, supported):
        self.desktop = desktop
        self.supported = list(supported)

    def __eq__(self, event):
        if not (isinstance(event, tuple) and len(event) == 3 and event[0] == "PropertiesChanged" and event[2] == []):
            return False
        changed = event[1]
        if set(changed) != {"Desktop", "SupportedFeatures", "UnsupportedReasons"}:
            return False
        reasons = changed["UnsupportedReasons"]
        return (changed["Desktop"] == self.desktop and changed["SupportedFeatures"] == self.supported
                and set(reasons) == set(FEATURE_NAMES) - set(self.supported)
                and all(reason.startswith(f"{feature}: ") for feature, reason in reasons.items()))

    def __repr__(self):
        return (f"PropertiesChanged(Desktop={self.desktop!r}, SupportedFeatures={self.supported!r}, "
                "UnsupportedReasons for the others)")


class Recorder:
    """One dbus-python connection: records the daemon's signals and the
    replies of calls made through it, in arrival order, in self.events:
      ("SessionChanged", active, reason)
      ("RestrictionChanged", identifier, state)
      ("PropertiesChanged", {changed}, [invalidated])
      ("reply", member, value) / ("error", member, name, message)
    """

    def __init__(self, env):
        self.env = env
        self.connection = env.connect(mainloop=True)
        self.events = []
        c = self.connection
        c.add_signal_receiver(
            lambda active, reason: self.events.append(("SessionChanged", bool(active), str(reason))),
            signal_name="SessionChanged", dbus_interface=IFACE, path=PATH)
        c.add_signal_receiver(
            lambda ident, state: self.events.append(("RestrictionChanged", str(ident), str(state))),
            signal_name="RestrictionChanged", dbus_interface=IFACE, path=PATH)
        c.add_signal_receiver(
            lambda interface, changed, invalidated: self.events.append(
                ("PropertiesChanged", plain(changed), plain(invalidated)))
            if str(interface) == IFACE else None,
            signal_name="PropertiesChanged", dbus_interface=PROPERTIES, path=PATH)
        # A round trip to the bus, so that the match rules are surely in place.
        c.call_blocking("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                        "GetId", None, (), timeout=5)

    @property
    def unique_name(self):
        return str(self.connection.get_unique_name())

    def call(self, member, signature=None, args=(), interface=IFACE, timeout=CLIENT_TIMEOUT):
        """Blocking call; returns plain values; raises DBusException."""
        return plain(self.connection.call_blocking(NAME, PATH, interface, member, signature, args, timeout=timeout))

    def error(self, member, signature=None, args=(), interface=IFACE):
        """A call that must fail: returns (error name, message); AssertionError
        when it succeeds."""
        import dbus

        try:
            value = self.call(member, signature, args, interface=interface)
        except dbus.exceptions.DBusException as error:
            return error.get_dbus_name(), error.get_dbus_message() or ""
        raise AssertionError(f"{member}{tuple(args)!r} succeeded with {value!r}; an error was expected")

    def call_async(self, member, signature=None, args=(), interface=IFACE, timeout=CLIENT_TIMEOUT):
        self.connection.call_async(
            NAME, PATH, interface, member, signature, args,
            reply_handler=lambda *values: self.events.append(("reply", member, plain(list(values)))),
            error_handler=lambda e: self.events.append(("error", member, e.get_dbus_name(), e.get_dbus_message())),
            timeout=timeout)

    def call_recorded(self, member, signature=None, args=(), timeout=5.0):
        """Calls asynchronously and pumps until its reply is recorded; returns
        the events recorded from the call (its signals, then its reply)."""
        start = len(self.events)
        self.call_async(member, signature, args)
        done = lambda: any(e[0] in ("reply", "error") and e[1] == member for e in self.events[start:])  # noqa: E731
        assert pump(done, timeout), f"no reply to {member} within {timeout} s; events {self.events[start:]}"
        return self.events[start:]

    def prop(self, name):
        return self.call("Get", "ss", (IFACE, name), interface=PROPERTIES)

    def props(self):
        return self.call("GetAll", "s", (IFACE,), interface=PROPERTIES)

    def settle(self, seconds=0.2):
        """A round trip to the daemon, then pumps: every signal sent before
        is recorded."""
        self.call("Ping", interface=PEER)
        pump_for(seconds)

    def clear(self):
        self.settle(0.05)
        del self.events[:]

    def signals(self, kinds=("SessionChanged", "RestrictionChanged", "PropertiesChanged")):
        return [e for e in self.events if e[0] in kinds]

    def wait_for(self, event, timeout):
        return pump(lambda: event in self.events, timeout)


class ErrorMonitor:
    """A bus monitor that records every error reply (sender, name, message,
    destination),
    so that the error name of a busctl call can be checked."""

    def __init__(self, env):
        import dbus

        self.env = env
        self.connection = env.connect(mainloop=True)
        self.errors = []

        def on_message(connection, message):
            if isinstance(message, dbus.lowlevel.ErrorMessage):
                args = message.get_args_list()
                self.errors.append((str(message.get_sender()), str(message.get_error_name()),
                                    str(args[0]) if args else "", str(message.get_destination())))

        self.connection.add_message_filter(on_message)
        self.connection.call_blocking(
            "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus.Monitoring",
            "BecomeMonitor", "asu", (["type='error'"], 0), timeout=5)

    def busctl_error(self, daemon, member, *args, prefix=()):
        """Runs `busctl call ... member args` (under `prefix`, e.g. setpriv),
        which must fail; returns (error name, message) of the daemon's error
        reply."""
        sender = daemon.unique_name()
        # Copies of earlier error replies (to this process's own
        # connections) may still be queued: drain them, and ignore any
        # addressed to a connection of this process.
        pump_for(0.05)
        ours = set()
        for connection in self.env._connections:
            try:
                ours.add(str(connection.get_unique_name()))
            except Exception:
                pass
        start = len(self.errors)
        rc, out, err = self.env.busctl_call(member, *args, prefix=prefix)
        assert rc != 0, f"busctl call {member} {' '.join(args)} succeeded: {out!r}; an error was expected"
        found = lambda: [e for e in self.errors[start:] if e[0] == sender and e[3] not in ours]  # noqa: E731
        assert pump(found, 3), f"busctl failed ({err.strip()!r}) but the daemon sent no error reply"
        _, name, message, _ = found()[0]
        assert message in err, f"the error reply seen ({name}: {message}) is not busctl's ({err.strip()})"
        return name, message


# ---------------------------------------------------------------- busctl arguments

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def busctl_options(**options):
    """a{sv} options as busctl arguments: busctl_options(features=['zoom'],
    time_limit=('t', 2)) → ['a{sv}', '2', 'features', 'as', '1', 'zoom',
    'time-limit', 't', '2']. Keys use '_' for '-'."""
    args = ["a{sv}", str(len(options))]
    for key, value in options.items():
        args.append(key.replace("_", "-"))
        if isinstance(value, list):
            args += ["as", str(len(value)), *value]
        else:
            signature, item = value
            args += [signature, str(item).lower() if isinstance(item, bool) else str(item)]
    return args


def busctl_features(features, enabled):
    return ["asb", str(len(features)), *features, "true" if enabled else "false"]


# ---------------------------------------------------------------- the kill loop


def _driver(env, rng_seed, stop, counts):
    """Drives one start/configure/end loop with busctl one-shot calls (each
    a take-over of the previous one's session) until `stop` is set."""
    import random

    rng = random.Random(rng_seed)
    while not stop.is_set():
        op = rng.random()
        if op < 0.3:
            features = rng.sample(FEATURES, rng.randint(0, 4))
            opts = {"features": features} if features else {}
            if rng.random() < 0.3:
                opts["zoom_factor"] = ("d", rng.choice([1.5, 3.0, 8.0]))
            args = busctl_options(**opts)
            member = "StartSession"
        elif op < 0.8:
            features = rng.sample(FEATURES, rng.randint(1, 4))
            args = busctl_features(features, rng.random() < 0.6)
            member = "ConfigureForSession"
        else:
            args = []
            member = "EndSession"
        try:
            rc, _, _ = env.busctl_call(member, *args)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        counts[member, rc == 0] = counts.get((member, rc == 0), 0) + 1


def kill_loop(env, daemon, kills, rng, baseline, log=lambda text: None, drivers=2,
              delay=(0.02, 0.25)):
    """kill -9 of the daemon at random points of start/configure/end loops
    with calls in flight, `kills` times. After each restart: end the session
    if one is active (root is an operator in user mode), then check that no
    mapped key differs from `baseline` and that no session remains.

    Returns stats; raises AssertionError (naming the kill) at the first
    wrong key."""
    import threading

    stats = {"kills": 0, "session_active_after_restart": 0, "keys_on_after_restart": 0, "calls": {}}
    recorder = Recorder(env)
    for n in range(1, kills + 1):
        stop = threading.Event()
        threads = [threading.Thread(target=_driver, args=(env, rng.random(), stop, stats["calls"]), daemon=True)
                   for _ in range(drivers)]
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(*delay))
        daemon.kill9()
        stop.set()
        for thread in threads:
            thread.join(timeout=CLIENT_TIMEOUT + 5)
        stats["kills"] += 1
        daemon.start()
        active = recorder.prop("SessionActive")
        if active:
            stats["session_active_after_restart"] += 1
            if env.snapshot() != baseline:
                stats["keys_on_after_restart"] += 1
            rc, out, err = env.busctl_call("EndSession")
            assert rc == 0, f"kill {n}: EndSession after restart failed: {err.strip()}"
        props = recorder.props()
        assert (props["SessionActive"], props["EnabledFeatures"]) == (False, []), \
            f"kill {n}: after EndSession: SessionActive={props['SessionActive']} EnabledFeatures={props['EnabledFeatures']}"
        now = env.snapshot()
        wrong = {path: (baseline[path], now[path]) for path in baseline if now[path] != baseline[path]}
        assert not wrong, (
            f"kill {n} (session active after restart: {active}): keys left wrong, "
            f"{{path: (baseline, now)}} = {wrong}")
        log(f"kill {n}: ok (session active after restart: {active})")
    return stats


def assert_keys(actual, expected):
    """Compares two snapshots as whole dicts; the message lists every key
    that differs (None = unset)."""
    wrong = {
        path.replace("/org/gnome/desktop/", ""): {"now": actual.get(path), "expected": expected.get(path)}
        for path in sorted(set(actual) | set(expected)) if actual.get(path) != expected.get(path)
    }
    assert not wrong, f"mapped keys differ from what is expected (dconf read; None = unset): {wrong}"
