"""The examples (Examples/kiosk-session, Examples/kiosk_session.py) and
guidedaccessctl in a real terminal (a pty), against a real guidedaccessd on a
private bus with real dconf. Contract: docs/dbus-api.md."""

import os
import pty
import select
import signal
import sys
import time

import pytest

from gadaemon import A11Y_APPS, MAGNIFIER, REPO_ROOT

KIOSK_SESSION = os.environ.get("KIOSK_SESSION", str(REPO_ROOT / ".build" / "debug" / "kiosk-session"))
KIOSK_SESSION_PY = str(REPO_ROOT / "Examples" / "kiosk_session.py")
CTL = os.environ.get("GUIDEDACCESSCTL", str(REPO_ROOT / ".build" / "debug" / "guidedaccessctl"))
# The examples' Python is the system one, with dbus-python and PyGObject.
SYSTEM_PYTHON = "/usr/bin/python3"


def _require(path, product):
    if not os.path.exists(path):
        pytest.fail(f"{path} does not exist: build it with 'swift build --product {product}'", pytrace=False)


def _check_kiosk_run(ga_env, argv):
    # A factor other than the session's (2.0), so that restoring it shows.
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.5")
    before = ga_env.snapshot()
    rc, out, err = ga_env.run([*argv, "--address", ga_env.address, "--seconds", "1"], timeout=30)
    assert rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    lines = out.splitlines()
    assert "event: session active (started)" in lines, out
    assert "event: session inactive (ended)" in lines, out
    assert lines.index("event: session active (started)") < lines.index("event: session inactive (ended)"), out
    assert lines[-1] == "done", out
    # Every setting back as it was.
    assert ga_env.gsettings_get(MAGNIFIER, "mag-factor") == 3.5
    assert ga_env.gsettings_get(A11Y_APPS, "screen-magnifier-enabled") is False
    assert ga_env.snapshot() == before
    rc, out, err = ga_env.busctl("get-property", "org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                                 "org.guidedaccess.GuidedAccess1", "SessionActive")
    assert rc == 0, err
    assert out.strip() == "b false"


def test_kiosk_session_swift(ga_env, gad):
    _require(KIOSK_SESSION, "kiosk-session")
    _check_kiosk_run(ga_env, [KIOSK_SESSION])


def test_kiosk_session_python(ga_env, gad):
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"{SYSTEM_PYTHON} is absent")
    _check_kiosk_run(ga_env, [SYSTEM_PYTHON, KIOSK_SESSION_PY])


# -- guidedaccessctl in a terminal


class Terminal:
    """A program on a pty: stdin, stdout and stderr are the pty's slave, and
    the program leads its own session with the pty as controlling terminal
    (so Ctrl-C written to the master interrupts it)."""

    def __init__(self, argv, env):
        self.pid, self.master = pty.fork()
        if self.pid == 0:
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.screen = b""
        self.status = None

    def read_until(self, text, timeout=10.0):
        """Reads from the master until `text` is on the screen; returns the screen."""
        deadline = time.monotonic() + timeout
        while text.encode() not in self.screen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{text!r} not on the terminal within {timeout} s; screen: {self.screen!r}"
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: the slave side is closed (the program exited)
                    chunk = b""
                assert chunk, f"the program exited before {text!r}; screen: {self.screen!r}"
                self.screen += chunk
        return self.screen.decode()

    def drain(self, timeout=5.0):
        """Reads until the program closes the terminal (EOF/EIO)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.screen += chunk

    def wait(self, timeout=10.0):
        """Waits for the program; returns its exit code, or -signal."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        raise AssertionError(f"still running after {timeout} s; screen: {self.screen!r}")

    def close(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.master)


def _ctl_in_terminal(ga_env, *args):
    return Terminal([CTL, "--address", ga_env.address, *args], ga_env.env)


def _status_screen(ga_env):
    term = _ctl_in_terminal(ga_env, "status")
    try:
        term.drain()
        assert term.wait() == 0, term.screen
        return term.screen.decode().replace("\r\n", "\n")
    finally:
        term.close()


def _session_line(screen):
    lines = [line for line in screen.splitlines() if line.strip().startswith("Session")]
    assert lines, f"no Session line in the table:\n{screen}"
    return lines[0]


def test_ctl_status_in_terminal(ga_env, gad):
    _require(CTL, "guidedaccessctl")
    screen = _status_screen(ga_env)
    assert "inactive" in _session_line(screen), screen

    rc, _, err = ga_env.busctl_call("StartSession", "a{sv}", "0")
    assert rc == 0, err
    screen = _status_screen(ga_env)
    line = _session_line(screen)
    assert "active" in line and "inactive" not in line, screen

    rc, _, err = ga_env.busctl_call("EndSession")
    assert rc == 0, err
    assert "inactive" in _session_line(_status_screen(ga_env))


def test_ctl_monitor_in_terminal_ctrl_c(ga_env, gad):
    _require(CTL, "guidedaccessctl")
    term = _ctl_in_terminal(ga_env, "monitor")
    try:
        # stderr is the terminal too: "Monitoring …" once subscribed.
        term.read_until("Monitoring ")
        rc, _, err = ga_env.busctl_call("StartSession", "a{sv}", "0")
        assert rc == 0, err
        term.read_until("SessionChanged active=true reason=started")
        rc, _, err = ga_env.busctl_call("EndSession")
        assert rc == 0, err
        term.read_until("SessionChanged active=false reason=ended")

        os.write(term.master, b"\x03")  # Ctrl-C: SIGINT to the foreground process group
        term.drain()
        code = term.wait()
        print(f"monitor after Ctrl-C: exit {code}; screen tail {term.screen[-200:]!r}", file=sys.stderr)
        assert code == 0, f"monitor exited {code} after Ctrl-C; screen: {term.screen!r}"
    finally:
        term.close()
