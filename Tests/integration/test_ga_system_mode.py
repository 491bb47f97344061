"""guidedaccessd --system with polkit and logind as python-dbusmock templates.

The private bus of each test stands in for the system bus: the mocks own
org.freedesktop.PolicyKit1 and org.freedesktop.login1 on it, and the daemon
runs in system mode on it (memory backend: the dconf lockdown has tests of
its own). Callers other than root come from `setpriv --reuid=65534`.
"""

import os
import subprocess
import sys
import time

import dbus
import pytest

from conftest import LOGIND, POLKIT, seat_session, start_guidedaccessd, start_mock
from gadaemon import GA_ERROR, Recorder, SupportChanged, pump

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
START = "org.guidedaccess.GuidedAccess1.start-session"
END = "org.guidedaccess.GuidedAccess1.end-session"
MANAGE = "org.guidedaccess.GuidedAccess1.manage-restrictions"

pytest.importorskip("dbusmock", reason="python-dbusmock is installed by scripts/install-deps into .venv")


@pytest.fixture
def system_daemon(ga_env):
    config = ga_env.write_config("[Service]\nBackend=memory\n")
    return lambda: start_guidedaccessd(ga_env, config=config, args=("--system",))


def argv_mode(daemon):
    # The fixture's daemon is started with --user first; --system given after
    # it wins, as with any repeated flag.
    return daemon.argv


def session_active(env):
    code, out, _ = env.busctl("get-property", "org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                              "org.guidedaccess.GuidedAccess1", "SessionActive")
    assert code == 0, out
    return out.strip() == "b true"


def start_as_nobody(env, options=("0",), interactive=False):
    # busctl allows interactive authorization unless told not to.
    flag = "--allow-interactive-authorization=" + ("yes" if interactive else "no")
    return env.busctl_call("StartSession", "a{sv}", *options, prefix=NOBODY, options=(flag,))


def test_polkit_grant_admits_a_caller_not_on_the_lists(ga_env, system_daemon):
    polkit = start_mock(ga_env, "polkitd")
    polkit.SetAllowed([START], dbus_interface="org.freedesktop.DBus.Mock")
    system_daemon()
    code, out, err = start_as_nobody(ga_env)
    assert code == 0, err
    assert session_active(ga_env)


def test_polkit_denial_is_not_authorized_and_changes_nothing(ga_env, system_daemon):
    start_mock(ga_env, "polkitd")  # allows nothing
    system_daemon()
    code, _, err = start_as_nobody(ga_env)
    assert code != 0
    assert "polkit does not allow" in err and START in err, err
    assert (f"to admit uid 65534 running /usr/bin/busctl, add [Clients] AllowUsers=nobody or "
            f"AllowExecutables=/usr/bin/busctl to guidedaccess.conf (see guidedaccess.conf(5)), or allow {START} "
            f"in a polkit rule") in err, err
    assert not session_active(ga_env)


def test_polkit_asking_for_authentication_names_what_an_unattended_kiosk_does_instead(ga_env, system_daemon):
    """polkit would ask (auth_admin): a non-interactive call is
    InteractiveAuthorizationRequired, whose message says what a kiosk with
    no one at it does instead (admit the program) before the interactive way."""
    polkit = start_mock(ga_env, "polkitd")
    polkit.AddMethod("org.freedesktop.PolicyKit1.Authority", "CheckAuthorization", "(sa{sv})sa{ss}us", "(bba{ss})",
                     "ret = (False, True, {})", dbus_interface="org.freedesktop.DBus.Mock")
    system_daemon()
    code, _, err = start_as_nobody(ga_env)
    assert code != 0
    assert "needs authentication, which an unattended kiosk cannot give" in err, err
    assert "[Clients] AllowUsers=nobody or AllowExecutables=/usr/bin/busctl" in err and "polkit rule" in err, err
    assert "ALLOW_INTERACTIVE_AUTHORIZATION" in err, err
    assert not session_active(ga_env)


def test_polkit_not_answering_is_denied_within_its_timeout(ga_env, system_daemon):
    polkit = start_mock(ga_env, "polkitd")
    polkit.SimulateHang(True, dbus_interface="org.freedesktop.DBus.Mock")
    system_daemon()
    began = time.monotonic()
    code, _, err = start_as_nobody(ga_env)
    took = time.monotonic() - began
    assert code != 0
    assert "did not answer in time" in err, err
    assert 4 < took < 10, took
    assert not session_active(ga_env)


def test_an_interactive_caller_waits_longer_for_polkit_than_a_non_interactive_one(ga_env, system_daemon):
    polkit = start_mock(ga_env, "polkitd")
    polkit.SetDelay(dbus.Double(6.0), dbus_interface="org.freedesktop.DBus.Mock")
    polkit.SetAllowed([START], dbus_interface="org.freedesktop.DBus.Mock")
    system_daemon()
    code, _, err = start_as_nobody(ga_env, interactive=True)
    assert code == 0, err
    assert session_active(ga_env)


def test_polkit_absent_is_denied_saying_so(ga_env, system_daemon):
    system_daemon()
    code, _, err = start_as_nobody(ga_env)
    assert code != 0
    assert "polkit is not available" in err, err
    assert not session_active(ga_env)


def test_root_is_client_and_operator_without_polkit(ga_env, system_daemon):
    system_daemon()  # no polkit on the bus at all
    code, _, err = ga_env.busctl_call("StartSession", "a{sv}", "0")
    assert code == 0, err
    code, _, err = ga_env.busctl_call("EndSession")
    assert code == 0, err


def test_end_session_by_a_non_operator_asks_polkit_for_end_session(ga_env, system_daemon):
    polkit = start_mock(ga_env, "polkitd")
    polkit.SetAllowed([START], dbus_interface="org.freedesktop.DBus.Mock")
    system_daemon()
    code, _, err = ga_env.busctl_call("StartSession", "a{sv}", "0")  # root's session
    assert code == 0, err
    code, _, err = ga_env.busctl_call("EndSession", prefix=NOBODY)
    assert code != 0 and END in err, err
    assert session_active(ga_env)
    polkit.SetAllowed([START, END], dbus_interface="org.freedesktop.DBus.Mock")
    code, _, err = ga_env.busctl_call("EndSession", prefix=NOBODY)
    assert code == 0, err
    assert not session_active(ga_env)


def test_set_restriction_state_by_a_non_operator_asks_polkit_for_manage_restrictions(ga_env, system_daemon):
    polkit = start_mock(ga_env, "polkitd")
    system_daemon()
    assert ga_env.busctl_call("RegisterRestrictions", "a(sss)", "1", "org.example.print", "Printing", "")[0] == 0
    assert ga_env.busctl_call("StartSession", "a{sv}", "0")[0] == 0
    code, _, err = ga_env.busctl_call("SetRestrictionState", "ss", "org.example.print", "deny", prefix=NOBODY)
    assert code != 0 and MANAGE in err, err
    polkit.SetAllowed([MANAGE], dbus_interface="org.freedesktop.DBus.Mock")
    code, _, err = ga_env.busctl_call("SetRestrictionState", "ss", "org.example.print", "deny", prefix=NOBODY)
    assert code == 0, err
    code, out, _ = ga_env.busctl_call("GetRestrictionState", "s", "org.example.print")
    assert out.strip() == 's "deny"'


def inhibitors(logind):
    return [tuple(map(str, i[:4])) for i in logind.ListInhibitors(dbus_interface="org.freedesktop.login1.Manager")]


def wait_for(condition, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_a_session_holds_a_sleep_idle_inhibitor_and_releases_it_at_the_end(ga_env, system_daemon):
    logind = start_mock(ga_env, "logind")
    system_daemon()
    assert inhibitors(logind) == []
    assert ga_env.busctl_call("StartSession", "a{sv}", "0")[0] == 0
    assert wait_for(lambda: inhibitors(logind) != [])
    [(what, who, _, mode)] = inhibitors(logind)
    assert (what, who, mode) == ("sleep:idle", "GuidedAccess", "block")
    assert ga_env.busctl_call("EndSession")[0] == 0
    assert wait_for(lambda: inhibitors(logind) == []), inhibitors(logind)


def test_an_end_queued_behind_a_start_leaves_no_inhibitor_and_no_late_started(ga_env, system_daemon):
    # StartSession waits for the bus (the owner's match rule) after the session
    # begins; an EndSession pipelined behind it ends the session meanwhile.
    # The start must then take no sleep inhibitor and send no "started" after
    # the "ended".
    from gadaemon import Recorder, pump

    logind = start_mock(ga_env, "logind")
    system_daemon()
    rec = Recorder(ga_env)
    rec.clear()
    rec.call_async("StartSession", "a{sv}", ({},))
    rec.call_async("EndSession")
    replies = lambda: [e[:2] for e in rec.events if e[0] in ("reply", "error")]  # noqa: E731
    assert pump(lambda: len(replies()) == 2, 10), rec.events
    assert sorted(replies()) == [("reply", "EndSession"), ("reply", "StartSession")], rec.events
    rec.settle(0.5)
    assert rec.prop("SessionActive") is False
    assert [e for e in rec.events if e[0] == "SessionChanged"] == [
        ("SessionChanged", True, "started"), ("SessionChanged", False, "ended")], rec.events
    assert inhibitors(logind) == []


def test_inhibit_sleep_false_takes_no_inhibitor(ga_env, system_daemon):
    logind = start_mock(ga_env, "logind")
    system_daemon()
    assert ga_env.busctl_call("StartSession", "a{sv}", "1", "inhibit-sleep", "b", "false")[0] == 0
    time.sleep(0.3)
    assert inhibitors(logind) == []


def test_logind_absent_is_logged_and_the_session_starts(ga_env, system_daemon):
    daemon = system_daemon()
    assert ga_env.busctl_call("StartSession", "a{sv}", "0")[0] == 0
    assert session_active(ga_env)
    assert wait_for(lambda: "no sleep inhibitor" in daemon.log())


# ---------------------------------------------------------------- the desktop (spec: "Making features real")


def start_dconf_system_daemon(env, config=""):
    """System mode with the dconf backend (the desktop decides what it
    supports; the memory backend realises everything) on a database of the
    test's; `dconf update` announces on the test's bus."""
    (env.root / "db").mkdir()
    config = env.write_config(
        f"[Service]\nBackend=dconf\n{config}[Dconf]\nDatabaseDir={env.root}/db\nLockOutsideSession=false\n")
    return start_guidedaccessd(env, config=config, args=("--system",), extra_env={"DBUS_SYSTEM_BUS_ADDRESS": env.address})


def screen_reader_refusal(rec):
    name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["screen-reader"], signature="s")},))
    assert name == GA_ERROR + "UnsupportedFeature", message
    assert rec.prop("SessionActive") is False
    return message


ALL = ["grayscale", "high-contrast", "invert-colors", "large-text", "on-screen-keyboard", "reduce-motion",
       "screen-reader", "zoom"]
# The way out is named: the unit to enable for the kiosk user, the key that admits it.
NO_AGENT = ("no session agent is registered (guidedaccess-agent.service of the kiosk user: systemctl --global enable "
            "guidedaccess-agent.service starts it at the login, [Agent] AllowUsers= admits the user)")


def no_reader(why):
    """The refusal of screen-reader in system mode without an agent."""
    return (f"screen-reader: {NO_AGENT}; without one, the screen reader comes only from a GNOME session, whose "
            f"gnome-session starts Orca from its key, and {why}")


@pytest.mark.parametrize("logind", [False, True], ids=["no logind", "logind without a session"])
def test_with_no_desktop_running_system_mode_claims_nothing_and_says_what_would_deliver_it(ga_env, logind):
    # gnome-shell and Orca's autostart entry are installed on this machine:
    # no evidence of what the kiosk runs.
    assert os.path.exists("/etc/xdg/autostart/orca-autostart.desktop")
    if logind:
        start_mock(ga_env, "logind")
    daemon = start_dconf_system_daemon(ga_env)
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "none"
    assert rec.prop("SupportedFeatures") == []
    assert screen_reader_refusal(rec) == no_reader("logind reports no graphical session on seat0")
    name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
    assert (name, message) == (
        GA_ERROR + "UnsupportedFeature",
        "zoom: the desktop 'none' does not act on it (gnome-shell and gnome-kiosk do; logind reports no graphical "
        "session on seat0; [Service] Desktop= names the desktop)")
    assert "desktop: none (logind: no graphical session on seat0)" in daemon.log()
    assert "installed" not in daemon.log()


def test_a_gnome_session_on_seat0_delivers_every_feature_the_screen_reader_through_gnome_session(ga_env):
    seat_session(ga_env, "gnome")
    daemon = start_dconf_system_daemon(ga_env)
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "gnome-shell"
    assert rec.prop("SupportedFeatures") == ALL
    assert "screen reader started by the GNOME session from its key" in daemon.log()
    rec.call("StartSession", "a{sv}", ({"features": dbus.Array(["screen-reader"], signature="s")},))
    assert rec.prop("EnabledFeatures") == ["screen-reader"]


def test_system_mode_takes_its_desktop_from_seat0s_active_graphical_session(ga_env):
    seat_session(ga_env, "sway")
    daemon = start_dconf_system_daemon(ga_env)
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "sway"
    # GTK apps read the locked keys; the system service cannot start a screen
    # reader in the user's session, and sway starts none from the key.
    assert rec.prop("SupportedFeatures") == ["high-contrast", "large-text", "reduce-motion"]
    assert "desktop: sway (logind: seat0's session, sway)" in daemon.log()
    assert screen_reader_refusal(rec) == no_reader("nothing on sway starts a screen reader from its key")


def test_the_configured_desktop_is_taken_as_configured_and_the_screen_reader_still_needs_a_gnome_session(ga_env):
    start_mock(ga_env, "logind")
    daemon = start_dconf_system_daemon(ga_env, config="Desktop=gnome-shell\n")
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "gnome-shell"
    assert rec.prop("SupportedFeatures") == [f for f in ALL if f != "screen-reader"]
    assert "desktop: gnome-shell ([Service] Desktop=)" in daemon.log()
    assert screen_reader_refusal(rec) == no_reader("logind reports no graphical session on seat0")


def test_the_seat_is_followed_live_a_gnome_session_logging_in_and_the_seat_going_back_to_none(ga_env):
    logind = start_mock(ga_env, "logind")
    start_dconf_system_daemon(ga_env)
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "none"
    rec.clear()
    seat_session(ga_env, "gnome", logind=logind)
    arrived = SupportChanged("gnome-shell", ALL)
    assert pump(lambda: arrived in rec.events, 5), f"no PropertiesChanged for the GNOME session: {rec.events}"
    # The session leaves the seat (the greeter again): nothing is claimed.
    seat = dbus.bus.BusConnection(ga_env.address).get_object(LOGIND[0], "/org/freedesktop/login1/seat/seat0")
    seat.UpdateProperties("org.freedesktop.login1.Seat", {"ActiveSession": ("", dbus.ObjectPath("/"))},
                          dbus_interface="org.freedesktop.DBus.Mock")
    left = SupportChanged("none", [])
    assert pump(lambda: left in rec.events, 5), f"no PropertiesChanged for the seat left empty: {rec.events}"


# ---------------------------------------------------------------- polkit under a flood

FLOODER = """
import sys
import dbus
import dbus.bus

bus = dbus.bus.BusConnection(sys.argv[1])
name, path, interface = "org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1", "org.guidedaccess.GuidedAccess1"
for _ in range(int(sys.argv[2])):
    message = dbus.lowlevel.MethodCallMessage(name, path, interface, "StartSession")
    message.append(dbus.Dictionary({}, signature="sv"), signature="a{sv}")
    message.set_no_reply(True)
    bus.send_message(message)
# The service handles one connection's calls in order: once it answers this,
# it has taken up every call above.
bus.call_blocking(name, path, "org.freedesktop.DBus.Peer", "Ping", "", ())
print("sent", flush=True)
sys.stdin.readline()  # the connection stays until the test is done
"""


def flood(env, calls):
    """nobody sends `calls` StartSession calls that want no reply on one
    connection, which stays until the test ends."""
    script = env.root / "flood.py"
    script.write_text(FLOODER)
    flooder = subprocess.Popen([*NOBODY, "/usr/bin/python3", str(script), env.address, str(calls)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env.env)
    env._extra_processes.append(flooder)
    assert flooder.stdout.readline().strip() == "sent"


@pytest.fixture
def system_bus_limits_env(request):
    """ga_env with dbus-daemon's own limit of 128 pending replies per
    connection (the system bus's), not session.conf's 50000."""
    import gadaemon

    env = gadaemon.GAEnv(max_replies_per_connection=None)
    request.node._dbus_buses = [env]
    yield env
    env.stop()


def polkit_checks_asked(env):
    return (env.root / "mock-polkitd.log").read_text().count("CheckAuthorization")


def test_a_flood_of_unanswered_polkit_checks_denies_the_flooder_at_once_not_an_operator(system_bus_limits_env):
    env = system_bus_limits_env
    polkit = start_mock(env, "polkitd")
    # polkit never answers the flood's checks (as if each waited for a
    # password) and grants end-session at once.
    polkit.SimulateHangActions([START], dbus_interface="org.freedesktop.DBus.Mock")
    polkit.SetAllowed([END], dbus_interface="org.freedesktop.DBus.Mock")
    start_guidedaccessd(env, config=env.write_config("[Service]\nBackend=memory\n"), args=("--system",))
    assert env.busctl_call("StartSession", "a{sv}", "0")[0] == 0  # root's session
    flood(env, 300)
    # An operator polkit admits (another user: daemon, uid 1) ends the session meanwhile.
    code, _, err = env.busctl_call("EndSession", prefix=("setpriv", "--reuid=1", "--regid=1", "--clear-groups"))
    assert code == 0, err
    assert not session_active(env)
    # The flood's user is told at once, and polkit was asked only a few times.
    began = time.monotonic()
    code, _, err = start_as_nobody(env)
    assert code != 0 and "too many polkit checks in flight for uid 65534" in err, err
    assert time.monotonic() - began < 2
    assert polkit_checks_asked(env) == 5  # four of the flood's, and the operator's
    polkit.ReleaseHangingCalls(dbus_interface="org.freedesktop.DBus.Mock")


def test_a_check_polkit_has_not_answered_counts_after_its_caller_was_denied_for_the_wait(system_bus_limits_env):
    # The bus counts it against the service until polkit answers.
    env = system_bus_limits_env
    polkit = start_mock(env, "polkitd")
    polkit.SimulateHangActions([START], dbus_interface="org.freedesktop.DBus.Mock")
    start_guidedaccessd(env, config=env.write_config("[Service]\nBackend=memory\n"), args=("--system",))
    flood(env, 4)
    time.sleep(5.5)  # past the service's 5 s wait for polkit
    code, _, err = start_as_nobody(env)
    assert code != 0 and "too many polkit checks in flight for uid 65534" in err, err
    polkit.SimulateHangActions([], dbus_interface="org.freedesktop.DBus.Mock")
    polkit.ReleaseHangingCalls(dbus_interface="org.freedesktop.DBus.Mock")
    time.sleep(0.2)
    code, _, err = start_as_nobody(env)
    assert code != 0 and "polkit does not allow" in err, err
