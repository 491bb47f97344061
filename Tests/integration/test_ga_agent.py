"""The session agent (spec 1.2, section 1) with the system service, on
private buses: the test's bus stands in for the system bus (the service in
system mode with the dconf backend locking a database of the test's, as
test_ga_dconf_system.py does), and the agent — guidedaccessd --agent as the
user nobody — has a session bus of its own (agents.AgentSession), where the
desktop is x11 and the screen reader a program it runs (a stand-in Orca
that sleeps: real Orca speaks in the container test). Clients are busctl,
gdbus and dbus-python; misbehaving agents are fake_agent.py.
"""

import json
import os
import re
import signal
import subprocess
import time

import dbus
import pytest

from agents import AgentSession, FakeAgent, readable
from conftest import LOGIND, seat_session, start_guidedaccessd
from gadaemon import DAEMON_BINARY, GA_ERROR, Recorder, pump

CTL = os.environ.get("GUIDEDACCESSCTL", str(DAEMON_BINARY.parent / "guidedaccessctl"))

pytest.importorskip("dbusmock", reason="python-dbusmock is installed by scripts/install-deps into .venv")

READER = ("org.gnome.desktop.a11y.applications", "screen-reader-enabled")
TEXT = ("org.gnome.desktop.interface", "text-scaling-factor")
NO_AGENT = ("no session agent is registered (guidedaccess-agent.service of the kiosk user: systemctl --global enable "
            "guidedaccess-agent.service starts it at the login, [Agent] AllowUsers= admits the user)")
REGISTERED, REFUSED, LOST = (f"3c4bd2b4c5a24b8f9c6e0a1d2f3e4a5{c}" for c in "89a")
GAVE_UP = "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a57"


@pytest.fixture
def system(ga_env):
    """Starts the system service on the test's bus: dconf backend with a
    database of the test's, [Agent] AllowUsers=nobody unless told."""
    db = ga_env.root / "db"
    db.mkdir()
    profile = ga_env.root / "profile"
    profile.write_text(f"user-db:user\nfile-db:{db}/guidedaccess\n")

    def start(agent_users="nobody", extra=""):
        agent = f"[Agent]\nAllowUsers={agent_users}\n" if agent_users is not None else ""
        config = ga_env.write_config(
            "[Service]\nBackend=dconf\n"
            f"[Dconf]\nDatabaseDir={db}\nDatabaseName=guidedaccess\nLockOutsideSession=false\n{agent}{extra}")
        daemon = start_guidedaccessd(
            ga_env, config=config, args=("--system",),
            extra_env={"DBUS_SYSTEM_BUS_ADDRESS": ga_env.address,
                       "GUIDEDACCESS_JOURNAL_SOCKET": str(ga_env.root / "journal.socket")})
        ga_env.env["DCONF_PROFILE"] = str(profile)
        return daemon

    return start


@pytest.fixture
def kiosk(ga_env):
    sessions = []

    def make(**kwargs):
        session = AgentSession(ga_env.address, **kwargs)
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        session.stop()


@pytest.fixture
def journal(ga_env):
    """A socket where the service's audit records land (journald's native protocol)."""
    import socket

    path = ga_env.root / "journal.socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    records = []

    def read():
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return records
            fields = {}
            for line in data.decode(errors="replace").split("\n"):
                if "=" in line:
                    key, value = line.split("=", 1)
                    fields[key] = value
            records.append(fields)

    yield read
    sock.close()


def wait_prop(rec, name, predicate, timeout=10.0):
    assert pump(lambda: predicate(rec.prop(name)), timeout), f"{name} = {rec.prop(name)!r}"
    return rec.prop(name)


def start_session(rec, *features):
    return rec.call("StartSession", "a{sv}", ({"features": dbus.Array(list(features), signature="s")},))


def error(rec, method, signature, args):
    return rec.error(method, signature, args)


def get(ga_env, key):
    code, out, err = ga_env.run(["gsettings", "get", *key])
    assert code == 0, err
    return out.strip()


def wait_for(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# ---------------------------------------------------------------- registration


def test_without_an_agent_the_screen_reader_is_unsupported_naming_the_agent(ga_env, system):
    system()
    rec = Recorder(ga_env)
    assert rec.prop("Agent") == ""
    assert "screen-reader" not in rec.prop("SupportedFeatures")
    name, message = error(rec, "StartSession", "a{sv}", ({"features": dbus.Array(["screen-reader"], signature="s")},))
    assert name == GA_ERROR + "UnsupportedFeature"
    assert message.startswith(f"screen-reader: {NO_AGENT}"), message


def test_an_admitted_agent_registers_and_its_session_gives_the_service_a_screen_reader(ga_env, system, kiosk, journal):
    system()
    rec = Recorder(ga_env)
    session = kiosk()
    session.agent().start()
    assert wait_prop(rec, "Agent", lambda user: user == "nobody") == "nobody"
    assert "screen-reader" in wait_prop(rec, "SupportedFeatures", lambda f: "screen-reader" in f)
    assert rec.prop("Desktop") == "sway"
    started = time.monotonic()
    start_session(rec, "screen-reader", "large-text")
    took = time.monotonic() - started
    [orca] = session.running_orcas()
    assert get(ga_env, READER) == "true"
    assert get(ga_env, TEXT) == "1.5"
    rec.call("EndSession")
    wait_for(lambda: session.running_orcas() == [], "the stand-in Orca to stop")
    assert get(ga_env, READER) == "false"
    # guidedaccessctl shows who the agent is, and the desktop of its session.
    code, out, err = ga_env.run([str(CTL), "--address", ga_env.address, "status"])
    assert code == 0, err
    assert re.search(r"^Agent: +nobody$", out, re.M) and re.search(r"^Desktop: +sway$", out, re.M), out
    code, out, err = ga_env.run([str(CTL), "--address", ga_env.address, "status", "--json"])
    assert json.loads(out)["agent"] == "nobody", out
    records = [r for r in journal() if r.get("MESSAGE_ID") == REGISTERED]
    assert len(records) == 1, journal()
    assert records[0]["GUIDEDACCESS_CALLER_UID"] == "65534"
    assert records[0]["GUIDEDACCESS_AGENT_USER"] == "nobody"
    print(f"StartSession(screen-reader, large-text) with the agent: {took * 1000:.0f} ms")


def test_an_agent_of_a_user_not_admitted_is_refused_and_audited_and_the_real_agent_is_unaffected(
        ga_env, system, kiosk, journal):
    system()
    rec = Recorder(ga_env)
    session = kiosk()
    session.agent().start()
    wait_prop(rec, "Agent", lambda user: user == "nobody")
    intruder = FakeAgent(ga_env.address, user="daemon")
    try:
        assert intruder.registration.startswith(f"refused {GA_ERROR}NotAuthorized: "), intruder.registration
        assert "uid 1 (daemon) may not register as the session agent: [Agent] AllowUsers= admits nobody" \
            in intruder.registration
        assert rec.prop("Agent") == "nobody"
        start_session(rec, "screen-reader")
        assert len(session.running_orcas()) == 1
        assert intruder.calls() == []
    finally:
        intruder.stop()
    [refused] = [r for r in journal() if r.get("MESSAGE_ID") == REFUSED]
    assert refused["GUIDEDACCESS_CALLER_UID"] == "1"
    assert refused["PRIORITY"] == "4"


def test_root_in_allow_users_stops_the_start_naming_the_mistake(ga_env, system):
    config = ga_env.write_config("[Service]\nBackend=memory\n[Agent]\nAllowUsers=root\n")
    daemon = ga_env.daemon(config=config, args=("--system",), extra_env={"DBUS_SYSTEM_BUS_ADDRESS": ga_env.address})
    code, log = daemon.expect_start_failure()
    assert code != 0
    assert "[Agent] AllowUsers=root: root is never the session agent" in log, log


def test_without_allow_users_the_user_of_seat0s_active_session_is_admitted_and_no_one_else(ga_env, system, kiosk):
    seat_session(ga_env, "sway", uid=65534, user="nobody")
    system(agent_users=None)
    rec = Recorder(ga_env)
    intruder = FakeAgent(ga_env.address, user="daemon")
    try:
        assert intruder.registration.startswith(f"refused {GA_ERROR}NotAuthorized: "), intruder.registration
        assert "logind's active session on seat0 is uid 65534's (nobody)" in intruder.registration
    finally:
        intruder.stop()
    session = kiosk()
    session.agent().start()
    assert wait_prop(rec, "Agent", lambda user: user == "nobody") == "nobody"
    wait_prop(rec, "SupportedFeatures", lambda f: "screen-reader" in f)


def test_register_agent_is_not_supported_in_user_mode(ga_env):
    start_guidedaccessd(ga_env)
    rec = Recorder(ga_env)
    name, message = rec.error("RegisterAgent")
    assert name == "org.freedesktop.DBus.Error.NotSupported", message
    assert "user mode, where it is its own session agent" in message
    assert rec.prop("Agent") == ""


# ---------------------------------------------------------------- faults


def killed_mid_session(ga_env, system, kiosk):
    """A session with the screen reader and large text whose agent was then
    kill -9'd: (recorder, kiosk session, agent, the Orca it had started)."""
    system()
    rec = Recorder(ga_env)
    session = kiosk()
    agent = session.agent().start()
    wait_prop(rec, "Agent", lambda user: user == "nobody")
    start_session(rec, "screen-reader", "large-text")
    [orca] = session.running_orcas()
    agent.kill9()
    wait_prop(rec, "Agent", lambda user: user == "")
    return rec, session, agent, orca


def test_a_killed_agent_is_restarted_adopts_the_same_orca_and_applies_the_session_again(
        ga_env, system, kiosk, journal):
    rec, session, agent, orca = killed_mid_session(ga_env, system, kiosk)
    # The session goes on without it: the keys stay, and what the agent ran.
    assert rec.prop("SessionActive") is True
    assert get(ga_env, TEXT) == "1.5"
    assert session.running_orcas() == [orca]
    [lost] = [r for r in journal() if r.get("MESSAGE_ID") == LOST]
    assert "it left the bus" in lost["MESSAGE"]
    assert "screen-reader" not in rec.prop("SupportedFeatures")
    name, message = error(rec, "ConfigureForSession", "asb", (["screen-reader"], True))
    assert name == GA_ERROR + "UnsupportedFeature" and NO_AGENT in message, message
    mark = len(agent.log())
    agent.start()
    wait_prop(rec, "Agent", lambda user: user == "nobody")
    registered = time.monotonic()
    agent.wait_for_log("applied: [large-text, screen-reader]", since=mark)
    took = time.monotonic() - registered
    assert took <= 1.0, f"applied again {took:.2f} s after the registration"
    assert session.running_orcas() == [orca], "the same Orca, not a new one"
    assert session.orca_pids() == [orca]
    assert "adopted" in agent.log()[mark:], agent.log()[mark:]
    print(f"applied again {took * 1000:.0f} ms after the restarted agent registered")
    rec.call("EndSession")
    wait_for(lambda: session.running_orcas() == [], "Orca to stop")


def test_end_session_with_the_agent_stopped_succeeds_and_the_agent_stops_its_orca_when_it_is_back(
        ga_env, system, kiosk):
    rec, session, agent, orca = killed_mid_session(ga_env, system, kiosk)
    started = time.monotonic()
    rec.call("EndSession")
    assert time.monotonic() - started < 1.0
    assert rec.prop("SessionActive") is False
    assert get(ga_env, TEXT) == "1.0"
    assert get(ga_env, READER) == "false"
    assert session.running_orcas() == [orca], "nothing stops it while the agent is away"
    mark = len(agent.log())
    agent.start()
    wait_prop(rec, "Agent", lambda user: user == "nobody")
    wait_for(lambda: session.running_orcas() == [], "the agent to stop the Orca it had started")
    agent.wait_for_log("applied: []", since=mark)


def test_an_agent_whose_orca_cannot_start_fails_the_call_and_nothing_stays(ga_env, system, kiosk):
    system()
    rec = Recorder(ga_env)
    session = kiosk(orca="broken")
    session.agent().start()
    wait_prop(rec, "SupportedFeatures", lambda f: "screen-reader" in f)
    name, message = error(rec, "StartSession", "a{sv}",
                          ({"features": dbus.Array(["large-text", "screen-reader"], signature="s")},))
    assert name == GA_ERROR + "BackendFailed", message
    assert "orca" in message.lower(), message
    assert rec.prop("SessionActive") is False
    assert get(ga_env, TEXT) == "1.0"
    assert get(ga_env, READER) == "false"
    assert session.running_orcas() == []


def test_an_orca_the_agent_gives_up_on_is_audited_by_the_service_as_its_own_would_be(ga_env, system, kiosk, journal):
    system()
    rec = Recorder(ga_env)
    session = kiosk(orca="dies")
    session.agent().start()
    wait_prop(rec, "SupportedFeatures", lambda f: "screen-reader" in f)
    start_session(rec, "screen-reader")
    wait_for(lambda: any(r.get("MESSAGE_ID") == GAVE_UP for r in journal()), "the programGaveUp record", timeout=30)
    [record] = [r for r in journal() if r.get("MESSAGE_ID") == GAVE_UP]
    assert record["GUIDEDACCESS_FEATURE"] == "screen-reader"
    assert record["GUIDEDACCESS_AGENT_USER"] == "nobody"
    assert "its program exited 6 times" in record["MESSAGE"] and "as its agent reports" in record["MESSAGE"], record
    assert len(session.orca_pids()) == 6


@pytest.mark.parametrize("how", ["slow", "leaves"])
def test_an_agent_that_takes_over_5_s_or_leaves_mid_call_fails_the_call_and_nothing_stays(ga_env, system, how):
    system(agent_users="daemon")
    rec = Recorder(ga_env)
    fake = FakeAgent(ga_env.address, user="daemon", apply_delay=6.0, exit_in_apply=how == "leaves")
    try:
        assert fake.registration == "registered", fake.registration + fake.log()
        wait_prop(rec, "Agent", lambda user: user == "daemon")
        # At its registration it is sent the state: nothing (answered at once).
        wait_for(lambda: fake.calls()[:1] == ["Apply "], "the state sent at registration", timeout=10)
        rec.settle(0.2)
        started = time.monotonic()
        name, message = error(rec, "StartSession", "a{sv}",
                              ({"features": dbus.Array(["large-text", "screen-reader"], signature="s")},))
        took = time.monotonic() - started
        assert name == GA_ERROR + "BackendFailed", message
        if how == "slow":
            assert "did not answer within 5 s" in message, message
            assert 4.9 <= took <= 6.5, took
        else:
            assert "left before it answered" in message, message
            assert took < 2.0, took
        assert rec.prop("SessionActive") is False
        assert rec.prop("EnabledFeatures") == []
        assert get(ga_env, TEXT) == "1.0"
        assert get(ga_env, READER) == "false"
        assert "Apply large-text,screen-reader" in fake.calls()
        if how == "slow":
            # The undo: the agent is told the state before the call.
            assert fake.calls()[-1] == "Apply ", fake.calls()
    finally:
        fake.stop()


def test_an_admitted_agent_of_another_user_replaces_the_agent_which_is_released(ga_env, system, kiosk, journal):
    system(agent_users="nobody;daemon")
    rec = Recorder(ga_env)
    session = kiosk()
    agent = session.agent().start()
    wait_prop(rec, "Agent", lambda user: user == "nobody")
    other = FakeAgent(ga_env.address, user="daemon")
    try:
        assert other.registration == "registered"
        assert rec.prop("Agent") == "daemon"
        agent.wait_for_log("released by the GuidedAccess service")
        assert agent.process.poll() is None, "a released agent waits; it does not exit"
        start_session(rec, "large-text")
        assert "Apply large-text" in other.calls()
    finally:
        other.stop()
    registered = [r for r in journal() if r.get("MESSAGE_ID") == REGISTERED]
    assert [r["GUIDEDACCESS_AGENT_USER"] for r in registered] == ["nobody", "daemon"]


# ---------------------------------------------------------------- one of the two per session


def test_the_agent_and_the_user_mode_service_never_both_act_for_one_session(ga_env, system, kiosk):
    system()
    session = kiosk()
    agent = session.agent().start()
    rec = Recorder(ga_env)
    wait_prop(rec, "Agent", lambda user: user == "nobody")
    user_service = subprocess.run(
        [*session.as_user(), str(readable(DAEMON_BINARY)), "--user", "--address", session.address],
        env=session.env, capture_output=True, text=True, timeout=20)
    assert user_service.returncode == 78, user_service.stderr
    assert "the session agent" in user_service.stderr, user_service.stderr
    agent.stop()
    # The other way round: the user-mode service first.
    service = subprocess.Popen(
        [*session.as_user(), str(readable(DAEMON_BINARY)), "--user", "--address", session.address],
        env=session.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: service.poll() is not None or subprocess.run(
            ["busctl", f"--address={session.address}", "status", "org.guidedaccess.GuidedAccess1"],
            capture_output=True).returncode == 0, "the user-mode service", timeout=15)
        assert service.poll() is None, service.stderr.read()
        second = session.agent()
        second.start()
        assert second.wait_exit(timeout=20) == 78
        assert "the user-mode service" in second.log(), second.log()
    finally:
        service.terminate()
        service.wait(timeout=10)


def test_the_agent_activates_the_system_service_when_it_starts(ga_env, kiosk, journal):
    """No service runs; the bus can start it (a .service file, as the package
    installs for the system bus): the agent's RegisterAgent starts it, and
    registers. Without that file it waits (the cost of waiting, 0 wake-ups,
    is in scripts/bench-agent)."""
    config = ga_env.write_config("[Service]\nBackend=memory\nDesktop=sway\n[Agent]\nAllowUsers=nobody\n")
    services = ga_env.root / "services"
    services.mkdir()
    log = ga_env.root / "activated.log"
    (services / "org.guidedaccess.GuidedAccess1.service").write_text(
        "[D-BUS Service]\nName=org.guidedaccess.GuidedAccess1\n"
        f"Exec=/bin/sh -c 'exec {DAEMON_BINARY} --system --address {ga_env.address} --state-dir {ga_env.state_dir} "
        f"--config {config} >>{log} 2>&1'\n")
    conf = ga_env.root / "bus.conf"
    conf.write_text(conf.read_text().replace("</busconfig>", f"  <servicedir>{services}</servicedir>\n</busconfig>"))
    bus = dbus.bus.BusConnection(ga_env.address)
    bus.call_blocking("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "ReloadConfig", "", ())
    assert not bus.name_has_owner("org.guidedaccess.GuidedAccess1")
    session = kiosk()
    started = time.monotonic()
    agent = session.agent().start()
    agent.wait_for_log("registered as the session agent", timeout=20)
    took = time.monotonic() - started
    assert bus.name_has_owner("org.guidedaccess.GuidedAccess1")
    assert "system mode" in log.read_text(), log.read_text()
    rec = Recorder(ga_env)
    assert rec.prop("Agent") == "nobody"
    print(f"agent start → registered with the service it activated: {took * 1000:.0f} ms")
    # The activated service is not a fixture's: stop it here.
    pid = bus.call_blocking("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                            "GetConnectionUnixProcessID", "s", ("org.guidedaccess.GuidedAccess1",))
    os.kill(int(pid), signal.SIGTERM)


def test_without_allow_users_an_agent_whose_user_leaves_seat0_is_released_and_comes_back_with_it(
        ga_env, system, kiosk, journal):
    logind = seat_session(ga_env, "sway", uid=65534, user="nobody")
    system(agent_users=None)
    rec = Recorder(ga_env)
    session = kiosk()
    agent = session.agent().start()
    wait_prop(rec, "Agent", lambda user: user == "nobody")
    # Another user's session becomes seat0's active one: the agent goes.
    seat_session(ga_env, "sway", logind=logind, session_id="c2", uid=1, user="daemon")
    wait_prop(rec, "Agent", lambda user: user == "")
    agent.wait_for_log("released by the GuidedAccess service")
    assert "screen-reader" not in rec.prop("SupportedFeatures")
    # Other changes of that session do not make it ask again (and be refused).
    other = dbus.bus.BusConnection(ga_env.address).get_object(LOGIND[0], "/org/freedesktop/login1/session/c2")
    other.UpdateProperties("org.freedesktop.login1.Session", {"IdleHint": True},
                           dbus_interface="org.freedesktop.DBus.Mock")
    rec.settle(0.5)
    assert [r for r in journal() if r.get("MESSAGE_ID") == REFUSED] == []
    # The kiosk user's session is active again: the agent registers again.
    mark = len(agent.log())
    seat_session(ga_env, "sway", logind=logind, session_id="c3", uid=65534, user="nobody")
    wait_prop(rec, "Agent", lambda user: user == "nobody")
    agent.wait_for_log("registered as the session agent", since=mark)
