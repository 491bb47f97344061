"""guidedaccessctl against a real guidedaccessd on a private bus with real
dconf. Each invocation is its own process: a session started by one is taken
over by the next (same user, same executable).
Contract: docs/dbus-api.md; exit codes: guidedaccessctl --help."""

import json
import os
import re
import select
import signal
import subprocess
import time

import pytest

from gadaemon import MAGNIFIER, REPO_ROOT

CTL = os.environ.get("GUIDEDACCESSCTL", str(REPO_ROOT / ".build" / "debug" / "guidedaccessctl"))

NOT_IN_SESSION = 4
SESSION_BUSY = 5
FEATURE = 6
USAGE = 2
SERVICE_UNAVAILABLE = 10


@pytest.fixture(autouse=True)
def _ctl_built():
    if not os.path.exists(CTL):
        pytest.fail(f"{CTL} does not exist: build it with 'swift build --product guidedaccessctl'", pytrace=False)


def ctl(env, *args):
    """Runs guidedaccessctl --address BUS args...; returns (rc, stdout, stderr)."""
    return env.run([CTL, "--address", env.address, *args])


def ok(result):
    rc, out, err = result
    assert rc == 0, f"exit {rc}: {err}"
    return out


def status(env):
    return json.loads(ok(ctl(env, "status", "--json")))


def test_status_json(ga_env, gad):
    s = status(ga_env)
    assert s["sessionActive"] is False
    assert s["sessionOwner"] == ""
    assert s["sessionOwnerOrigin"] == ""
    assert s["sessionDeadline"] == 0
    assert s["enabledFeatures"] == []
    assert "zoom" in s["supportedFeatures"]
    assert s["backend"] and s["version"]
    assert s["desktop"] == "gnome-shell"
    assert s["agent"] == ""


def test_status_table(ga_env, gad):
    out = ok(ctl(ga_env, "status"))
    assert "Session:" in out and "inactive" in out
    assert re.search(r"^Desktop: +gnome-shell$", out, re.M), out
    assert "Agent:" not in out, "user mode: the service is its own agent"


def test_start_zoom_then_end_restores(ga_env, gad):
    before = ga_env.gsettings_get(MAGNIFIER, "mag-factor")
    ok(ctl(ga_env, "start", "--feature", "zoom", "--time-limit", "10m"))
    assert ga_env.gsettings_get(MAGNIFIER, "mag-factor") == 2.0
    s = status(ga_env)
    assert s["sessionActive"] is True
    assert s["enabledFeatures"] == ["zoom"]
    assert s["sessionDeadline"] > time.time() * 1_000_000 + 500 * 1_000_000
    table = ok(ctl(ga_env, "status"))
    assert re.search(r"^Time limit: +\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(0h (9|10)m \d+s left\)$", table, re.M), table

    # Options with a take-over are refused (InvalidArgs); without, it resumes.
    rc, _, err = ctl(ga_env, "start", "--feature", "grayscale")
    assert rc == USAGE, err
    assert err.startswith("guidedaccessctl: ")
    ok(ctl(ga_env, "start"))

    ok(ctl(ga_env, "end"))
    assert status(ga_env)["sessionActive"] is False
    assert ga_env.gsettings_get(MAGNIFIER, "mag-factor") == before


def test_enable_disable_take_over(ga_env, gad):
    ok(ctl(ga_env, "start"))
    ok(ctl(ga_env, "enable", "zoom"))
    assert status(ga_env)["enabledFeatures"] == ["zoom"]
    ok(ctl(ga_env, "disable", "zoom"))
    assert status(ga_env)["enabledFeatures"] == []
    ok(ctl(ga_env, "end"))


def test_exit_codes(ga_env, gad):
    rc, out, err = ctl(ga_env, "enable", "zoom")
    assert rc == NOT_IN_SESSION, err
    assert err.startswith("guidedaccessctl: ") and err.strip() != "guidedaccessctl:"

    rc, _, err = ctl(ga_env, "enable", "no-such-feature")
    assert rc == FEATURE, err
    assert "no-such-feature" in err

    rc, _, err = ctl(ga_env, "end")
    assert rc == NOT_IN_SESSION, err

    rc, _, err = ctl(ga_env, "restrict", "x", "maybe")
    assert rc == USAGE, err

    rc, _, err = ctl(ga_env, "start", "--time-limit", "soon")
    assert rc == USAGE, err

    rc, _, err = ga_env.run([CTL, "--address", f"unix:path={ga_env.root}/no-bus", "status"])
    assert rc == SERVICE_UNAVAILABLE, err


def test_session_busy(ga_env, gad):
    # Another program (busctl) owns the session: ctl may not take it over.
    rc, _, err = ga_env.busctl_call("StartSession", "a{sv}", "0")
    assert rc == 0, err
    rc, _, err = ctl(ga_env, "start")
    assert rc == SESSION_BUSY, err
    assert err.startswith("guidedaccessctl: ")


def test_restrictions_listing(ga_env, gad):
    rc, _, err = ga_env.busctl_call("RegisterRestrictions", "a(sss)", "1", "com.example.print", "Printing", "")
    assert rc == 0, err
    out = ok(ctl(ga_env, "restrictions"))
    assert "com.example.print" in out and "allow" in out and "Printing" in out
    rc, _, err = ctl(ga_env, "restrict", "com.example.nothing", "deny")
    assert rc == 7, err
    assert "com.example.nothing" in err

    rc, _, err = ctl(ga_env, "restrict", "com.example.print", "deny")
    assert rc == NOT_IN_SESSION, err
    ok(ctl(ga_env, "start"))
    # In user mode with no [Operators] group, the bus's own user is an operator.
    ok(ctl(ga_env, "restrict", "com.example.print", "deny"))
    assert ok(ctl(ga_env, "restrictions")).startswith("deny  com.example.print")
    ok(ctl(ga_env, "end"))
    assert ok(ctl(ga_env, "restrictions")).startswith("allow com.example.print")


def _readline(process, timeout, stream="stdout"):
    fd = getattr(process, stream).fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no line on {stream} within {timeout} s; got {data!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 1)
            assert chunk, f"monitor exited ({process.poll()}) before a line; got {data!r}"
            data += chunk
    return data.decode().strip()


def test_monitor_prints_session_changes(ga_env, gad):
    monitor = subprocess.Popen(
        [CTL, "--address", ga_env.address, "monitor"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=ga_env.env)
    try:
        assert _readline(monitor, 10, "stderr").startswith("Monitoring ")
        rc, _, err = ga_env.busctl_call("StartSession", "a{sv}", "0")
        assert rc == 0, err
        assert _readline(monitor, 10) == "SessionChanged active=true reason=started"
        rc, _, err = ga_env.busctl_call("EndSession")
        assert rc == 0, err
        assert _readline(monitor, 10) == "SessionChanged active=false reason=ended"
        monitor.send_signal(signal.SIGTERM)
        assert monitor.wait(timeout=5) == 0
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait(timeout=5)
        monitor.stdout.close()
        monitor.stderr.close()
