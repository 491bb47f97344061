"""Fixtures for the D-Bus layer's integration tests.

Every test gets a private dbus-daemon (its socket and config in a temporary
directory) and a running dbus-test-service on it. The clients are ones we did
not write: busctl, gdbus and dbus-python.

Run with the system interpreter, which has dbus-python and PyGObject:

    /usr/bin/python3 -m pytest -q Tests/integration

DBUS_TEST_SERVICE overrides the service binary
(default: <repo>/.build/debug/dbus-test-service).

When a test fails, the stderr logs of every process it started (services and
dbus-daemon) are attached to the failure report.
"""

import ctypes
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

# GLib pumping lives with the daemon helpers; the D-Bus layer's tests use it too.
from gadaemon import pump, pump_for  # noqa: F401

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
SERVICE_BINARY = Path(
    os.environ.get("DBUS_TEST_SERVICE", REPO_ROOT / ".build" / "debug" / "dbus-test-service")
)
BUS_CONFIG_TEMPLATE = HERE / "bus.conf.in"

BUS_NAME = "org.guidedaccess.Test1"
PEER_NAME = "org.guidedaccess.Test1.Peer"
OBJECT_PATH = "/org/guidedaccess/Test1"
INTERFACE = "org.guidedaccess.Test1"

STARTUP_TIMEOUT = 10.0
CLIENT_TIMEOUT = 15.0

# Every process a fixture started, so that nothing outlives the session even
# if a fixture's teardown is skipped.
_ALL_PROCESSES = []


def run(argv, timeout=CLIENT_TIMEOUT, **kwargs):
    """Runs a client; returns (returncode, stdout, stderr) as text."""
    completed = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, **kwargs
    )
    return completed.returncode, completed.stdout, completed.stderr


def _die_with_parent():
    """In the child before exec: SIGKILL when pytest dies, so that even a
    crashed test run leaves no dbus-daemon or service behind."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _read_line(process, timeout, what, log_path=None):
    """Reads one line from process.stdout, failing after `timeout` seconds or
    when the process exits first."""
    deadline = time.monotonic() + timeout
    data = b""
    fd = process.stdout.fileno()
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{what}: no line on stdout within {timeout} s; got {data!r}{_log_tail(log_path)}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 1)
        if not chunk:
            process.wait(timeout=5)
            raise RuntimeError(
                f"{what}: exited with {process.returncode} before printing a line; got {data!r}{_log_tail(log_path)}"
            )
        data += chunk
    return data.decode().strip()


def _log_tail(path):
    if path is None or not Path(path).exists():
        return ""
    return "\n--- log ---\n" + Path(path).read_text(errors="replace")


def _stop(process, sig=signal.SIGKILL):
    if process.poll() is None:
        try:
            process.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    for stream in (process.stdout, process.stderr, process.stdin):
        if stream is not None:
            stream.close()


class Service:
    """A running dbus-test-service."""

    def __init__(self, bus, name):
        self.bus = bus
        self.name = name
        if not SERVICE_BINARY.exists():
            pytest.fail(f"{SERVICE_BINARY} does not exist: build it with "
                        "'swift build --product dbus-test-service' or set DBUS_TEST_SERVICE", pytrace=False)
        self.log_path = bus.directory / f"service-{name}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(SERVICE_BINARY), "--address", bus.address, "--name", name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            preexec_fn=_die_with_parent,
        )
        _ALL_PROCESSES.append(self.process)
        line = _read_line(self.process, STARTUP_TIMEOUT, f"service {name}", self.log_path)
        if not line.startswith("READY :"):
            _stop(self.process)
            raise RuntimeError(f"service {name}: expected 'READY <unique-name>', got {line!r}{_log_tail(self.log_path)}")
        self.unique_name = line.split()[1]

    @property
    def pid(self):
        return self.process.pid

    def log(self):
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout):
        """Waits for the process to exit; returns its exit code (negative: a
        signal), or None if it is still running after `timeout` seconds."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        _stop(self.process)
        self._log.close()


class Bus:
    """A private dbus-daemon with its socket in a temporary directory that
    other users may reach (for the credentials tests)."""

    def __init__(self):
        self.directory = Path(tempfile.mkdtemp(prefix="ga-dbus-it-"))
        os.chmod(self.directory, 0o755)
        self.socket = self.directory / "bus"
        config = BUS_CONFIG_TEMPLATE.read_text().replace("@TYPE@", "session").replace("@SOCKET@", str(self.socket))
        # dbus-daemon's built-in limit is 128 pending replies per connection
        # (session.conf raises it to 50000); the async test keeps 151 pending.
        config = config.replace(
            "</busconfig>", '  <limit name="max_replies_per_connection">50000</limit>\n</busconfig>'
        )
        self.config_path = self.directory / "bus.conf"
        self.config_path.write_text(config)
        self.log_path = self.directory / "dbus-daemon.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            ["dbus-daemon", f"--config-file={self.config_path}", "--nofork", "--nopidfile", "--print-address=1"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            preexec_fn=_die_with_parent,
        )
        _ALL_PROCESSES.append(self.process)
        printed = _read_line(self.process, STARTUP_TIMEOUT, "dbus-daemon", self.log_path)
        # The address the daemon prints carries its guid; clients connect by path.
        assert printed.startswith(f"unix:path={self.socket}"), printed
        self.address = f"unix:path={self.socket}"
        os.chmod(self.socket, 0o777)
        self.services = []

    @property
    def pid(self):
        return self.process.pid

    def start_service(self, name=BUS_NAME):
        service = Service(self, name)
        self.services.append(service)
        return service

    def busctl(self, *args, options=(), timeout=CLIENT_TIMEOUT, prefix=()):
        """busctl --address=ADDR [options] -- args...  ("--" so that negative
        numbers are not taken for options)."""
        return run([*prefix, "busctl", f"--address={self.address}", *options, "--", *args], timeout=timeout)

    def gdbus(self, command, *args, timeout=CLIENT_TIMEOUT):
        """gdbus COMMAND -a ADDR args..."""
        return run(["gdbus", command, "-a", self.address, *args], timeout=timeout)

    def logs(self):
        sections = []
        for service in self.services:
            sections.append((f"service {service.name} (pid {service.pid}) stderr", service.log()))
        self._log.flush()
        sections.append((f"dbus-daemon (pid {self.pid}) stderr", self.log_path.read_text(errors="replace")))
        return sections

    def stop(self):
        for service in self.services:
            service.stop()
        _stop(self.process)
        self._log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for bus in getattr(item, "_dbus_buses", []):
            try:
                for title, text in bus.logs():
                    report.sections.append((title, text or "(empty)"))
            except Exception as error:  # the logs are a courtesy; never mask the failure
                report.sections.append(("dbus logs", f"cannot read the logs: {error}"))


def pytest_sessionfinish(session, exitstatus):
    for process in _ALL_PROCESSES:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture
def make_bus(request):
    """Starts private buses; all are torn down after the test."""
    buses = []
    request.node._dbus_buses = buses

    def make():
        bus = Bus()
        buses.append(bus)
        return bus

    yield make
    for bus in buses:
        bus.stop()


@pytest.fixture
def bus(make_bus):
    """A private dbus-daemon with no service on it."""
    return make_bus()


@pytest.fixture
def service(bus):
    """dbus-test-service owning org.guidedaccess.Test1 on a private bus."""
    return bus.start_service(BUS_NAME)


@pytest.fixture
def peer_service(bus, service):
    """A second instance, owning org.guidedaccess.Test1.Peer."""
    return bus.start_service(PEER_NAME)


# dbus-python: a GLib main loop for signals and asynchronous calls.


@pytest.fixture
def glib():
    from gi.repository import GLib

    return GLib


@pytest.fixture
def dbus_connection(bus, service):
    """A dbus-python connection to the private bus, on the GLib main loop."""
    import dbus
    import dbus.bus
    from dbus.mainloop.glib import DBusGMainLoop

    connection = dbus.bus.BusConnection(bus.address, mainloop=DBusGMainLoop())
    yield connection
    connection.close()


# ---------------------------------------------------------------- guidedaccessd
# Fixtures for the daemon's tests (test_ga_*.py); the helpers are in
# gadaemon.py, which stress_kill.py shares.


@pytest.fixture
def ga_env(request):
    """A private session bus with real dconf (D-Bus-activated dconf-service)
    and a private HOME/XDG_* for the daemon and every client."""
    import gadaemon

    env = gadaemon.GAEnv()
    # The report hook above attaches env.logs() when the test fails.
    if not hasattr(request.node, "_dbus_buses"):
        request.node._dbus_buses = []
    request.node._dbus_buses.append(env)
    yield env
    env.stop()


@pytest.fixture
def fake(request, ga_env):
    """Makes fake DevTools endpoints (devtools_fake.py) for the browser
    layer's tests, closed after the test (after the daemons, which would
    otherwise see their browser go, and retry); their records are attached
    to a failure's report. A test whose service sent
    the fake what a WebSocket client must not (an unmasked frame, not a
    command) fails."""
    made = []
    if not hasattr(request.node, "_dbus_buses"):
        request.node._dbus_buses = []

    def make(**options):
        from devtools_fake import FakeDevTools

        endpoint = FakeDevTools(**options)
        made.append(endpoint)
        request.node._dbus_buses.append(endpoint)
        return endpoint

    yield make
    for daemon in ga_env.daemons:
        daemon.stop()
    for endpoint in made:
        endpoint.close()
    for endpoint in made:
        assert not endpoint.client_errors, f"the service's WebSocket client misbehaved: {endpoint.client_errors}"


def start_guidedaccessd(env, **kwargs):
    try:
        return env.start_daemon(**kwargs)
    except FileNotFoundError as error:
        pytest.fail(str(error), pytrace=False)


POLKIT = ("org.freedesktop.PolicyKit1", "/org/freedesktop/PolicyKit1/Authority")
LOGIND = ("org.freedesktop.login1", "/org/freedesktop/login1")


def start_mock(env, template):
    """python -m dbusmock --template TEMPLATE (polkitd, logind) on the test's
    bus, standing in for the system bus; returns its main object once its
    name is owned."""
    import sys

    import dbus

    pytest.importorskip("dbusmock", reason="python-dbusmock is installed by scripts/install-deps into .venv")
    name = {"polkitd": POLKIT[0], "logind": LOGIND[0]}[template]
    log = open(env.root / f"mock-{template}.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "dbusmock", "--session", "--template", template],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env.env)
    env._extra_processes.append(process)
    bus = dbus.bus.BusConnection(env.address)
    deadline = time.monotonic() + 10
    while not bus.name_has_owner(name):
        assert process.poll() is None, (env.root / f"mock-{template}.log").read_text()
        assert time.monotonic() < deadline, f"{template} mock did not start"
        time.sleep(0.02)
    return bus.get_object(name, POLKIT[1] if template == "polkitd" else LOGIND[1])


def seat_session(env, desktop, session_type="wayland", logind=None, session_id="c1", uid=1000, user="kiosk"):
    """A logind mock (started unless given) whose seat0 has the active
    session SESSION_ID of the kiosk user, with logind's `Desktop` (the
    session file's name, XDG_SESSION_DESKTOP) and `Type`; returns logind."""
    import dbus

    logind = logind or start_mock(env, "logind")
    mock = "org.freedesktop.DBus.Mock"
    path = logind.AddSession(session_id, "seat0", dbus.UInt32(uid), user, True, dbus_interface=mock)
    session = dbus.bus.BusConnection(env.address).get_object(LOGIND[0], path)
    session.AddProperty("org.freedesktop.login1.Session", "Desktop", desktop, dbus_interface=mock)
    # AddSession made it seat0's active session (PropertiesChanged), before
    # it had its type: the type's change is announced too, as logind does.
    session.UpdateProperties("org.freedesktop.login1.Session", {"Type": session_type}, dbus_interface=mock)
    return logind


@pytest.fixture
def gad(ga_env):
    """guidedaccessd --user on ga_env's bus, owning its name."""
    return start_guidedaccessd(ga_env)


@pytest.fixture
def rec(ga_env, gad):
    """A dbus-python connection recording the daemon's signals and replies."""
    import gadaemon

    return gadaemon.Recorder(ga_env)


@pytest.fixture
def errmon(ga_env, gad):
    """A bus monitor that tells the error names of busctl calls."""
    import gadaemon

    return gadaemon.ErrorMonitor(ga_env)


@pytest.fixture
def errmon_factory(ga_env):
    """For tests that start the daemon themselves: makes an ErrorMonitor."""
    import gadaemon

    return lambda: gadaemon.ErrorMonitor(ga_env)
