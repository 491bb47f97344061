"""guidedaccessd in user mode runs the screen reader as a transient unit of
the kiosk user's own systemd manager (systemd 252), in a container from the
speech root filesystem (conftest `speech_container`: Orca 43,
speech-dispatcher with espeak-ng, Xvfb on :5, the user `tester` with linger).

The service is the installed user unit, D-Bus activated on tester's session
bus, with one drop-in of the kiosk's: DISPLAY=:5, so the desktop is `x11`,
whose one feature is the screen reader. The client is gdbus, which we did
not write; what Orca says is read from speech-dispatcher's log. The steps
run in order on the one container; the figures are printed (-s) and in the
run's summary.
"""

import json
import re
import time

import pytest
import user_session as us
from container_setup import FACTS, KIOSK_UID, KIOSK_USER

SERVICE = "guidedaccessd-user.service"
BUS_NAME = "org.guidedaccess.GuidedAccess1"
OBJECT = "/org/guidedaccess/GuidedAccess1"
READERS = "guidedaccess-screen-reader-*.service"
APP_SLICE = f"/user.slice/user-{KIOSK_UID}.slice/user@{KIOSK_UID}.service/app.slice/"
KEY = ("org.gnome.desktop.a11y.applications", "screen-reader-enabled")
GAVE_UP = "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a57"
DROP_INS = f"/home/{KIOSK_USER}/.config/systemd/user/{SERVICE}.d"
WITH_SCREEN_READER = "{'features': <['screen-reader']>}"

# What a step leaves for the next: the running unit, its Orca, the
# service's pid after a restart.
RUN = {}


# --- the client, the units, the logs ------------------------------------------


def gdbus(ct, method, *args):
    """`gdbus call` as the kiosk user: (reply, when it came, in seconds since
    the epoch, taken in the container as gdbus exits)."""
    out = ct.run(["sh", "-c", 'gdbus call --session "$@" && date +%s.%N', "sh", "--dest", BUS_NAME,
                  "--object-path", OBJECT, "--method", method, *args], user=KIOSK_USER).stdout
    reply, stamp = out.strip().rsplit("\n", 1)
    return reply, float(stamp)


def call(ct, method, *args):
    return gdbus(ct, f"{BUS_NAME}.{method}", *args)


def prop(ct, name):
    return gdbus(ct, "org.freedesktop.DBus.Properties.Get", BUS_NAME, name)[0]


def service_pid(ct):
    return int(us.unit(ct, SERVICE, "MainPID")["MainPID"])


def readers(ct):
    """The screen reader units the user's manager has loaded, in any state."""
    out = us.systemctl(ct, "list-units", "--all", "--plain", "--no-legend", READERS).stdout
    return [line.split()[0] for line in out.splitlines()]


def running_reader(ct, other_than=()):
    """(name, main pid) of an active screen reader unit not in OTHER_THAN,
    once there is one."""
    def found():
        for name in readers(ct):
            state = us.unit(ct, name, "ActiveState", "MainPID")
            if name not in other_than and state["ActiveState"] == "active" and state["MainPID"] != "0":
                return name, int(state["MainPID"])
        return None

    return us.wait_for(found, f"a running screen reader unit other than {list(other_than)}", timeout=10)


def orcas(ct):
    """The kiosk user's Orca processes."""
    out = ct.run(["pgrep", "-u", KIOSK_USER, "-x", "orca"], check=False).stdout
    return sorted(int(pid) for pid in out.split())


def wait_gone(ct, name, timeout=5.0):
    """Waits until the unit is unloaded and no Orca is left; returns when
    that was seen (seconds since the epoch)."""
    return us.wait_for(lambda: us.unit(ct, name, "LoadState")["LoadState"] == "not-found" and not orcas(ct)
                       and time.time(), f"{name} and Orca gone", timeout=timeout, interval=0.01)


def journal(ct, *matches):
    """The kiosk user's `journalctl --user -o cat` with MATCHES."""
    ct.run(["journalctl", "--sync"])
    return ct.run(["journalctl", "--user", "--no-pager", "-q", "-o", "cat", *matches], user=KIOSK_USER).stdout


def service_log(ct, pid=None):
    """The service's journal; only process PID's lines when given."""
    return journal(ct, f"_PID={pid}") if pid else journal(ct, "-u", SERVICE)


def key(ct):
    return ct.run(["gsettings", "get", *KEY], user=KIOSK_USER).stdout.strip()


def figure(name, seconds):
    FACTS[name] = f"{seconds:.2f} s"
    print(f"\n{name}: {seconds:.2f} s")


# --- the steps ------------------------------------------------------------------


def test_step1_the_first_call_activates_the_user_unit_which_sees_x11(speech_container):
    ct = speech_container
    # The session's display for the service: a drop-in of the kiosk's own.
    ct.sh(f"mkdir -p {DROP_INS} && printf '[Service]\\nEnvironment=DISPLAY={us.DISPLAY}\\n' > {DROP_INS}/display.conf",
          user=KIOSK_USER)
    us.systemctl(ct, "daemon-reload")
    assert us.unit(ct, SERVICE, "ActiveState")["ActiveState"] == "inactive"
    # dbus-daemon asks the manager to start SystemdService= for the call.
    assert prop(ct, "Desktop") == "(<'x11'>,)"
    assert prop(ct, "SupportedFeatures") == "(<['screen-reader']>,)"
    state = us.unit(ct, SERVICE, "ActiveState", "Type", "Restart", "ControlGroup", "Environment")
    assert state == {"ActiveState": "active", "Type": "dbus", "Restart": "on-failure",
                     "ControlGroup": APP_SLICE + SERVICE, "Environment": f"DISPLAY={us.DISPLAY}"}
    assert f"desktop: x11 (detected; DISPLAY={us.DISPLAY})" in service_log(ct)
    assert (key(ct), orcas(ct), readers(ct)) == ("false", [], [])


def test_step2_start_session_runs_orca_as_a_unit_of_the_users_manager_and_it_speaks(speech_container):
    ct = speech_container
    since = len(us.utterances(ct))
    _, on = call(ct, "StartSession", WITH_SCREEN_READER)
    # Named for the service's pid and its first run.
    name = f"guidedaccess-screen-reader-{service_pid(ct)}-1.service"
    assert readers(ct) == [name]
    state = us.unit(ct, name, "ActiveState", "Transient", "Type", "KillMode", "TimeoutStopUSec", "CollectMode",
                    "ControlGroup", "MainPID", "Environment", "StandardOutput")
    assert {k: state[k] for k in ("ActiveState", "Transient", "Type", "KillMode", "TimeoutStopUSec", "CollectMode")} \
        == {"ActiveState": "active", "Transient": "yes", "Type": "exec", "KillMode": "mixed",
            "TimeoutStopUSec": "500ms", "CollectMode": "inactive-or-failed"}
    assert state["ControlGroup"] == APP_SLICE + name
    assert f"DISPLAY={us.DISPLAY}" in state["Environment"].split()
    orca = int(state["MainPID"])
    assert us.comm(ct, orca) == "orca" and orcas(ct) == [orca]
    _, said = us.wait_for_utterance(ct, "Screen reader on.", since=since, timeout=5)
    figure("StartSession reply → 'Screen reader on.' in speech-dispatcher's log", said - on)
    assert said - on <= 5
    assert key(ct) == "true"
    # The unit's journal: the manager's records of it, and Orca's own output
    # (stdout and stderr are the journal; Orca 43 writes nothing when all is well).
    assert state["StandardOutput"] == "journal"
    assert f"Started {name} - " in journal(ct, "-u", name)
    RUN.update(unit=name, orca=orca)


def test_step3_orca_has_no_variables_of_the_service_unit(speech_container):
    ct = speech_container
    orca = RUN["orca"]
    environ = dict(entry.split("=", 1) for entry in
                   ct.run(["cat", f"/proc/{orca}/environ"]).stdout.split("\0") if "=" in entry)
    stderr = ct.run(["stat", "-L", "-c", "%d:%i", f"/proc/{orca}/fd/2"]).stdout.strip()
    # systemd sets both for each unit's main process: its own stream, its own pid.
    assert (environ.get("JOURNAL_STREAM"), environ.get("SYSTEMD_EXEC_PID")) == (stderr, str(orca))


def test_step4_a_killed_service_is_restarted_and_adopts_the_running_unit(speech_container):
    ct = speech_container
    name = RUN["unit"]
    before = us.unit(ct, name, "MainPID", "InvocationID")
    killed = service_pid(ct)
    ct.run(["kill", "-9", str(killed)])
    # Restart=on-failure. Type=dbus: active once it owns its name again,
    # which it requests after resuming the session from its journal.
    state = us.wait_unit(ct, SERVICE, "restarted",
                         lambda s: s["ActiveState"] == "active" and s["MainPID"] not in ("0", str(killed)),
                         "ActiveState", "MainPID", "NRestarts")
    assert state["NRestarts"] == "1"
    assert prop(ct, "SessionActive") == "(<true>,)"
    assert prop(ct, "EnabledFeatures") == "(<['screen-reader']>,)"
    time.sleep(1.0)  # a second Orca would have been started by now
    assert readers(ct) == [name]
    assert us.unit(ct, name, "MainPID", "InvocationID") == before
    assert orcas(ct) == [RUN["orca"]]
    assert f"unit {name}, started before the service restarted, adopted" in service_log(ct, state["MainPID"])


def test_step5_end_session_stops_the_unit_within_a_second(speech_container):
    ct = speech_container
    name = RUN["unit"]
    group = us.unit(ct, name, "ControlGroup")["ControlGroup"]
    _, end = call(ct, "EndSession")
    gone = wait_gone(ct, name)
    figure("EndSession reply → screen reader unit gone", gone - end)
    assert gone - end <= 1.0
    assert us.cgroup_pids(ct, group) == [] and readers(ct) == []
    # The key as it was before the session: unset.
    assert key(ct) == "false"
    assert ct.run(["dconf", "read", "/org/gnome/desktop/a11y/applications/screen-reader-enabled"],
                  user=KIOSK_USER).stdout.strip() == ""
    assert f"unit {name} stopped" in service_log(ct)


def test_step6_a_killed_orca_is_started_again_as_a_new_unit_that_speaks(speech_container):
    ct = speech_container
    pid = service_pid(ct)
    since = len(us.utterances(ct))
    call(ct, "StartSession", WITH_SCREEN_READER)
    first, orca = running_reader(ct)
    us.wait_for_utterance(ct, "Screen reader on.", since=since, timeout=5)
    since = len(us.utterances(ct))
    ct.run(["kill", "-9", str(orca)])
    killed = time.time()
    second, again = running_reader(ct, other_than=[first])
    _, said = us.wait_for_utterance(ct, "Screen reader on.", since=since, timeout=5)
    figure("kill -9 of Orca → 'Screen reader on.' again", said - killed)
    assert [first, second] == [f"guidedaccess-screen-reader-{pid}-{n}.service" for n in (1, 2)]
    assert readers(ct) == [second] and orcas(ct) == [again]
    # The manager's account of the end stays in the collected unit's journal.
    assert "Main process exited, code=killed, status=9/KILL" in journal(ct, "-u", first)
    RUN.update(unit=second, orca=again)


def test_step7_the_sixth_end_within_a_minute_gives_up(speech_container):
    ct = speech_container
    pid = service_pid(ct)
    names = [RUN["unit"]]
    ct.run(["kill", "-9", str(RUN["orca"])])  # the second end
    for run in range(3, 7):  # after 200, 400, 800, 1600 ms
        name, orca = running_reader(ct, other_than=names)
        assert name == f"guidedaccess-screen-reader-{pid}-{run}.service"
        names.append(name)
        ct.run(["kill", "-9", str(orca)])
    us.wait_for(lambda: "giving up" in service_log(ct, pid), "the service to give up")
    time.sleep(2.0)  # longer than the longest back-off: nothing starts again
    assert readers(ct) == [] and orcas(ct) == []
    assert f"exited 6 times within 60 s (last: unit {names[-1]}, unit {names[-1]} ended); giving up" \
        in service_log(ct, pid)
    # The audit record (journald's native protocol), found by its MESSAGE_ID.
    records = [json.loads(line) for line in ct.run(
        ["journalctl", "--user", "--no-pager", "-o", "json", f"MESSAGE_ID={GAVE_UP}"], user=KIOSK_USER
    ).stdout.splitlines()]
    fields = ("GUIDEDACCESS_EVENT", "GUIDEDACCESS_FEATURE", "GUIDEDACCESS_EXITS", "GUIDEDACCESS_LAST_EXIT", "PRIORITY",
              "_SYSTEMD_USER_UNIT")
    assert [{k: r.get(k) for k in fields} for r in records] == [{
        "GUIDEDACCESS_EVENT": "programGaveUp", "GUIDEDACCESS_FEATURE": "screen-reader", "GUIDEDACCESS_EXITS": "6",
        "GUIDEDACCESS_LAST_EXIT": f"unit {names[-1]} ended", "PRIORITY": "3", "_SYSTEMD_USER_UNIT": SERVICE}]
    # The session goes on without it; the feature stays on.
    assert prop(ct, "SessionActive") == "(<true>,)"
    assert prop(ct, "EnabledFeatures") == "(<['screen-reader']>,)"
    call(ct, "EndSession")


def test_step8_a_unit_that_outlived_its_session_while_the_service_was_down_is_stopped(speech_container):
    ct = speech_container
    # Restart=on-failure would bring the service back within 100 ms; the
    # session's time limit must pass while it is down.
    ct.sh(f"printf '[Service]\\nRestart=no\\n' > {DROP_INS}/no-restart.conf", user=KIOSK_USER)
    us.systemctl(ct, "daemon-reload")
    call(ct, "StartSession", "{'features': <['screen-reader']>, 'time-limit': <uint64 2>}")
    deadline = int(re.fullmatch(r"\(<uint64 (\d+)>,\)", prop(ct, "SessionDeadline")).group(1)) / 1e6
    name, orca = running_reader(ct)
    ct.run(["kill", "-9", str(service_pid(ct))])
    us.wait_unit(ct, SERVICE, "down", lambda s: s["ActiveState"] == "failed", "ActiveState")
    time.sleep(max(0.0, deadline + 0.5 - time.time()))
    # Orca outlives the killed service: its unit is not the service's.
    assert readers(ct) == [name] and orcas(ct) == [orca]
    # The next call starts the service again (D-Bus activation); it ends
    # the session before it takes its name, so the call sees none.
    active, back = gdbus(ct, "org.freedesktop.DBus.Properties.Get", BUS_NAME, "SessionActive")
    assert active == "(<false>,)"
    gone = wait_gone(ct, name)
    figure("restarted service's first reply → leftover unit gone", gone - back)
    assert gone - back <= 1.0
    assert key(ct) == "false"
    RUN["restarted"] = service_pid(ct)
    log = service_log(ct, RUN["restarted"])
    assert "its time limit passed while the service was down; ending it" in log
    assert f"unit {name} outlived its session while the service was down; stopping it" in log
    assert f"unit {name} stopped" in log


def test_step9_ending_the_expired_session_at_start_up_logs_no_error(speech_container):
    ct = speech_container
    assert journal(ct, "-p", "err", f"_PID={RUN['restarted']}") == ""


def test_step10_a_daemon_reload_of_the_users_manager_leaves_the_screen_reader_alone(speech_container):
    ct = speech_container
    call(ct, "StartSession", WITH_SCREEN_READER)
    try:
        name, orca = running_reader(ct)
        # What any `systemctl --user daemon-reload` does, a package's or the kiosk's own.
        us.systemctl(ct, "daemon-reload")
        time.sleep(1.0)  # a new unit would have been started by now
        assert (readers(ct), orcas(ct)) == ([name], [orca])
        assert "exited during the session" not in service_log(ct, service_pid(ct))
    finally:
        call(ct, "EndSession")


def test_step11_a_unit_of_ours_that_no_journal_names_is_stopped_when_the_service_starts(speech_container):
    ct = speech_container
    # What a service killed between starting a unit and journaling it leaves.
    stray = "guidedaccess-screen-reader-1-1.service"
    us.systemd_run(ct, stray.removesuffix(".service"), ["/bin/sleep", "600"])
    us.wait_unit(ct, stray, "running", lambda s: s["ActiveState"] == "active", "ActiveState")
    us.systemctl(ct, "restart", SERVICE)
    assert prop(ct, "SessionActive") == "(<false>,)"
    wait_gone(ct, stray)
    assert f"{stray}, which no journal names, is stopped" in service_log(ct, service_pid(ct))
