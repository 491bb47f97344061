"""A real GNOME Shell, headless, for the desktop tests.

Desktop starts, in a private directory /var/tmp/ga-desk-XXXX:
- a private *system* bus: gnome-shell 43 insists on one (it sees
  /run/systemd/seats and wants logind); empty, with an allow-all policy
  (without receive_sender the replies are dropped and the shell dies);
- a private *session* bus that D-Bus-activates services from
  /usr/share/dbus-1/services (dconf-service, and what the shell asks for);
- `gnome-shell --headless --virtual-monitor 1280x800 --wayland --no-x11` with
  its own HOME, XDG_CONFIG_HOME (so its own dconf database) and
  XDG_RUNTIME_DIR;
- guidedaccessd --user on the same session bus, with the same environment,
  so the keys it writes are the keys the shell reads;
and takes screenshots through org.gnome.Shell.Screenshot, which answers only
callers owning an allow-listed name: this module's connection owns
org.gnome.Screenshot.

Desktop(xwayland=True) runs the shell with Xwayland (no --no-x11), for
clients that need an X display: Orca 43 runs `xkbcomp $DISPLAY` at start-up
and dies without one. Xwayland refuses a /tmp/.X11-unix that is not mode
1777, and mutter creates it 1755 (and leaves it behind), so that desktop
lives in a mount namespace of its own with a private tmpfs on /tmp holding a
/tmp/.X11-unix of mode 1777: a holder process (`unshare --mount`) keeps the
namespace alive, and every process of the desktop joins it (setns) before it
starts. That is why the directory is under /var/tmp: it must be the same
directory inside and outside. Once the shell runs, `env` has DISPLAY and
XAUTHORITY for that Xwayland beside WAYLAND_DISPLAY, so what is spawned
later (guidedaccessd, and the Orca it starts) finds the displays.

Desktop(accessibility=True) leaves NO_AT_BRIDGE unset: GTK and the shell
then register with the AT-SPI bus (org.a11y.Bus, activated from the session
bus), which a screen reader needs. The screenshot test sets NO_AT_BRIDGE=1
so that no AT-SPI bus starts for nothing.

press() gives the headless seat a keyboard (a RemoteDesktop session of
mutter's) and presses keys: without one no window ever becomes active, so
GTK sends no focus events. show_window() starts gtk_button.py. spawn() is
also what speech.Speech takes to run its sound server in this desktop:
    desk = Desktop(xwayland=True, accessibility=True)
    capture = speech.Speech(desk.env, desk.root / "speech", spawn=desk.spawn)
    desk.start_shell(); capture.start(); desk.start_daemon()

Every process is started as the leader of a session of its own (setsid);
stop() stops and kills every process in those sessions (so also whatever the
buses activated and whatever those started) and in the private mount
namespace (so also what daemonized, like speech-dispatcher), then removes
the directory. It also runs at interpreter exit, and the leaders die with
their parent (PR_SET_PDEATHSIG).

Images are measured with ImageMagick from /usr/bin (convert, compare).
The recipes: ../shared/notes/real-systems.md, sections 1 and 3."""

import atexit
import colorsys
import ctypes
import os
import re
import shutil
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
DAEMON_BINARY = Path(os.environ.get("GUIDEDACCESSD", REPO_ROOT / ".build" / "debug" / "guidedaccessd"))
CTL_BINARY = Path(os.environ.get("GUIDEDACCESSCTL", DAEMON_BINARY.parent / "guidedaccessctl"))


def doctor_agrees(report_json, supported_property):
    """`guidedaccessctl doctor --json`'s features against the service's
    SupportedFeatures as gdbus prints it: the doctor says what the desktop
    tests prove. Returns the report."""
    import json
    report = json.loads(report_json)
    said = {name for name, feature in report["features"].items() if feature["supported"]}
    shown = set(re.findall(r"'([a-z-]+)'", supported_property))
    assert said == shown, f"doctor: {sorted(said)}; SupportedFeatures: {sorted(shown)}"
    for name, feature in report["features"].items():
        assert feature["supported"] or feature["reason"].startswith(f"{name}: "), feature
    return report

WIDTH, HEIGHT = 1280, 800
TOP_BAR = 32  # height of the shell's top bar at scale 1
# The clock (and the do-not-disturb bell next to it) in the middle of the top
# bar: it ticks every minute, so comparisons of whole screens leave it out.
CLOCK = (520, 0, 240, TOP_BAR)  # x, y, w, h
BODY = (0, TOP_BAR, WIDTH, HEIGHT - TOP_BAR)  # the wallpaper under the top bar
ACTIVITIES = (0, 0, 120, TOP_BAR)  # the "Activities" button's label

GA_NAME = "org.guidedaccess.GuidedAccess1"
GA_PATH = "/org/guidedaccess/GuidedAccess1"
GA_IFACE = "org.guidedaccess.GuidedAccess1"
GA_ERROR = "org.guidedaccess.GuidedAccess1.Error."
REMOTE_DESKTOP_SESSION = "org.gnome.Mutter.RemoteDesktop.Session"

TOOLS = {name: f"/usr/bin/{name}" for name in (
    "gnome-shell", "dbus-daemon", "convert", "compare", "gsettings", "unshare", "python3")}
SCREEN_READER_TOOLS = ("/usr/bin/Xwayland", "/usr/bin/xkbcomp", "/usr/bin/orca", "/usr/libexec/at-spi-bus-launcher")
GTK_BUTTON = HERE / "gtk_button.py"

# X keysyms for press()
KEY_TAB = 0xff09
KEY_SHIFT = 0xffe1
KEY_RETURN = 0xff0d

def namespace_holder(tmpfs_name):
    """The script of the holder of a desktop's mount namespace: a private
    /tmp whose .X11-unix Xwayland accepts; "ready" once it is mounted. A
    checkout under /tmp (a clone there) is bound into the private /tmp at
    its own path — the holder's working directory keeps the host's — so that
    its scripts and programs (gtk_button.py, .build, .venv) stay visible."""
    repo = str(REPO_ROOT)
    before = after = ""
    if repo.startswith("/tmp/"):
        quoted = shlex.quote(repo)
        before = f"cd {quoted} && "
        # --no-canonicalize: "." is the working directory itself, not its path, which is the new /tmp's.
        after = f" && mkdir -p {quoted} && mount --no-canonicalize --bind . {quoted} && cd /"
    return (f"{before}mount -t tmpfs -o mode=1777,nosuid,nodev {tmpfs_name} /tmp && mkdir -m 1777 /tmp/.X11-unix"
            f"{after} && echo ready && exec sleep infinity")


NAMESPACE_HOLDER = namespace_holder("tmpfs")
CLONE_NEWNS = 0x00020000

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>{type}</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  {servicedir}
  <policy context="default">
    <allow user="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


def missing_tools(screen_reader=False):
    """The programs this needs that are not installed (with
    `screen_reader`: also those a desktop with Xwayland, accessibility and
    Orca needs)."""
    paths = [*TOOLS.values(), *(SCREEN_READER_TOOLS if screen_reader else ())]
    return [path for path in paths if not os.access(path, os.X_OK)]


# ---------------------------------------------------------------- processes


_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _child_setup(namespace):
    """What a child runs before exec: join the desktop's mount namespace
    (an open /proc/PID/ns/mnt, or None) and die with its parent."""
    def setup():
        if namespace is not None and _LIBC.setns(namespace, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns to the desktop's mount namespace")
        die_with_parent()
    return setup


def session_and_state(pid):
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # state ppid pgrp session ...
    return int(fields[3]), fields[0]


def processes_in_sessions(sessions):
    """Live (not zombie) pids whose session id is one of `sessions`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = session_and_state(int(entry))
            if info and info[0] in sessions and info[1] != "Z":
                found.append(int(entry))
    return found


def processes_in_mount_namespace(namespace):
    """Live pids in the mount namespace `namespace` (a readlink of
    /proc/PID/ns/mnt, e.g. 'mnt:[4026532500]')."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") != namespace:
                    continue
            except OSError:
                continue
            info = session_and_state(int(entry))
            if info and info[1] != "Z":
                found.append(int(entry))
    return found


def kill_all(find, children):
    """Kills the pids find() returns until it returns none (50 rounds at
    most), reaping the Popen `children`; each round stops them all first,
    so that none starts another while they are killed."""
    for _ in range(50):
        pids = find()
        if not pids:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        for process in children:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        time.sleep(0.02)


def wait_for_name(connection, name, process, timeout):
    """Waits until `name` has an owner on the bus; an error naming it when
    `process` (which should take it) exits first or it takes too long."""
    deadline = time.monotonic() + timeout
    while not connection.name_has_owner(name):
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode} before {name} appeared")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} did not appear within {timeout} s")
        time.sleep(0.05)


_LIVE = []  # every Desktop not stopped yet


@atexit.register
def _stop_all():
    for desktop in list(_LIVE):
        desktop.stop()


class Desktop:
    """One headless GNOME Shell on private buses (see the module's
    docstring). `env` is the environment of everything it starts."""

    def __init__(self, xwayland=False, accessibility=False):
        self.root = Path(tempfile.mkdtemp(prefix="/var/tmp/ga-desk-"))
        _LIVE.append(self)
        for name in ("home", "config", "cache", "runtime", "state", "shots"):
            (self.root / name).mkdir(mode=0o700)
        self.xwayland = xwayland
        self.processes = {}  # name -> Popen; each leads a session of its own
        self._output_start = {}  # name -> where its output begins in NAME.log
        self.sessions = set()
        self.namespace = None  # 'mnt:[…]' of the private mount namespace
        self._namespace_fd = None
        self.private_tmp = None  # its /tmp, seen from outside
        self._connections = []
        self._keyboard = None
        self._shots = 0
        self.env = {
            "HOME": str(self.root / "home"),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_CACHE_HOME": str(self.root / "cache"),
            "XDG_RUNTIME_DIR": str(self.root / "runtime"),
            "XDG_STATE_HOME": str(self.root / "home" / ".local" / "state"),
            "XDG_DATA_DIRS": "/usr/local/share:/usr/share",
            "GSETTINGS_BACKEND": "dconf",
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
        }
        if not accessibility:
            self.env["NO_AT_BRIDGE"] = "1"
        if xwayland:
            self._make_namespace()
        self.system_address = self._start_bus("system")
        self.session_address = self._start_bus("session")
        self.env["DBUS_SYSTEM_BUS_ADDRESS"] = self.system_address
        self.env["DBUS_SESSION_BUS_ADDRESS"] = self.session_address

    def log(self, name):
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self):
        return [(f"{name} (pid {process.pid}) output", self.log(name)) for name, process in self.processes.items()]

    def spawn(self, name, argv, stdout=None, env=None):
        """Starts a process of this desktop: with `env` (self.env unless
        given), in its mount namespace, leading a session of its own, its
        output (and stdout unless given) appended to NAME.log."""
        with open(self.root / f"{name}.log", "ab") as log:
            self._output_start[name] = log.tell()
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=stdout or log, stderr=log,
                env=self.env if env is None else env,
                start_new_session=True, preexec_fn=_child_setup(self._namespace_fd))
        self.processes[name] = process
        self.sessions.add(process.pid)
        return process

    def wait_for_output(self, name, text, timeout=30):
        """Waits until `text` is in the output of the process `name` (the
        last one started under that name)."""
        process = self.processes[name]
        deadline = time.monotonic() + timeout
        path, wanted = self.root / f"{name}.log", text.encode()
        while wanted not in path.read_bytes()[self._output_start[name]:]:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode} before it printed {text!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not print {text!r} within {timeout} s")
            time.sleep(0.05)

    def _make_namespace(self):
        """The private mount namespace, kept by a holder process."""
        with open(self.root / "namespace.log", "ab") as log:
            holder = subprocess.Popen(
                [TOOLS["unshare"], "--mount", "--propagation", "private", "/bin/sh", "-c", NAMESPACE_HOLDER],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                preexec_fn=die_with_parent)
        self.processes["namespace"] = holder
        self.sessions.add(holder.pid)
        ready = holder.stdout.readline()
        holder.stdout.close()
        if ready != b"ready\n":
            raise RuntimeError(f"the mount namespace did not come up: {self.log('namespace')}")
        self.namespace = os.readlink(f"/proc/{holder.pid}/ns/mnt")
        self._namespace_fd = os.open(f"/proc/{holder.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        self.private_tmp = Path(f"/proc/{holder.pid}/root/tmp")

    def _start_bus(self, kind):
        name = f"{kind}-bus"
        socket = self.root / f"{name}.sock"
        servicedir = "<servicedir>/usr/share/dbus-1/services</servicedir>" if kind == "session" else ""
        config = self.root / f"{name}.conf"
        config.write_text(BUS_CONFIG.format(type=kind, socket=socket, servicedir=servicedir))
        process = self.spawn(name, [TOOLS["dbus-daemon"], f"--config-file={config}", "--nofork", "--nopidfile",
                                    "--print-address=1"], stdout=subprocess.PIPE)
        line = process.stdout.readline().decode()
        process.stdout.close()
        if not line.startswith(f"unix:path={socket}"):
            raise RuntimeError(f"the {kind} dbus-daemon did not start: {line!r} {self.log(name)}")
        return f"unix:path={socket}"

    # -- clients in this environment

    def run(self, argv, timeout=15, check=True):
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, env=self.env, preexec_fn=_child_setup(self._namespace_fd))
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, argv))}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def gsettings_set(self, schema, key, value):
        self.run([TOOLS["gsettings"], "set", schema, key, value])

    def connect(self):
        """A dbus-python connection to the session bus."""
        import dbus.bus

        connection = dbus.bus.BusConnection(self.session_address)
        self._connections.append(connection)
        return connection

    wait_for_name = staticmethod(wait_for_name)

    # -- gnome-shell

    def start_shell(self, timeout=60):
        """Starts gnome-shell and waits for its D-Bus names; then `env` has
        WAYLAND_DISPLAY (and, with Xwayland, DISPLAY and XAUTHORITY)."""
        argv = [TOOLS["gnome-shell"], "--headless", "--virtual-monitor", f"{WIDTH}x{HEIGHT}", "--wayland"]
        shell = self.spawn("gnome-shell", argv if self.xwayland else [*argv, "--no-x11"])
        self.bus = self.connect()
        self.wait_for_name(self.bus, "org.gnome.Shell", shell, timeout)
        self.wait_for_name(self.bus, "org.gnome.Shell.Screenshot", shell, timeout)
        self.bus.request_name("org.gnome.Screenshot")
        self.shell_object = self.bus.get_object("org.gnome.Shell", "/org/gnome/Shell", introspect=False)
        self.shooter = self.bus.get_object("org.gnome.Shell.Screenshot", "/org/gnome/Shell/Screenshot",
                                           introspect=False)
        runtime = Path(self.env["XDG_RUNTIME_DIR"])
        sockets = sorted(path.name for path in runtime.glob("wayland-*") if path.is_socket())
        if not sockets:
            raise RuntimeError(f"gnome-shell made no Wayland socket in {runtime}")
        self.env["WAYLAND_DISPLAY"] = sockets[0]
        if self.xwayland:
            self.env.update(self._x_display())

    def _x_display(self):
        """DISPLAY and XAUTHORITY of the shell's Xwayland. mutter, not
        being in a GNOME session, can tell nobody, but the private /tmp has
        only its sockets; the lowest is the public display (mutter keeps
        the next for itself), and its cookie is in XDG_RUNTIME_DIR."""
        displays = sorted(int(path.name[1:]) for path in (self.private_tmp / ".X11-unix").glob("X*")
                          if path.name[1:].isdigit())
        cookies = sorted(Path(self.env["XDG_RUNTIME_DIR"]).glob(".mutter-Xwaylandauth.*"))
        if not displays or len(cookies) != 1:
            raise RuntimeError(f"gnome-shell's Xwayland: X sockets {displays}, cookies {cookies}")
        return {"DISPLAY": f":{displays[0]}", "XAUTHORITY": str(cookies[0])}

    def overview_active(self):
        return bool(self.shell_object.Get("org.gnome.Shell", "OverviewActive",
                                          dbus_interface="org.freedesktop.DBus.Properties"))

    def close_overview(self, timeout=30):
        """The shell starts in the overview once its start-up animation is
        done; waits for that, then closes it."""
        import dbus

        deadline = time.monotonic() + timeout
        while not self.overview_active():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the shell did not show its overview within {timeout} s")
            time.sleep(0.05)
        self.shell_object.Set("org.gnome.Shell", "OverviewActive", dbus.Boolean(False), signature="ssv",
                              dbus_interface="org.freedesktop.DBus.Properties")
        while self.overview_active():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the overview did not close within {timeout} s")
            time.sleep(0.05)

    def screenshot(self):
        """The whole screen, without the pointer, as a Shot."""
        self._shots += 1
        path = self.root / "shots" / f"{self._shots:03}.png"
        started = time.monotonic()
        ok, used = self.shooter.Screenshot(False, False, str(path), dbus_interface="org.gnome.Shell.Screenshot",
                                           timeout=15)
        if not ok:
            raise RuntimeError(f"org.gnome.Shell.Screenshot could not write {path}")
        return Shot(Path(str(used)), started)

    def settle(self, done=lambda shot: True, stable_for=0.5, timeout=10.0):
        """Screenshots until the screen has stayed the same for `stable_for`
        seconds and done(shot) holds (transitions pass through single black
        or half-drawn frames); returns that shot, or after `timeout` the last
        one (the caller's assertions then report what it shows)."""
        deadline = time.monotonic() + timeout
        first = last = self.screenshot()
        while True:
            if time.monotonic() > deadline:
                return last
            time.sleep(0.05)
            shot = self.screenshot()
            if not shot.same(last):
                first = shot
            last = shot
            if shot.taken - first.taken >= stable_for and done(shot):
                return shot

    def unchanged_for(self, reference, seconds):
        """Screenshots for `seconds`; the shots that differ from `reference`."""
        deadline = time.monotonic() + seconds
        differing = []
        while time.monotonic() < deadline:
            shot = self.screenshot()
            if not shot.same(reference):
                differing.append(shot)
            time.sleep(0.1)
        return differing

    # -- input and windows

    def press(self, *keysyms):
        """Presses keys one after the other and releases them in reverse
        order: press(KEY_SHIFT, KEY_TAB) is Shift+Tab. The keys come from a
        virtual keyboard of a RemoteDesktop session of mutter's, made at the
        first press and kept (it ends with this connection). The first key
        event, not the keyboard's arrival, makes the focused window active;
        Orca then says "Kiosk frame." about 1 s later (measured). A modifier
        pressed alone is echoed ("left shift")."""
        import dbus

        if self._keyboard is None:
            remote = self.bus.get_object("org.gnome.Mutter.RemoteDesktop", "/org/gnome/Mutter/RemoteDesktop",
                                         introspect=False)
            path = remote.CreateSession(dbus_interface="org.gnome.Mutter.RemoteDesktop")
            session = self.bus.get_object("org.gnome.Mutter.RemoteDesktop", path, introspect=False)
            session.Start(dbus_interface=REMOTE_DESKTOP_SESSION)
            self._keyboard = session
        notify = self._keyboard.get_dbus_method("NotifyKeyboardKeysym", REMOTE_DESKTOP_SESSION)
        for keysym in keysyms:
            notify(dbus.UInt32(keysym), True)
        for keysym in reversed(keysyms):
            notify(dbus.UInt32(keysym), False)

    def show_window(self, title="Kiosk", label="Order now", timeout=30):
        """Starts gtk_button.py as `gtk-button`: a GTK 3 window `title`
        with one focused button `label`; returns once it is mapped. Its
        output says when it becomes active and when the button gets the
        focus (wait_for_output("gtk-button", "active"))."""
        process = self.spawn("gtk-button", [TOOLS["python3"], str(GTK_BUTTON), title, label])
        self.wait_for_output("gtk-button", "mapped", timeout)
        return process

    # -- guidedaccessd

    def start_daemon(self, extra_args=(), timeout=15, without=()):
        """guidedaccessd --user on the session bus, with `env` (after
        start_shell: the displays too, which the Orca it starts inherits)
        but the variables named in `without` (a service started by systemd
        or D-Bus activation may lack WAYLAND_DISPLAY, DISPLAY, XAUTHORITY)."""
        if not DAEMON_BINARY.exists():
            raise FileNotFoundError(
                f"{DAEMON_BINARY} does not exist: build it with 'swift build' or set GUIDEDACCESSD")
        env = {name: value for name, value in self.env.items() if name not in without}
        daemon = self.spawn("guidedaccessd", [str(DAEMON_BINARY), "--user", "--address", self.session_address,
                                              "--state-dir", str(self.root / "state"), *extra_args], env=env)
        self.wait_for_name(self.bus, GA_NAME, daemon, timeout)
        return daemon

    # -- the end

    def _processes(self):
        pids = set(processes_in_sessions(self.sessions))
        if self.namespace is not None:
            pids.update(processes_in_mount_namespace(self.namespace))
        return sorted(pids)

    def stop(self):
        """Kills every process in this desktop's sessions and mount
        namespace and removes its directory; returns the pids still alive
        afterwards (none). The namespace, and its /tmp, go with its last
        process."""
        if self not in _LIVE:
            return []
        _LIVE.remove(self)
        for connection in self._connections:
            try:
                connection.close()
            except Exception:
                pass
        kill_all(self._processes, self.processes.values())
        if self._namespace_fd is not None:
            os.close(self._namespace_fd)
            self._namespace_fd = None
        shutil.rmtree(self.root, ignore_errors=True)
        return self._processes()


# ---------------------------------------------------------------- images (ImageMagick)


def magick(tool, *args, check=True, binary=False):
    """An ImageMagick tool (convert, compare, identify, montage) from /usr/bin;
    also the browser suite's (Tests/browser/images.py)."""
    done = subprocess.run([f"/usr/bin/{tool}", *map(str, args)], capture_output=True, text=not binary, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(map(str, args))}: {done.stderr}")
    return done


def crop(region):
    x, y, w, h = region
    return ["-crop", f"{w}x{h}+{x}+{y}", "+repage"]


def masked(path):
    """The image with the clock painted black, as raw RGB bytes."""
    x, y, w, h = CLOCK
    return magick("convert", path, "-fill", "black", "-draw", f"rectangle {x},{y} {x + w - 1},{y + h - 1}",
                  "-depth", "8", "rgb:-", binary=True).stdout


class Shot:
    """One screenshot; compared with others with the clock left out."""

    def __init__(self, path, taken):
        self.path = path
        self.taken = taken
        self._masked = None

    @property
    def pixels(self):
        if self._masked is None:
            self._masked = masked(self.path)
        return self._masked

    def same(self, other):
        return self.pixels == other.pixels

    def fx(self, expression, region, *operations):
        """An ImageMagick fx expression over a region, after `operations`."""
        done = magick("convert", self.path, *crop(region), *operations, "-format", f"%[fx:{expression}]", "info:")
        return float(done.stdout.strip())

    def lightness(self, region=BODY):
        """Mean HSL lightness, 0…1."""
        return self.fx("mean", region, "-colorspace", "HSL", "-channel", "B", "-separate")

    def saturation(self, region=BODY):
        """Mean HSL saturation, 0…1."""
        return self.fx("mean", region, "-colorspace", "HSL", "-channel", "G", "-separate")

    def brightest(self, region):
        """The brightest gray level in a region, 0…1."""
        return self.fx("maxima", region, "-colorspace", "Gray")

    def masked_file(self):
        out = self.path.with_suffix(".masked.png")
        if not out.exists():
            x, y, w, h = CLOCK
            magick("convert", self.path, "-fill", "black",
                   "-draw", f"rectangle {x},{y} {x + w - 1},{y + h - 1}", out)
        return out

    def region_file(self, region, scale=None):
        """A region of the shot (the clock left out), resized to `scale`
        (an ImageMagick geometry) if given."""
        x, y, w, h = region
        out = self.path.with_suffix(f".{w}x{h}+{x}+{y}{'-scaled' if scale else ''}.png")
        if not out.exists():
            magick("convert", self.masked_file(), *crop(region), *(["-resize", scale] if scale else []), out)
        return out


def compare(metric, a, b):
    """ImageMagick `compare -metric METRIC a b`: AE → pixels that differ,
    RMSE → normalized root-mean-square error 0…1."""
    done = magick("compare", "-metric", metric, a, b, "null:", check=False)
    if done.returncode not in (0, 1):  # 0 same, 1 different, 2 error
        raise RuntimeError(f"compare {a} {b}: {done.stderr.strip()}")
    text = done.stderr.strip()
    if metric == "RMSE":
        return float(text.split("(")[1].rstrip(")"))
    return int(float(text.split()[0]))


def changed_pixels(a, b, region=None):
    """Pixels that differ between two shots (the clock left out), in a region
    or on the whole screen."""
    if region is None:
        return compare("AE", a.masked_file(), b.masked_file())
    return compare("AE", a.region_file(region), b.region_file(region))


def write_wallpaper(path):
    """Known content for the screen: 80-pixel tiles of saturated colours,
    hue from left to right, dark (lightness 0.15 to 0.42) from top to bottom,
    so that inverting raises the mean lightness a lot and grayscale takes a
    lot of saturation away; dark grid lines give zoom edges to magnify."""
    tile = 80
    columns, rows = WIDTH // tile, HEIGHT // tile
    colours = [[bytes(int(c * 255) for c in colorsys.hls_to_rgb(col / columns, 0.15 + 0.3 * row / rows, 0.85))
                for col in range(columns)] for row in range(rows)]
    line = b"\x10\x10\x10"
    data = bytearray()
    for y in range(HEIGHT):
        if y % tile < 4:
            data += line * WIDTH
            continue
        row = b"".join(line * 4 + colour * (tile - 4) for colour in colours[y // tile])
        data += row
    ppm = path.with_suffix(".ppm")
    ppm.write_bytes(b"P6 %d %d 255\n" % (WIDTH, HEIGHT) + bytes(data))
    magick("convert", ppm, path)
    ppm.unlink()


def write_picture(shot, path, width=640):
    """A small PNG of a shot for the documentation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    magick("convert", shot.path, "-resize", f"{width}x", "-strip", "-define", "png:compression-level=9", path)
    return path
