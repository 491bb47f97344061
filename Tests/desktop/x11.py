"""A bare X11 kiosk, for desktop tests of guidedaccessd on X without a
desktop environment (Desktop property "x11"): Xvfb with GLX, matchbox as
the kiosk's window manager (no title bar: the app's window fills the
screen), the kiosk's GTK window (gtk_button.py), screenshots by ImageMagick's
`import -window root`, and speech capture (speech.py) for the screen reader
guidedaccessd starts.

It is sway.Desktop with X in place of sway, so everything runs as the same
non-root test user (sway.TEST_USER), in the same kind of private mount
namespace (a tmpfs on /tmp with /tmp/.X11-unix 1777), on a private session
bus, in /var/tmp/ga-sway-XXXX (sway.Desktop's directory). start_x() starts

    Xvfb :73 -screen 0 800x600x24 +extension GLX -nolisten tcp -nolisten local -noreset -auth FILE
    matchbox-window-manager -use_titlebar no

(-noreset: an X server resets when its last client leaves, and a client
connecting meanwhile is turned away; seen here as matchbox's "can't open
display" after the xdpyinfo that waits for the server had left.)

The display's socket, /tmp/.X11-unix/X73, and its lock file exist only in
that namespace's /tmp, and `-nolisten local` leaves out the abstract socket
(@/tmp/.X11-unix/X73, which would be in the host's network namespace): no
process outside the desktop (another test stage's guidedaccessd looking for
an X server) can see or reach this display, and nothing of it outlives
stop(). No other test uses display 73 (the browser tests' Xvfb picks the
first free number, sway's Xwayland the first in its own /tmp); here it could
not collide anyway.

FILE (serverauth, in the desktop's directory) holds one MIT-MAGIC-COOKIE-1
for any address, as startx's ~/.serverauth.NNN does; there is no
~/.Xauthority, so a client finds the cookie only through XAUTHORITY=FILE,
and a guidedaccessd given no display variables only through Xvfb's -auth
argument. `env` gets DISPLAY and XAUTHORITY (what the kiosk's own clients,
and this module's, use), and the session bus's activation environment too
(as Debian's Xsession does); start_daemon() leaves DISPLAY, XAUTHORITY and
WAYLAND_DISPLAY out of the service's environment unless told otherwise, as
a service started by systemd or D-Bus activation has them.

stop() (sway.Desktop's) kills every process of the desktop: those it
started, and whatever they started in its mount namespace (the picom and
Orca guidedaccessd starts, also after guidedaccessd was killed), so the
namespace, its /tmp and the X socket go with them; then it checks that
nothing is left: no process, no abstract X socket, no X socket in the
host's /tmp/.X11-unix.

X is asked with x11-utils (xdpyinfo, xprop) and, for a selection's owner,
libX11 through ctypes in a python3 run as the test user."""

import os
import struct
import subprocess
import time
from pathlib import Path

import gnomeshell
import sway

DISPLAY_NUMBER = 73
WIDTH, HEIGHT = 800, 600

TOOLS = {name: path for name, path in (
    ("Xvfb", "/usr/bin/Xvfb"), ("matchbox-window-manager", "/usr/bin/matchbox-window-manager"),
    ("picom", "/usr/bin/picom"), ("xdpyinfo", "/usr/bin/xdpyinfo"), ("xprop", "/usr/bin/xprop"),
    ("import", "/usr/bin/import"), ("convert", "/usr/bin/convert"), ("compare", "/usr/bin/compare"),
    ("xkbcomp", "/usr/bin/xkbcomp"), ("dbus-daemon", "/usr/bin/dbus-daemon"),
    ("dbus-update-activation-environment", "/usr/bin/dbus-update-activation-environment"),
    ("gsettings", "/usr/bin/gsettings"), ("dconf", "/usr/bin/dconf"), ("python3", "/usr/bin/python3"),
    ("unshare", "/usr/bin/unshare"), ("nsenter", "/usr/bin/nsenter"), ("setpriv", "/usr/bin/setpriv"),
    ("useradd", "/usr/sbin/useradd"))}
XSETTINGSD = "/usr/bin/xsettingsd"

# The kiosk app's own look for the colour tests: saturated hues from left to
# right, darker towards the bottom (a GTK user stylesheet under the
# window's content), so that inverting moves the mean lightness far from
# itself and grayscale takes much saturation away.
COLOURFUL_CSS = """\
window {
  background-image: linear-gradient(to bottom, rgba(0, 0, 0, 0.1), rgba(0, 0, 0, 0.7)),
                    linear-gradient(to right, #e01b24, #f6d32d, #33d17a, #33c7de, #3584e4, #c061cb);
}
"""

# The owner of a selection (e.g. _NET_WM_CM_S0: the compositing manager),
# printed as a number (0: none); run as the test user with the desktop's env.
SELECTION_OWNER = """\
import ctypes, sys
x = ctypes.CDLL("libX11.so.6")
x.XOpenDisplay.restype = ctypes.c_void_p
x.XOpenDisplay.argtypes = [ctypes.c_char_p]
x.XInternAtom.restype = ctypes.c_ulong
x.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
x.XGetSelectionOwner.restype = ctypes.c_ulong
x.XGetSelectionOwner.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
display = x.XOpenDisplay(None)
if not display:
    sys.exit("cannot open the display")
print(x.XGetSelectionOwner(display, x.XInternAtom(display, sys.argv[1].encode(), 0)))
"""


def missing_tools(xsettings=False):
    """The programs this needs that are not installed (and, when not root,
    the root this needs)."""
    paths = [*TOOLS.values(), *([XSETTINGSD] if xsettings else [])]
    missing = [path for path in paths if not os.access(path, os.X_OK)]
    return missing + ([] if os.geteuid() == 0 else ["root (to create the test user and a mount namespace)"])


def xauthority_entry(display_number, cookie):
    """One entry of an Xauthority file: family Wild (any address), the
    display's number, MIT-MAGIC-COOKIE-1 and the cookie."""
    def counted(data):
        return struct.pack(">H", len(data)) + data
    return (struct.pack(">H", 0xFFFF) + counted(b"") + counted(str(display_number).encode())
            + counted(b"MIT-MAGIC-COOKIE-1") + counted(cookie))


def abstract_x_sockets(number):
    """Listening abstract sockets of display `number` in this network
    namespace (/proc/net/unix)."""
    name = f"@/tmp/.X11-unix/X{number}"
    with open("/proc/net/unix") as table:
        return [line for line in table.read().splitlines()[1:] if line.split()[-1:] == [name]]


class Desktop(sway.Desktop):
    """One bare X display run as the test user (see the module's
    docstring). `env` is the environment of everything it starts; it has
    DISPLAY and XAUTHORITY once start_x() has run."""

    def __init__(self, display_number=DISPLAY_NUMBER):
        super().__init__()
        self.display_number = display_number
        self.display = f":{display_number}"
        self.xauthority = None

    # -- X

    @property
    def private_tmp(self):
        """The desktop's /tmp, seen from outside its mount namespace."""
        return Path(f"/proc/{self.holder.pid}/root/tmp")

    @property
    def x_socket(self):
        return self.private_tmp / ".X11-unix" / f"X{self.display_number}"

    def start_x(self, auth=True, window_manager=True, timeout=30):
        """Starts Xvfb (with `auth`: with an -auth file) and waits until it
        answers and has GLX, then matchbox (unless not `window_manager`)
        and waits until it manages the screen. Adds DISPLAY and XAUTHORITY
        to `env` and to the session bus's activation environment."""
        deadline = time.monotonic() + timeout
        argv = [TOOLS["Xvfb"], self.display, "-screen", "0", f"{WIDTH}x{HEIGHT}x24", "+extension", "GLX",
                "-nolisten", "tcp", "-nolisten", "local", "-noreset"]
        if auth:
            self.xauthority = self.root / "serverauth"
            self.xauthority.write_bytes(xauthority_entry(self.display_number, os.urandom(16)))
            os.chmod(self.xauthority, 0o600)
            os.chown(self.xauthority, self.user.pw_uid, self.user.pw_gid)
            argv += ["-auth", self.xauthority]
            self.env["XAUTHORITY"] = str(self.xauthority)
        self.env["DISPLAY"] = self.display
        xvfb = self.spawn("Xvfb", argv)
        while True:
            if xvfb.poll() is not None:
                raise RuntimeError(f"Xvfb exited with {xvfb.returncode}: {self.log('Xvfb')[-3000:]}")
            if self.x_socket.is_socket():
                done = subprocess.run(self.as_user([TOOLS["xdpyinfo"], "-queryExtensions"]), env=self.env,
                                      capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
                if done.returncode == 0:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Xvfb did not answer on {self.display} within {timeout} s: "
                                   f"{self.log('Xvfb')[-3000:]}")
            time.sleep(0.05)
        if "GLX" not in done.stdout:
            raise RuntimeError(f"Xvfb has no GLX extension: {done.stdout[-3000:]}")
        self.run([TOOLS["dbus-update-activation-environment"], "DISPLAY", *(["XAUTHORITY"] if auth else [])])
        if window_manager:
            self.start_window_manager(timeout=max(1.0, deadline - time.monotonic()))
        return xvfb

    def start_window_manager(self, timeout=30):
        """matchbox-window-manager -use_titlebar no, once it has said on the
        root window that it manages the screen (_NET_SUPPORTING_WM_CHECK)."""
        matchbox = self.spawn("matchbox", [TOOLS["matchbox-window-manager"], "-use_titlebar", "no"])
        deadline = time.monotonic() + timeout
        while "window id #" not in self.run([TOOLS["xprop"], "-root", "_NET_SUPPORTING_WM_CHECK"], check=False):
            if matchbox.poll() is not None:
                raise RuntimeError(f"matchbox exited with {matchbox.returncode}: {self.log('matchbox')[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"matchbox did not manage the screen within {timeout} s")
            time.sleep(0.05)
        return matchbox

    def selection_owner(self, selection="_NET_WM_CM_S0"):
        """The window owning an X selection (default: the compositing
        manager's), 0 if none."""
        return int(self.run([TOOLS["python3"], "-c", SELECTION_OWNER, selection]).strip())

    def programs(self, name):
        """Live processes of the program `name` (by comm) in this desktop,
        whoever started them: {pid: argv}."""
        found = {}
        for pid in gnomeshell.processes_in_mount_namespace(self.mount_namespace):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
            except OSError:
                continue
        return found

    def compositors(self):
        """The picom processes of this desktop: {pid: argv}."""
        return self.programs("picom")

    # -- windows

    def start_gtk_button(self, title="Order", label="Order now", colourful=False, timeout=30):
        """gtk_button.py's window, which matchbox gives the whole screen and
        the focus, once it is mapped and the screen has settled; with
        `colourful`, the GTK user stylesheet COLOURFUL_CSS paints it. Its
        Popen."""
        if colourful:
            directory = Path(self.env["XDG_CONFIG_HOME"]) / "gtk-3.0"
            directory.mkdir(exist_ok=True)
            (directory / "gtk.css").write_text(COLOURFUL_CSS)
            for path in (directory, directory / "gtk.css"):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        app = self.spawn("gtk-button", [TOOLS["python3"], self.readable(sway.GTK_BUTTON), title, label])
        self.wait_for_output("gtk-button", "mapped", timeout)
        self.settle(timeout=10)
        return app

    # -- screenshots

    def screenshot(self, path=None, region=None):
        """A PNG of the root window (what the screen shows: the compositor's
        output when one runs), by `import -window root`, written to `path`,
        else to a numbered file in shots/; its path."""
        if path is None:
            self._shots += 1
            path = self.root / "shots" / f"{self._shots:03}.png"
        crop = ["-crop", "{2}x{3}+{0}+{1}".format(*region), "+repage"] if region else []
        png = self.run([TOOLS["import"], "-silent", "-window", "root", *crop, "png:-"], text=False)
        Path(path).write_bytes(png)
        return Path(path)

    # -- guidedaccessd

    def start_daemon(self, binary=gnomeshell.DAEMON_BINARY, extra_args=(), timeout=15,
                     without=("DISPLAY", "XAUTHORITY", "WAYLAND_DISPLAY")):
        """guidedaccessd --user as the test user, on the desktop's session
        bus, with `env` but the variables in `without` (by default the
        display variables: it has to find the X display itself)."""
        return super().start_daemon(binary=binary, extra_args=extra_args, timeout=timeout, without=without)

    # -- the end

    def stop(self):
        """sway.Desktop.stop(), then a check that nothing of the display is
        left; returns what is (pids, sockets), empty when all is gone."""
        left = list(super().stop())
        if abstract_x_sockets(self.display_number):
            left.append(f"abstract socket @/tmp/.X11-unix/X{self.display_number}")
        return left


# ---------------------------------------------------------------- images


def means(path):
    """Mean R, G, B (0…1), and mean HSL saturation and lightness, of a
    whole screenshot: {"r", "g", "b", "saturation", "lightness"}."""
    rgb = gnomeshell.magick("convert", path, "-format", "%[fx:mean.r] %[fx:mean.g] %[fx:mean.b]", "info:").stdout
    hsl = gnomeshell.magick("convert", path, "-colorspace", "HSL", "-format", "%[fx:mean.g] %[fx:mean.b]",
                            "info:").stdout
    r, g, b = map(float, rgb.split())
    saturation, lightness = map(float, hsl.split())
    return {"r": r, "g": g, "b": b, "saturation": saturation, "lightness": lightness}


def luma(measured):
    """Mean Rec. 709 luma of a screenshot (of its gamma-encoded values, as
    a shader on the window's texture computes it)."""
    return 0.2126 * measured["r"] + 0.7152 * measured["g"] + 0.0722 * measured["b"]
