"""A real sway, headless, run as a test user, for desktop tests that need
what a kiosk on a wlroots compositor has: Wayland and Xwayland clients, a
virtual keyboard (wtype), screenshots (grim), and a screen reader started by
guidedaccessd --user that really speaks.

sway (like cage) refuses to run as root, and a uid without a passwd entry
breaks session-bus connections, so everything in the desktop runs as the
test user TEST_USER, created on first use (tests run as root on fresh
machines). Xwayland, which Orca needs (it runs `xkbcomp $DISPLAY` at
start-up), refuses a /tmp/.X11-unix that is not root's with mode 1777, and
the host's /tmp is not ours to fix: a holder process in a mount namespace of
its own keeps a tmpfs on /tmp with /tmp/.X11-unix 1777, and every process of
the desktop is started in that namespace (nsenter) and then drops to the test
user (setpriv). Its private directory is therefore under /var/tmp, which the
namespace shares with the host.

Desktop starts, in /var/tmp/ga-sway-XXXX (owned by the test user):
- a private session bus that D-Bus-activates services from
  /usr/share/dbus-1/services (dconf-service, org.a11y.Bus);
- `sway` on the headless backend with the pixman renderer, one 1280×800
  output and `xwayland enable`, whose config exports WAYLAND_DISPLAY,
  DISPLAY and SWAYSOCK to the bus's activation environment (as Debian's
  /etc/sway/config.d/50-systemd-user.conf does) and writes sway's
  environment to a file: that is how DISPLAY, which sway sets only for its
  own children, is learnt;
- on request: windows (gtk_button.py), key presses, screenshots, speech
  capture (speech.py, its processes run as the test user in the desktop),
  guidedaccessd --user.
Desktop.env is then the session's environment: what guidedaccessd gets, and
so what the Orca it starts inherits.

Every process is started as the leader of a session of its own (setsid) and
dies with its parent (PR_SET_PDEATHSIG, set again by setpriv after it changes
the uid, which clears it). stop() kills every process in those sessions and
in the mount namespace (speech-dispatcher, which Orca spawns, detaches into a
session of its own), so the namespace and its mounts go with them, then
removes the directory. It also runs at interpreter exit.
The recipe: ../shared/notes/real-systems.md, sections 3 and 4."""

import atexit
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import speech
from gnomeshell import (
    BUS_CONFIG, DAEMON_BINARY, GA_NAME, die_with_parent, kill_all, namespace_holder, processes_in_mount_namespace,
    processes_in_sessions,
    wait_for_name,
)

HERE = Path(__file__).resolve().parent
GTK_BUTTON = HERE / "gtk_button.py"

TEST_USER = "gatest"
WIDTH, HEIGHT = 1280, 800
OUTPUT = "HEADLESS-1"

TOOLS = {name: path for name, path in (
    ("sway", "/usr/bin/sway"), ("swaymsg", "/usr/bin/swaymsg"), ("Xwayland", "/usr/bin/Xwayland"),
    ("wtype", "/usr/bin/wtype"), ("grim", "/usr/bin/grim"), ("dbus-daemon", "/usr/bin/dbus-daemon"),
    ("dbus-update-activation-environment", "/usr/bin/dbus-update-activation-environment"),
    ("gsettings", "/usr/bin/gsettings"), ("python3", "/usr/bin/python3"),
    ("unshare", "/usr/bin/unshare"), ("nsenter", "/usr/bin/nsenter"), ("setpriv", "/usr/bin/setpriv"),
    ("useradd", "/usr/sbin/useradd"))}

SWAY_CONFIG = """\
output {output} resolution {width}x{height}
xwayland enable
exec {update_env} WAYLAND_DISPLAY DISPLAY SWAYSOCK && env -0 > {env_file}.part && mv {env_file}.part {env_file}
"""


def missing_tools():
    """The programs this needs that are not installed (and, when not root,
    the root this needs)."""
    missing = [path for path in TOOLS.values() if not os.access(path, os.X_OK)]
    return missing + ([] if os.geteuid() == 0 else ["root (to create the test user and a mount namespace)"])


def ensure_test_user():
    """TEST_USER's passwd entry, the user created (system user, own group,
    no home: the desktop gives it one) if missing. A parallel test may
    create it first; useradd then fails and the entry is there."""
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    done = subprocess.run([TOOLS["useradd"], "--system", "--user-group", "--no-create-home",
                           "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                           "--comment", "GuidedAccess desktop tests", TEST_USER], capture_output=True, text=True)
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        raise RuntimeError(f"cannot create the test user {TEST_USER}: {done.stderr.strip()}") from None


# ---------------------------------------------------------------- processes


_LIVE = []  # every Desktop not stopped yet


@atexit.register
def _stop_all():
    for desktop in list(_LIVE):
        desktop.stop()


class Desktop:
    """One headless sway run as the test user (see the module's docstring).
    `env` is the environment of everything it starts."""

    def __init__(self):
        self.user = ensure_test_user()
        self.root = Path(tempfile.mkdtemp(prefix="/var/tmp/ga-sway-"))
        _LIVE.append(self)
        self.processes = {}  # name -> Popen; each leads a session of its own
        self.sessions = set()
        self.mount_namespace = None  # 'mnt:[…]' of the private mount namespace
        self.speech = None
        self._connections = []
        self._shots = 0
        self._wtype_runs = 0
        try:
            for name in ("home", "config", "cache", "runtime", "state", "shots", "speech"):
                (self.root / name).mkdir(mode=0o700)
                os.chown(self.root / name, self.user.pw_uid, self.user.pw_gid)
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
            self.env = {
                "HOME": str(self.root / "home"),
                "USER": TEST_USER,
                "LOGNAME": TEST_USER,
                "XDG_CONFIG_HOME": str(self.root / "config"),
                "XDG_CACHE_HOME": str(self.root / "cache"),
                "XDG_RUNTIME_DIR": str(self.root / "runtime"),
                "XDG_DATA_DIRS": "/usr/local/share:/usr/share",
                "GSETTINGS_BACKEND": "dconf",
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG": "C.UTF-8",
            }
            self.holder = self._start_holder()
            self.session_address = self._start_bus()
            self.env["DBUS_SESSION_BUS_ADDRESS"] = self.session_address
        except BaseException:
            self.stop()
            raise

    def log(self, name):
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self):
        sections = [(f"{name} (pid {process.pid}) output", self.log(name)) for name, process in self.processes.items()]
        return sections + (self.speech.logs() if self.speech else [])

    # -- processes as the test user, in the namespace

    def as_user(self, argv):
        """argv run in the desktop's mount namespace as the test user."""
        return [TOOLS["nsenter"], "-t", str(self.holder.pid), "-m", "--",
                TOOLS["setpriv"], f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}", "--init-groups",
                "--pdeathsig", "KILL", "--", *map(str, argv)]

    def _spawn_root(self, name, argv, env, stdout=None):
        with open(self.root / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=stdout or log, stderr=log, env=env, cwd=self.root,
                start_new_session=True, preexec_fn=die_with_parent)
        self.processes[name] = process
        self.sessions.add(process.pid)
        return process

    def spawn(self, name, argv, env=None, stdout=None):
        """Starts argv as the test user in the desktop (env: self.env unless
        given), its output in NAME.log; the Popen's pid is argv's own."""
        return self._spawn_root(name, self.as_user(argv), self.env if env is None else env, stdout)

    def run(self, argv, timeout=15, env=None, check=True, text=True):
        """Runs argv as the test user in the desktop; its output (stdout)."""
        done = subprocess.run(self.as_user(argv), stdin=subprocess.DEVNULL, capture_output=True, text=text,
                              timeout=timeout, env=self.env if env is None else env, cwd=self.root,
                              preexec_fn=die_with_parent)
        if check and done.returncode != 0:
            stderr = done.stderr if text else done.stderr.decode(errors="replace")
            raise RuntimeError(f"{' '.join(map(str, argv))}: exit {done.returncode}: {stderr.strip()}")
        return done.stdout

    def wait_for_output(self, name, text, timeout=30):
        """Waits until `text` is in the output of the process `name`."""
        process = self.processes[name]
        deadline = time.monotonic() + timeout
        while text not in self.log(name):
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode} before it printed {text!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not print {text!r} within {timeout} s")
            time.sleep(0.05)

    def _start_holder(self):
        """Root's process that owns the mount namespace: a private /tmp with
        /tmp/.X11-unix as Xwayland wants it."""
        holder = self._spawn_root("namespace", [
            TOOLS["unshare"], "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
            namespace_holder("ga-sway-tmp")], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE)
        line = holder.stdout.readline().decode()
        holder.stdout.close()
        if line != "ready\n":
            raise RuntimeError(f"the mount namespace for /tmp could not be made: {self.log('namespace')}")
        self.mount_namespace = os.readlink(f"/proc/{holder.pid}/ns/mnt")
        return holder

    def _start_bus(self):
        socket = self.root / "session-bus.sock"
        config = self.root / "session-bus.conf"
        config.write_text(BUS_CONFIG.format(type="session", socket=socket,
                                            servicedir="<servicedir>/usr/share/dbus-1/services</servicedir>"))
        process = self.spawn("session-bus", [TOOLS["dbus-daemon"], f"--config-file={config}", "--nofork",
                                             "--nopidfile", "--print-address=1"], stdout=subprocess.PIPE)
        line = process.stdout.readline().decode()
        process.stdout.close()
        if not line.startswith(f"unix:path={socket}"):
            raise RuntimeError(f"the session dbus-daemon did not start: {line!r} {self.log('session-bus')}")
        return f"unix:path={socket}"

    def connect(self):
        """A dbus-python connection (as root: the bus admits every uid) to
        the session bus."""
        import dbus.bus

        connection = dbus.bus.BusConnection(self.session_address)
        self._connections.append(connection)
        return connection

    wait_for_name = staticmethod(wait_for_name)

    def gsettings_get(self, schema, key):
        return self.run([TOOLS["gsettings"], "get", schema, key]).strip()

    def gsettings_set(self, schema, key, value):
        self.run([TOOLS["gsettings"], "set", schema, key, value])

    # -- sway

    def readable(self, path):
        """A copy of one of our files the test user can read and run: the
        clone it comes from may be under a directory only root may enter
        (/root on a fresh machine)."""
        copy = self.root / "bin" / Path(path).name
        if not copy.exists():
            copy.parent.mkdir(exist_ok=True)
            shutil.copy2(path, copy)
            os.chmod(copy.parent, 0o755)
        return copy

    def start_sway(self, timeout=30):
        """Starts sway and waits until its config's exec has run; adds
        WAYLAND_DISPLAY, DISPLAY and SWAYSOCK to self.env."""
        env_file = self.root / "sway.env"
        config = self.root / "sway.conf"
        config.write_text(SWAY_CONFIG.format(output=OUTPUT, width=WIDTH, height=HEIGHT, env_file=env_file,
                                             update_env=TOOLS["dbus-update-activation-environment"]))
        sway = self.spawn("sway", [TOOLS["sway"], "--config", config], env={
            **self.env, "WLR_BACKENDS": "headless", "WLR_RENDERER": "pixman", "WLR_LIBINPUT_NO_DEVICES": "1"})
        deadline = time.monotonic() + timeout
        while not env_file.exists():
            if sway.poll() is not None:
                raise RuntimeError(f"sway exited with {sway.returncode}: {self.log('sway')[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"sway's config exec did not run within {timeout} s")
            time.sleep(0.02)
        sway_env = dict(entry.split("=", 1) for entry in env_file.read_text().split("\0") if entry)
        for name in ("WAYLAND_DISPLAY", "DISPLAY", "SWAYSOCK"):
            self.env[name] = sway_env[name]
        return sway

    def swaymsg(self, *args):
        """swaymsg -r (raw JSON) with args, parsed."""
        return json.loads(self.run([TOOLS["swaymsg"], "-r", *args]))

    def windows(self):
        """The views sway manages: name (title), app_id (None for X11 ones),
        visible, focused, and rect: (x, y, width, height) of the window's
        content on the screen, without sway's title bar and borders."""
        found = []

        def visit(node):
            if node.get("pid") is not None:
                outer, inner = node["rect"], node["window_rect"]
                found.append({"name": node.get("name"), "app_id": node.get("app_id"),
                              "visible": node.get("visible"), "focused": node["focused"],
                              "rect": (outer["x"] + inner["x"], outer["y"] + inner["y"],
                                       inner["width"], inner["height"])})
            for child in node.get("nodes", []) + node.get("floating_nodes", []):
                visit(child)

        visit(self.swaymsg("-t", "get_tree"))
        return found

    def wait_for_window(self, title, process, timeout=30):
        """The window titled `title` once it is visible and the screen has
        settled (sway lists a view before it has laid it out and drawn
        it)."""
        deadline = time.monotonic() + timeout
        while not any(window["name"] == title and window["visible"] for window in self.windows()):
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited with {process.returncode} before its window appeared")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no window {title!r} within {timeout} s")
            time.sleep(0.05)
        self.settle(timeout=max(0.0, deadline - time.monotonic()))
        return next(window for window in self.windows() if window["name"] == title)

    def settle(self, stable_for=0.3, timeout=10.0):
        """Screenshots until the screen has stayed the same for `stable_for`
        seconds; the last one's path (after `timeout`, whatever it shows)."""
        deadline = time.monotonic() + timeout
        last = self.screenshot()
        same_since = time.monotonic()
        while time.monotonic() - same_since < stable_for and time.monotonic() < deadline:
            time.sleep(0.05)
            shot = self.screenshot()
            if shot.read_bytes() != last.read_bytes():
                same_since = time.monotonic()
            last = shot
        return last

    def start_gtk_button(self, title="Order", label="Order now", timeout=30):
        """gtk_button.py's window (a GTK 3 app with the accessibility bridge
        on, as a kiosk's app would be) once sway manages it: its Popen and
        its entry in windows()."""
        app = self.spawn("gtk-button", [TOOLS["python3"], self.readable(GTK_BUTTON), title, label])
        return app, self.wait_for_window(title, app, timeout)

    def keys(self, *args):
        """Starts one wtype run, `args` as wtype takes them (-k Tab, -s 300,
        text); its Popen. The seat has a keyboard only while wtype runs,
        and the first keyboard is what makes sway give the focused window
        keyboard focus (so GTK activates it and a screen reader speaks it):
        a sequence that needs the focus to stay is one call, ended by a
        sleep (-s) as long as the test listens."""
        self._wtype_runs += 1
        return self.spawn(f"wtype-{self._wtype_runs}", [TOOLS["wtype"], *args])

    def screenshot(self, path=None, region=None):
        """A PNG of the output (or of region = (x, y, width, height)) by
        grim, written to `path`, else to a numbered file in shots/; its path.
        grim writes to its stdout: the test user may not write `path`."""
        if path is None:
            self._shots += 1
            path = self.root / "shots" / f"{self._shots:03}.png"
        geometry = ["-g", "{},{} {}x{}".format(*region)] if region else []
        png = self.run([TOOLS["grim"], *geometry, "-"], text=False)
        Path(path).write_bytes(png)
        return Path(path)

    # -- speech

    def start_speech(self):
        """Starts capturing what is spoken in this desktop (speech.Speech:
        its `log` and `recording`), its processes run as the test user
        here, the recording in speech/ (which the test user can write);
        returns it. Start it before the screen reader, which starts
        speech-dispatcher with the configuration written here."""
        self.speech = speech.Speech(self.env, self.root / "speech", spawn=self.spawn, readable=self.readable).start()
        return self.speech

    # -- guidedaccessd

    def start_daemon(self, binary=DAEMON_BINARY, extra_args=(), timeout=15, without=()):
        """guidedaccessd --user as the test user, in the desktop, on its
        session bus, with self.env: what it starts (Orca) inherits the
        session's WAYLAND_DISPLAY, DISPLAY, XDG_RUNTIME_DIR, HOME,
        XDG_CONFIG_HOME and bus address — but the variables named in
        `without` (a service started by systemd or D-Bus activation may lack
        WAYLAND_DISPLAY and DISPLAY). Returns once it owns its name."""
        binary = Path(binary)
        if not binary.exists():
            raise FileNotFoundError(f"{binary} does not exist: build it with 'swift build' or set GUIDEDACCESSD")
        env = {name: value for name, value in self.env.items() if name not in without}
        daemon = self.spawn("guidedaccessd", [self.readable(binary), "--user", "--address", self.session_address,
                                              "--state-dir", self.root / "state", *extra_args], env=env)
        self.wait_for_name(self.connect(), GA_NAME, daemon, timeout)
        return daemon

    # -- the end

    def stop(self):
        """Kills every process in this desktop's sessions and mount
        namespace and removes its directory; returns the pids still alive
        afterwards (none)."""
        if self not in _LIVE:
            return []
        _LIVE.remove(self)
        for connection in self._connections:
            try:
                connection.close()
            except Exception:
                pass

        def alive():
            pids = set(processes_in_sessions(self.sessions))
            if self.mount_namespace:
                pids.update(processes_in_mount_namespace(self.mount_namespace))
            return sorted(pids)

        kill_all(alive, self.processes.values())
        shutil.rmtree(self.root, ignore_errors=True)
        return alive()
