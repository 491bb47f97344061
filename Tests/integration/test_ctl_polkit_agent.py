"""guidedaccessctl's polkit agent: on a terminal, a call on the system bus
that may need authorization runs the real /usr/bin/pkttyagent meanwhile (as
systemd's tools do), and ends it afterwards.

The test's private bus stands in for the system bus (DBUS_SYSTEM_BUS_ADDRESS,
for guidedaccessctl --system and for pkttyagent alike), with python-dbusmock's
polkitd template on it and guidedaccessd in system mode. guidedaccessctl runs
as nobody (root needs no agent) in a real pty. The mock holds StartSession's
CheckAuthorization (SimulateHangActions) so that the call is in flight while
the test looks at guidedaccessctl's children in /proc.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import termios
import time

import dbus
import pytest

from gadaemon import pump, pump_for
from test_examples_and_terminal import CTL, Terminal
from conftest import start_mock
from test_ga_system_mode import NOBODY, START, session_active

PKTTYAGENT = "/usr/bin/pkttyagent"
# Terminal execs its argv[0] by path.
AS_NOBODY = (shutil.which(NOBODY[0]) or NOBODY[0], *NOBODY[1:])
MOCK = "org.freedesktop.DBus.Mock"

pytestmark = [
    pytest.mark.skipif(not os.path.exists(PKTTYAGENT), reason=f"{PKTTYAGENT} (Debian: polkitd) is absent"),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs guidedaccessctl as nobody through setpriv"),
]


@pytest.fixture(autouse=True)
def _ctl_built():
    if not os.path.exists(CTL):
        pytest.fail(f"{CTL} does not exist: build it with 'swift build --product guidedaccessctl'", pytrace=False)


class Registrations:
    """A bus monitor recording RegisterAuthenticationAgent* calls to polkit."""

    def __init__(self, env):
        self.calls = []
        self.agents = []  # (unique name, object path)
        # CheckAuthorization calls seen: proof that the monitor works where
        # a test expects no registration at all.
        self.checks = 0
        self.connection = env.connect(mainloop=True)

        def on_message(connection, message):
            if message.get_member() == "CheckAuthorization":
                self.checks += 1
            if message.get_member() in ("RegisterAuthenticationAgent", "RegisterAuthenticationAgentWithOptions"):
                self.calls.append(message.get_args_list())
                self.agents.append((message.get_sender(), str(message.get_args_list()[2])))

        self.connection.add_message_filter(on_message)
        self.connection.call_blocking(
            "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus.Monitoring",
            "BecomeMonitor", "asu", (["interface='org.freedesktop.PolicyKit1.Authority'"], 0), timeout=5)

    def subject_pids(self):
        pump_for(0.1)
        assert self.checks > 0, "the bus monitor saw no CheckAuthorization: it would see no registration either"
        return [int(args[0][1]["pid"]) for args in self.calls if args[0][0] == "unix-process"]


@pytest.fixture
def system(ga_env):
    """polkit (StartSession allowed, its check held) and guidedaccessd
    --system on the bus; returns the polkit mock."""
    from conftest import start_guidedaccessd

    polkit = start_mock(ga_env, "polkitd")
    polkit.SetAllowed([START], dbus_interface=MOCK)
    polkit.SimulateHangActions([START], dbus_interface=MOCK)
    start_guidedaccessd(ga_env, config=ga_env.write_config("[Service]\nBackend=memory\n"), args=("--system",))
    ga_env.env["DBUS_SYSTEM_BUS_ADDRESS"] = ga_env.address
    return polkit


def wait_until_held(polkit, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not polkit.HaveHangingCalls(dbus_interface=MOCK):
        assert time.monotonic() < deadline, "StartSession's CheckAuthorization never reached polkit"
        time.sleep(0.05)


def children(pid):
    try:
        return [int(c) for path in os.scandir(f"/proc/{pid}/task")
                for c in open(f"{path.path}/children").read().split()]
    except OSError:
        return []


def agents_of(pid):
    """guidedaccessctl's pkttyagent children."""
    found = []
    for child in children(pid):
        try:
            if os.readlink(f"/proc/{child}/exe") == PKTTYAGENT:
                found.append(child)
        except OSError:
            pass
    return found


def status_field(pid, name):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(name + ":"):
            return line.split()[1]
    raise KeyError(name)


def alive(pid):
    """Running (not merely a zombie nobody reaped yet)."""
    try:
        return status_field(pid, "State") != "Z"
    except OSError:
        return False


def ctl_in_terminal(ga_env, *args):
    return Terminal([*AS_NOBODY, CTL, "--system", *args], ga_env.env)


def test_a_call_on_a_terminal_runs_pkttyagent_meanwhile_and_ends_it(ga_env, system):
    registrations = Registrations(ga_env)
    term = ctl_in_terminal(ga_env, "start")
    try:
        echo_before = termios.tcgetattr(term.master)[3] & termios.ECHO
        wait_until_held(system)
        [agent] = agents_of(term.pid)
        with open(f"/proc/{agent}/cmdline") as cmdline:
            assert cmdline.read().split("\0")[1:4] == ["--notify-fd", "3", "--fallback"]
        # Not the signal mask of the thread that spawned it (Swift's async
        # code runs on libdispatch threads that block SIGTERM and the like):
        # with it, the agent would never see the SIGTERM that ends it.
        assert int(status_field(agent, "SigBlk"), 16) == 0
        # It registered with polkit for its parent, guidedaccessctl, before
        # the call was made.
        assert registrations.subject_pids() == [term.pid]

        system.ReleaseHangingCalls(dbus_interface=MOCK)
        term.drain()
        assert term.wait() == 0, term.screen
        assert session_active(ga_env)
        # Reaped by guidedaccessctl before it exited: no orphan, no zombie.
        assert not os.path.exists(f"/proc/{agent}")
        assert termios.tcgetattr(term.master)[3] & termios.ECHO == echo_before
    finally:
        term.close()


def test_no_ask_password_runs_no_agent(ga_env, system):
    registrations = Registrations(ga_env)
    term = ctl_in_terminal(ga_env, "--no-ask-password", "start")
    try:
        wait_until_held(system)
        assert agents_of(term.pid) == []
        system.ReleaseHangingCalls(dbus_interface=MOCK)
        term.drain()
        assert term.wait() == 0, term.screen
        assert registrations.subject_pids() == []
    finally:
        term.close()


def test_without_a_terminal_no_agent_runs(ga_env, system):
    registrations = Registrations(ga_env)
    process = subprocess.Popen([*NOBODY, CTL, "--system", "start"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ga_env.env)
    try:
        wait_until_held(system)
        assert agents_of(process.pid) == []
        system.ReleaseHangingCalls(dbus_interface=MOCK)
        out, err = process.communicate(timeout=15)
        assert process.returncode == 0, err
        assert registrations.subject_pids() == []
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_read_only_commands_and_the_session_bus_run_no_agent(ga_env, system):
    registrations = Registrations(ga_env)
    term = ctl_in_terminal(ga_env, "status")
    try:
        term.drain()
        assert term.wait() == 0, term.screen
    finally:
        term.close()
    # --address: not the system bus, which is the only one polkit vouches for.
    term = Terminal([*AS_NOBODY, CTL, "--address", ga_env.address, "start"], ga_env.env)
    try:
        wait_until_held(system)
        assert agents_of(term.pid) == []
        system.ReleaseHangingCalls(dbus_interface=MOCK)
        term.drain()
        assert term.wait() == 0, term.screen
    finally:
        term.close()
    assert registrations.subject_pids() == []


def test_the_agent_goes_when_guidedaccessctl_is_killed(ga_env, system):
    # A shell leads the terminal's session and outlives guidedaccessctl, so
    # that no hangup (SIGHUP to the foreground group) ends the agent: only
    # PR_SET_PDEATHSIG does.
    term = Terminal(["/bin/sh", "-c", '"$@"; echo "exit $?"; sleep 30', "sh", *AS_NOBODY, CTL, "--system", "start"],
                    ga_env.env)
    try:
        wait_until_held(system)
        [ctl] = children(term.pid)
        [agent] = agents_of(ctl)
        os.kill(ctl, signal.SIGKILL)
        term.read_until("exit 137")
        assert pump(lambda: not alive(agent), 5.0), f"pkttyagent {agent} outlived guidedaccessctl"
        assert alive(term.pid)  # the shell: the terminal was not hung up
    finally:
        term.close()


def ask_for_password(ga_env, registrations, term):
    """Does what polkitd does when a call needs authentication: asks the
    agent to authenticate (as root). The real pkttyagent and its setuid
    helper prompt on the terminal, with echo off."""
    assert pump(lambda: registrations.agents, 5.0)
    [(name, path)] = registrations.agents
    replies = []
    ga_env.connect(mainloop=True).call_async(
        name, path, "org.freedesktop.PolicyKit1.AuthenticationAgent", "BeginAuthentication", "sssa{ss}sa(sa{sv})",
        (START, "Starting a Guided Access session needs authentication", "", {}, "cookie-1",
         [("unix-user", {"uid": dbus.UInt32(0)})]),
        replies.append, replies.append, timeout=60)
    term.read_until("Password: ")
    # Echo goes off around the prompt (just after it is printed).
    assert pump(lambda: not termios.tcgetattr(term.master)[3] & termios.ECHO, 5.0), "echo stayed on"
    return replies


@contextlib.contextmanager
def agent_asking_for_a_password(ga_env, system):
    """guidedaccessctl start in a terminal, its agent in the middle of the
    password prompt; yields (terminal, agent pid, terminal settings from
    before) and closes the terminal afterwards."""
    registrations = Registrations(ga_env)
    term = ctl_in_terminal(ga_env, "start")
    try:
        before = termios.tcgetattr(term.master)
        wait_until_held(system)
        [agent] = agents_of(term.pid)
        ask_for_password(ga_env, registrations, term)
        yield term, agent, before
    finally:
        term.close()


def test_ending_the_agent_while_it_asks_for_a_password_leaves_the_terminal_as_it_was(ga_env, system):
    with agent_asking_for_a_password(ga_env, system) as (term, agent, before):
        assert "AUTHENTICATING FOR " + START in term.screen.decode()
        # polkit answers without the password (the mock): guidedaccessctl
        # ends the agent in the middle of its prompt.
        system.ReleaseHangingCalls(dbus_interface=MOCK)
        term.drain()
        assert term.wait() == 0, term.screen
        assert not os.path.exists(f"/proc/{agent}")
        assert termios.tcgetattr(term.master) == before


def test_an_agent_killed_while_it_asks_for_a_password_leaves_the_terminal_as_it_was(ga_env, system):
    with agent_asking_for_a_password(ga_env, system) as (term, agent, before):
        # SIGKILL: pkttyagent cannot put the terminal back itself.
        os.kill(agent, signal.SIGKILL)
        system.ReleaseHangingCalls(dbus_interface=MOCK)
        term.drain()
        assert term.wait() == 0, term.screen
        assert termios.tcgetattr(term.master) == before
