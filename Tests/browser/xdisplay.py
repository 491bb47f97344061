"""The kiosk as a customer sees it: an X display of the tests' own (Xvfb),
Chromium NON-headless on it through `guidedaccessctl browser` (its DevTools
on a pipe, so no DevTools port to take screenshots through), the screen
taken with ImageMagick's `import -window root`, and the page served over
HTTP on 127.0.0.1 as a real kiosk's is.

    display = Display(root); display.start()      # Xvfb :N, N picked by Xvfb (-displayfd)
    display.screenshot(path)                      # the whole screen, 1280x800
    server = PageServer(directory); server.url("kiosk.html")
    browser = LaunchedBrowser(root, ctl, bus_address, display, url, env)
    browser.start()                               # waits for the page on the screen
    browser.chromium_pid(); browser.launcher_lines(); browser.stop()

Chromium runs as `guidedaccessctl --address BUS browser -- chromium
--no-sandbox --kiosk --ozone-platform=x11 --disable-gpu --no-first-run
--user-data-dir=DIR --window-position=0,0 --window-size=1280,800 ... URL`.
With no window manager, Chromium on X11 makes a window of the screen's own
size one pixel smaller each way (1279x799: measured, innerWidth 1279,
innerHeight 799, and scroll bars for the 1280x800 page); `xdotool
windowsize` gives it the whole screen, as a kiosk's window manager would.

The launcher is the leader of a session of its own (setsid), and every
process of it, Chromium's included, carries GA_BROWSER_TEST=<root> in its
environment (Chromium's crash handlers leave the session): stop() kills
every process in that session or with that mark (chromium.py's way), also
at interpreter exit; the launcher and Xvfb die with the test's process
(PR_SET_PDEATHSIG), and Chromium exits when its pipe closes."""

import atexit
import functools
import http.server
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import images
from chromium import _setup, processes_of
from gnomeshell import kill_all

CTL_BINARY = Path(os.environ.get("GUIDEDACCESSCTL", Path(__file__).resolve().parents[2] / ".build" / "debug"
                                  / "guidedaccessctl"))
XVFB = "/usr/bin/Xvfb"
XDOTOOL = "/usr/bin/xdotool"
IMPORT = "/usr/bin/import"
WIDTH, HEIGHT = images.WIDTH, images.HEIGHT
START_TIMEOUT = 30.0

# What makes Chromium quiet and its screen stable on a bare X display: no
# first-run UI, no translate bubble, no keyring prompt, no GPU (Xvfb has
# none), no background networking or component updates, no "restore
# pages?" bubble after a kill.
CHROMIUM_FLAGS = [
    "--no-sandbox", "--kiosk", "--ozone-platform=x11", "--disable-gpu", "--no-first-run",
    "--window-position=0,0", f"--window-size={WIDTH},{HEIGHT}",
    "--disable-features=Translate,MediaRouter", "--password-store=basic", "--no-default-browser-check",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-crash-restore-bubble", "--noerrdialogs", "--disable-session-crashed-bubble",
]

_LIVE = []  # everything started here and not stopped yet


def missing():
    """What the display tests need that is not here, as words for a skip."""
    what = []
    for path, package in ((XVFB, "xvfb"), (XDOTOOL, "xdotool"), (IMPORT, "imagemagick")):
        if not os.access(path, os.X_OK):
            what.append(f"{path} (apt-get install {package})")
    return what


def _die_with_parent():
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# ---------------------------------------------------------------- Xvfb


class Display:
    """Xvfb :N (N the first free number, Xvfb's pick), one 1280x800x24
    screen, no TCP."""

    def __init__(self, root, width=WIDTH, height=HEIGHT):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.width, self.height = width, height
        self.log_path = self.root / "xvfb.log"
        self.process = None
        self.number = None
        _LIVE.append(self)

    @property
    def name(self):
        return f":{self.number}"

    def start(self, timeout=10.0):
        read, write = os.pipe()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [XVFB, "-displayfd", str(write), "-screen", "0", f"{self.width}x{self.height}x24",
                 "-nolisten", "tcp"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(write,),
                preexec_fn=_die_with_parent)
        os.close(write)
        text = b""
        deadline = time.monotonic() + timeout
        try:
            while not text.endswith(b"\n"):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"Xvfb did not start (exit {self.process.poll()}): "
                                       f"{self.log_path.read_text(errors='replace')[-2000:]}")
                chunk = os.read(read, 64)
                if not chunk:
                    raise RuntimeError(f"Xvfb closed -displayfd: {self.log_path.read_text(errors='replace')[-2000:]}")
                text += chunk
        finally:
            os.close(read)
        self.number = int(text.strip())
        return self

    def env(self):
        return {"DISPLAY": self.name}

    def screenshot(self, path):
        """The whole screen (the root window) as a PNG: what a customer sees."""
        done = subprocess.run([IMPORT, "-display", self.name, "-window", "root", str(path)],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"import -display {self.name} -window root: {done.stderr}")
        return Path(path)

    def colour_at(self, x, y):
        """One pixel of the screen as "#rrggbb", taken the same way (`import
        -window root -crop 1x1+X+Y`), without writing a picture: ~0.07 s
        against ~0.2 s for a whole screenshot and its measurement, for
        timings."""
        done = subprocess.run([IMPORT, "-display", self.name, "-window", "root", "-crop", f"1x1+{x}+{y}",
                               "-depth", "8", "txt:-"], capture_output=True, text=True, timeout=30)
        found = re.search(r"#([0-9A-Fa-f]{6})\b", done.stdout)
        if done.returncode != 0 or not found:
            raise RuntimeError(f"import -crop 1x1+{x}+{y}: {done.stderr or done.stdout}")
        return "#" + found.group(1).lower()

    def xdotool(self, *args):
        done = subprocess.run([XDOTOOL, *map(str, args)], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "DISPLAY": self.name})
        return done.returncode, done.stdout, done.stderr

    def visible_windows(self, class_name="chromium"):
        rc, out, _ = self.xdotool("search", "--onlyvisible", "--class", class_name)
        return [int(w) for w in out.split()] if rc == 0 else []

    def geometry(self, window):
        _, out, _ = self.xdotool("getwindowgeometry", "--shell", window)
        values = dict(line.split("=", 1) for line in out.split() if "=" in line)
        return tuple(int(values.get(k, -1)) for k in ("X", "Y", "WIDTH", "HEIGHT"))

    def stop(self):
        if self in _LIVE:
            _LIVE.remove(self)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


# ---------------------------------------------------------------- the page, over HTTP


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests = None  # a list per server, set in PageServer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        self.requests.append(format % args)


class PageServer:
    """Python's http.server on 127.0.0.1, a port of the kernel's pick, in a
    thread of the test's process, serving `directory`."""

    def __init__(self, directory):
        self.requests = []
        handler = type("Handler", (_QuietHandler,), {"requests": self.requests})
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="page-server", daemon=True)
        self.thread.start()
        _LIVE.append(self)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}/{path}"

    def stop(self):
        if self in _LIVE:
            _LIVE.remove(self)
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


# ---------------------------------------------------------------- the launcher and its Chromium


def parent_of(pid):
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split()[1])


def cmdline(pid):
    """A process's command line as words. Chromium's browser process writes
    its command line over its argv, joined by spaces: split on both."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.replace(b"\0", b" ").decode(errors="replace").split()


class LaunchedBrowser:
    """`guidedaccessctl --address BUS browser -- chromium FLAGS URL` on a
    Display; its stderr (and Chromium's, which inherits it) in
    root/launcher.log."""

    ATTACHED = "guidedaccessctl browser: attached:"
    ATTACHED_AGAIN = "guidedaccessctl browser: attached again:"

    def __init__(self, root, ctl, bus_address, display, url, env, chromium="/usr/bin/chromium", extra_args=()):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.display = display
        self.url = url
        self.mark = f"GA_BROWSER_TEST={self.root}"
        self.argv = [str(ctl), "--address", bus_address, "browser", "--", chromium, *CHROMIUM_FLAGS,
                     f"--user-data-dir={self.root / 'profile'}", *extra_args, url]
        self.env = {**env, **display.env(), "LANG": "C.UTF-8", "GA_BROWSER_TEST": str(self.root)}
        self.log_path = self.root / "launcher.log"
        self._log = open(self.log_path, "ab")
        self.process = None
        self.window = None
        _LIVE.append(self)

    def start(self, timeout=START_TIMEOUT):
        """Starts the launcher; returns once Chromium's window covers the
        screen and the screen shows the whole kiosk page."""
        self._log.write(f"===== {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                        env=self.env, preexec_fn=_setup)
        self.wait_for_page(timeout)
        return self

    def wait_for_page(self, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        shot = self.root / "start.png"
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the launcher exited with {self.process.returncode}\n{self.log()[-3000:]}")
            windows = self.display.visible_windows()
            if windows:
                self.window = windows[0]
                if self.display.geometry(self.window)[2:] != (WIDTH, HEIGHT):
                    self.display.xdotool("windowmove", self.window, 0, 0)
                    self.display.xdotool("windowsize", self.window, WIDTH, HEIGHT)
                else:
                    self.display.screenshot(shot)
                    if page_on_screen(shot):
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the kiosk page was not on the screen within {timeout} s (windows {windows})"
                                   f"\n{self.log()[-3000:]}")
            time.sleep(0.1)

    @property
    def pid(self):
        return self.process.pid

    def chromium_pid(self):
        """Chromium's browser process: the launcher's child (Debian's
        /usr/bin/chromium is a shell script that execs
        /usr/lib/chromium/chromium, in the same process)."""
        found = [pid for pid in self.processes()
                 if parent_of(pid) == self.pid and "--remote-debugging-pipe" in cmdline(pid)]
        return found[0] if found else None

    def processes(self):
        """Every live process of this launcher: it, Chromium's, the crash handlers."""
        sessions = {self.process.pid} if self.process is not None else set()
        return processes_of(sessions, self.mark.encode())

    def chromium_processes(self):
        return [pid for pid in self.processes() if pid != self.pid]

    def log(self):
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def launcher_lines(self):
        return [line for line in self.log().splitlines() if line.startswith("guidedaccessctl")]

    def count(self, prefix):
        return sum(line.startswith(prefix) for line in self.launcher_lines())

    def wait_line(self, prefix, count=1, timeout=10.0):
        """Reads the log every 10 ms until `count` of the launcher's lines
        start with `prefix`; returns the monotonic time it saw the last, or
        None after `timeout`."""
        deadline = time.monotonic() + timeout
        while self.count(prefix) < count:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return time.monotonic()

    def wait_exit(self, timeout):
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        """Kills every process of it; returns the pids still alive afterwards (none)."""
        if self in _LIVE:
            _LIVE.remove(self)
        if self.process is not None:
            kill_all(self.processes, [self.process])
        self._log.close()
        return self.processes() if self.process is not None else []


def page_on_screen(shot):
    """Whether the screen shows the kiosk page, all of it and only it: the
    yellow block reaches the right edge, the strip the bottom right corner
    (no scroll bars, no window smaller than the screen), the box is in
    place."""
    return (images.colour_at(shot, WIDTH - 1, 100) == "#fdd835"
            and images.colour_at(shot, WIDTH - 1, HEIGHT - 1) == "#eeeeee"
            and images.colour_at(shot, 140, 290) == images.BOX_COLOUR)


def listening_tcp():
    """`ss -ltnpH`: [(local address, {pid, ...}, line)] of every listening TCP socket."""
    done = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30)
    found = []
    for line in done.stdout.splitlines():
        fields = line.split()
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        found.append((fields[3] if len(fields) > 3 else "?", pids, line))
    return found


def wakeups(pid):
    """Context switches (voluntary + involuntary) of each thread of `pid`,
    {thread: count} (Tests/integration/test_ga_browser_faults.py counts
    them the same way)."""
    counts = {}
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            counts[status.parent.name] = sum(
                int(line.split()[1]) for line in status.read_text().splitlines() if "ctxt_switches" in line)
        except OSError:
            pass
    return counts


def woken(before, after):
    """How many times the threads were switched to between two wakeups()."""
    return sum(count - before.get(thread, 0) for thread, count in after.items())


@atexit.register
def _stop_all():
    for thing in reversed(list(_LIVE)):
        try:
            thing.stop()
        except Exception:
            pass
