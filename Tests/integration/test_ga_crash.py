"""guidedaccessd: kill -9 and restart. A session survives a restart; the
same identity resumes it; EndSession restores every key; and kill -9 at
random points of a start/configure/end loop never leaves a key wrong.
Contract: docs/dbus-api.md (Restarts and failures).
The long version: stress_kill.py (not collected by pytest)."""

import contextlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time

import dbus

from gadaemon import (
    GA_ERROR, assert_keys,
    A11Y_APPS, DESKTOP_IFACE, KEY_PATHS, MAGNIFIER, Recorder, busctl_options, expected_values, kill_loop, pump,
)

UNSET = {path: None for path in KEY_PATHS}
THREE = ["grayscale", "screen-reader", "zoom"]


def ok(result):
    rc, out, err = result
    assert rc == 0, err
    return out


def session_with_three_features_then_kill9(ga_env, gad):
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=THREE, zoom_factor=("d", 5.0))))
    on = ga_env.snapshot()
    assert_keys(on, {**UNSET, **expected_values(THREE, zoom_factor=5.0)})
    gad.restart_after_kill9()
    return on, Recorder(ga_env)


def test_session_survives_kill_9_with_its_features_and_keys(ga_env, gad):
    on, rec = session_with_three_features_then_kill9(ga_env, gad)
    props = rec.props()
    assert (props["SessionActive"], props["EnabledFeatures"], props["SessionOwner"]) == (True, THREE, "")
    assert_keys(ga_env.snapshot(), on)


def test_start_session_by_the_same_identity_after_kill_9_resumes(ga_env, gad):
    on, rec = session_with_three_features_then_kill9(ga_env, gad)
    rec.clear()
    ok(ga_env.busctl_call("StartSession", *busctl_options()))
    rec.settle()
    assert [e for e in rec.events if e[0] == "SessionChanged"] == [("SessionChanged", True, "resumed")]
    assert rec.prop("EnabledFeatures") == THREE
    assert_keys(ga_env.snapshot(), on)


def test_end_session_after_kill_9_restores_every_key(ga_env, gad):
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")
    ga_env.gsettings_set(A11Y_APPS, "screen-reader-enabled", "false")
    baseline = ga_env.snapshot()
    session_with_three_features_then_kill9(ga_env, gad)
    ok(ga_env.busctl_call("EndSession"))
    assert_keys(ga_env.snapshot(), baseline)


def test_a_start_run_while_an_end_waits_for_the_bus_is_journaled_and_survives_kill_9(ga_env, gad):
    # EndSession's last steps wait for the bus (the owner's match rule goes);
    # a StartSession queued behind it runs meanwhile. The end must not journal
    # "no session" over the new session's record: after kill -9 the new session
    # is back, and its end restores every key.
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")
    baseline = ga_env.snapshot()
    rec = Recorder(ga_env)
    rec.call("StartSession", "a{sv}", ({"features": dbus.Array(["invert-colors"], signature="s")},))
    rec.clear()
    rec.call_async("EndSession")
    rec.call_async("StartSession", "a{sv}", ({"features": dbus.Array(["screen-reader", "zoom"], signature="s")},))
    replies = lambda: [e[:2] for e in rec.events if e[0] in ("reply", "error")]  # noqa: E731
    assert pump(lambda: len(replies()) == 2, 10), rec.events
    assert replies() == [("reply", "EndSession"), ("reply", "StartSession")], rec.events
    on = ga_env.snapshot()
    assert_keys(on, {**baseline, **expected_values(["screen-reader", "zoom"])})
    gad.restart_after_kill9()
    assert (rec.prop("SessionActive"), rec.prop("EnabledFeatures")) == (True, ["screen-reader", "zoom"])
    assert_keys(ga_env.snapshot(), on)
    rec.call("EndSession")
    assert_keys(ga_env.snapshot(), baseline)


def block_journal_writes(state):
    """The journal cannot be rewritten: each slot it could write is a
    non-empty directory (the live journal's inode is left alone)."""
    current = os.stat(state / "journal.json").st_ino
    blocked = []
    for slot in (state / ".journal.json.slot-a", state / ".journal.json.slot-b"):
        if not slot.exists() or slot.stat().st_ino != current:
            if slot.exists():
                slot.unlink()
            (slot / "blocker").mkdir(parents=True)
            blocked.append(slot)
    return blocked


def test_an_end_that_cannot_be_journaled_is_backend_failed_and_the_session_stays(ga_env, gad):
    # The spec: an end that cannot be recorded is BackendFailed, the session
    # stays and a retry is possible — not restored keys with a journal that
    # brings the session back at the next start.
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")
    baseline = ga_env.snapshot()
    rec = Recorder(ga_env)  # the owner, connected throughout: no take-over, no owner-left write
    rec.call("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
    rec.settle()
    zoomed = ga_env.snapshot()
    blocked = block_journal_writes(ga_env.state_dir)
    name, message = rec.error("EndSession")
    assert name == GA_ERROR + "BackendFailed", (name, message)
    assert "cannot record the end of the session" in message
    assert rec.prop("SessionActive") is True
    assert_keys(ga_env.snapshot(), zoomed)
    for slot in blocked:
        shutil.rmtree(slot)
    rec.call("EndSession")
    assert_keys(ga_env.snapshot(), baseline)
    gad.restart_after_kill9()
    assert Recorder(ga_env).prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), baseline)


def test_an_end_on_a_read_only_state_directory_fails_and_no_restart_undoes_a_later_end(ga_env, gad):
    # The reproduction: the state directory a small tmpfs, remounted
    # read-only while the session runs.
    gad.kill9()
    state = ga_env.state_dir
    for leftover in state.iterdir():
        leftover.unlink() if not leftover.is_dir() else shutil.rmtree(leftover)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state)], check=True)
    try:
        gad.start()
        rec = Recorder(ga_env)
        rec.call("StartSession", "a{sv}", ({"features": dbus.Array(["zoom", "invert-colors"], signature="s")},))
        rec.settle()
        on = ga_env.snapshot()
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        name, message = rec.error("EndSession")
        assert name == GA_ERROR + "BackendFailed", (name, message)
        assert rec.prop("SessionActive") is True
        assert_keys(ga_env.snapshot(), on)
        # Repaired: the retry ends it, and a restart does not bring it back.
        subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
        rec.call("EndSession")
        assert_keys(ga_env.snapshot(), UNSET)
        gad.restart_after_kill9()
        assert Recorder(ga_env).prop("SessionActive") is False
        assert_keys(ga_env.snapshot(), UNSET)
    finally:
        gad.kill9() if gad.alive() else None
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_a_stalled_dconf_service_fails_the_write_in_seconds_serves_others_and_its_late_write_is_undone(ga_env, gad):
    # dconf-service stopped (SIGSTOP) mid-session: ConfigureForSession is
    # BackendFailed within a few seconds instead of libdbus's 25 s, another
    # client's Properties.Get is answered meanwhile, and the write
    # dconf-service makes once it runs again is undone by EndSession.
    rec = Recorder(ga_env)
    rec.call("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
    rec.settle()
    with dconf_service_stopped(ga_env):
        started = time.monotonic()
        done = {}
        caller = threading.Thread(target=lambda: done.update(error=rec.error(
            "ConfigureForSession", "asb", (dbus.Array(["grayscale"], signature="s"), True))))
        caller.start()
        time.sleep(0.5)
        other = Recorder(ga_env)
        asked = time.monotonic()
        assert other.prop("SessionActive") is True
        get_seconds = time.monotonic() - asked
        caller.join(timeout=20)
        failed_after = time.monotonic() - started
    assert get_seconds < 1.0, f"Properties.Get took {get_seconds:.2f} s while dconf-service was stopped"
    name, message = done["error"]
    assert name == GA_ERROR + "BackendFailed", (name, message)
    assert failed_after < 10, f"BackendFailed after {failed_after:.1f} s"
    assert rec.prop("EnabledFeatures") == ["zoom"]
    # Once it runs again, dconf-service makes the write it had queued.
    assert pump(lambda: ga_env.dconf_read("/org/gnome/desktop/a11y/magnifier/color-saturation") is not None, 5), \
        "dconf-service never made the queued write"
    rec.call("EndSession")
    assert_keys(ga_env.snapshot(), UNSET)


@contextlib.contextmanager
def dconf_service_stopped(env):
    """dconf-service stopped (SIGSTOP) for the block, then running again."""
    bus = dbus.bus.BusConnection(env.address)
    try:
        pid = int(bus.call_blocking(
            "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
            "GetConnectionUnixProcessID", "s", ("ca.desrt.dconf",)))
    finally:
        bus.close()
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_time_limit_that_passed_while_down_ends_the_session_at_start_up(ga_env, gad):
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["invert-colors"], time_limit=("t", 1))))
    gad.kill9()
    time.sleep(1.5)
    gad.start()
    rec = Recorder(ga_env)
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)


def test_kill_9_at_random_points_of_a_session_loop_leaves_no_key_wrong(ga_env, gad):
    # A baseline with user-set values among unset keys.
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")
    ga_env.gsettings_set(DESKTOP_IFACE, "enable-animations", "true")
    ga_env.gsettings_set(A11Y_APPS, "screen-reader-enabled", "false")
    baseline = ga_env.snapshot()
    seed = int(os.environ.get("GA_SEED", random.randrange(1 << 30)))
    kills = int(os.environ.get("GA_KILLS", 24))
    lines = []
    try:
        stats = kill_loop(ga_env, gad, kills, random.Random(seed), baseline, log=lines.append)
    except (AssertionError, RuntimeError, TimeoutError) as error:
        raise AssertionError(f"GA_SEED={seed}: {type(error).__name__}: {error}\n" + "\n".join(lines[-5:])) from None
    assert stats["kills"] >= 20
    # The loop must really have hit sessions: otherwise it tested nothing.
    assert stats["session_active_after_restart"] >= kills // 4, (seed, stats)
    assert stats["keys_on_after_restart"] >= kills // 5, (seed, stats)


def test_time_limit_still_ends_the_session_after_a_restart_before_it(ga_env, gad):
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["grayscale"], time_limit=("t", 2))))
    gad.restart_after_kill9()
    rec = Recorder(ga_env)
    assert rec.prop("SessionActive") is True
    assert rec.wait_for(("SessionChanged", False, "time-limit"), 5), rec.events
    assert_keys(ga_env.snapshot(), UNSET)


# The journal is written before the settings; kill -9 between the two leaves
# it one call ahead. These tests make that state by hand (the window is a few
# milliseconds wide): the daemon is killed, then the keys or the journal are
# set back to where they were before the last call's settings write.

def journal(ga_env):
    import json
    path = ga_env.state_dir / "journal.json"
    return path, json.loads(path.read_text())


def test_journal_ahead_of_a_turn_on_puts_the_keys_in_line_at_start_up(ga_env, gad):
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom"])))
    before = ga_env.snapshot()
    ok(ga_env.busctl_call("ConfigureForSession", "asb", "1", "screen-reader", "true"))
    gad.kill9()
    # The journal has screen-reader; its key never reached dconf.
    ga_env.run(["dconf", "reset", f"/{A11Y_APPS.replace('.', '/')}/screen-reader-enabled"])
    assert_keys(ga_env.snapshot(), before)
    gad.start()
    rec = Recorder(ga_env)
    assert rec.prop("EnabledFeatures") == ["screen-reader", "zoom"]
    assert_keys(ga_env.snapshot(), {**UNSET, **expected_values(["screen-reader", "zoom"])})
    ok(ga_env.busctl_call("EndSession"))
    assert_keys(ga_env.snapshot(), UNSET)


def test_journal_ahead_of_a_turn_off_puts_the_keys_back_at_start_up(ga_env, gad):
    import json
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")
    baseline = ga_env.snapshot()
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom", "grayscale"])))
    gad.kill9()
    # As if ConfigureForSession(zoom, grayscale off) had journaled and died
    # before restoring the keys.
    path, state = journal(ga_env)
    state["session"]["features"] = []
    path.write_text(json.dumps(state))
    gad.start()
    rec = Recorder(ga_env)
    assert rec.prop("EnabledFeatures") == []
    assert_keys(ga_env.snapshot(), baseline)
    ok(ga_env.busctl_call("EndSession"))
    assert_keys(ga_env.snapshot(), baseline)


def _session_of_a_connected_app(ga_env, features):
    import dbus
    # A kiosk app that stays connected: its session's journal is not
    # rewritten by an owner leaving the bus.
    app = Recorder(ga_env)
    app.call("StartSession", "a{sv}", [dbus.Dictionary(
        {"features": dbus.Array(features, signature="s")}, signature="sv")])
    return app


def _journaled_keys(ga_env):
    _, state = journal(ga_env)
    return [entry["key"] for entry in state["drivers"]["settings"]["snapshot"]]


def test_the_journal_lets_go_of_given_back_keys_once_calls_pause(ga_env, gad):
    app = _session_of_a_connected_app(ga_env, ["zoom", "screen-reader"])
    app.call("ConfigureForSession", "asb", [["zoom"], False])
    deadline = time.monotonic() + 5
    while "mag-factor" in _journaled_keys(ga_env):
        assert time.monotonic() < deadline, "the journal still lists the magnifier's keys 5 s after zoom went off"
        time.sleep(0.05)
    assert _journaled_keys(ga_env) == ["screen-reader-enabled"]
    # The user turns the magnifier on themselves — a value the session also
    # writes; a restart now must leave it alone.
    ga_env.gsettings_set(A11Y_APPS, "screen-magnifier-enabled", "true")
    gad.restart_after_kill9()
    assert Recorder(ga_env).prop("EnabledFeatures") == ["screen-reader"]
    app.call("EndSession")
    assert ga_env.snapshot()["/org/gnome/desktop/a11y/applications/screen-magnifier-enabled"] is True


def test_a_key_given_back_and_changed_by_the_user_stays_after_a_restart(ga_env, gad):
    import json
    app = _session_of_a_connected_app(ga_env, ["zoom", "screen-reader"])
    path, before = journal(ga_env)
    app.call("ConfigureForSession", "asb", [["zoom"], False])
    # The session gave the magnifier's keys back; the user now sets their own.
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "5.0")
    gad.kill9()
    # The journal as the turn-off wrote it, before its later rewrite: the
    # features without zoom, the snapshot still listing zoom's keys.
    before["session"]["features"] = ["screen-reader"]
    path.write_text(json.dumps(before))
    gad.start()
    assert Recorder(ga_env).prop("EnabledFeatures") == ["screen-reader"]
    assert ga_env.snapshot()["/org/gnome/desktop/a11y/magnifier/mag-factor"] == 5.0
    # Start-up journaled what it decided.
    assert _journaled_keys(ga_env) == ["screen-reader-enabled"]
    app.call("EndSession")
    assert ga_env.snapshot()["/org/gnome/desktop/a11y/magnifier/mag-factor"] == 5.0


def test_a_fifo_in_place_of_the_journal_is_kept_aside_and_start_up_goes_on(ga_env, gad):
    # open() of a FIFO waits for a writer: start-up must not.
    gad.kill9()
    path = ga_env.state_dir / "journal.json"
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    gad.start()
    assert Recorder(ga_env).prop("SessionActive") is False
    assert not path.exists()
    assert list(ga_env.state_dir.glob("journal.corrupt-*"))
    assert "not a regular file" in gad.log()


def test_a_journal_with_values_no_caller_could_set_is_corrupt_not_resumed(ga_env, gad):
    # Zoom factor -5: resumed before with zoom reported on and nothing applied.
    import json
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom"])))
    gad.kill9()
    path, record = journal(ga_env)
    record["session"]["zoomFactor"] = -5
    path.write_text(json.dumps(record))
    gad.start()
    assert Recorder(ga_env).prop("SessionActive") is False
    assert list(ga_env.state_dir.glob("journal.corrupt-*"))
    assert "zoom factor -5.0 is outside" in gad.log()


def test_a_session_whose_first_write_dconf_service_does_not_answer_does_not_start_and_changes_nothing(ga_env, gad):
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")  # dconf-service runs
    baseline = ga_env.snapshot()
    with dconf_service_stopped(ga_env):
        rec = Recorder(ga_env)
        name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["grayscale"], signature="s")},))
        assert name == GA_ERROR + "BackendFailed", (name, message)
        assert rec.prop("SessionActive") is False
    # dconf-service writes the queued change, then the restore sent after it.
    assert pump(lambda: ga_env.snapshot() == baseline, 10), f"keys left changed: {ga_env.snapshot()}"
    # The next customer's session starts, and its end leaves the kiosk as it was.
    rec.call("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
    rec.call("EndSession")
    assert_keys(ga_env.snapshot(), baseline)


def test_a_successor_whose_take_over_write_fails_is_still_followed_as_the_owner(ga_env, gad):
    # The owner left; its successor's ConfigureForSession takes the session
    # over, then dconf-service does not answer: BackendFailed, but the
    # successor owns the session now, announced and followed (its leaving
    # makes the session take-over-able again).
    owner = Recorder(ga_env)
    owner.call("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
    owner.connection.close()
    successor = Recorder(ga_env)
    assert pump(lambda: successor.prop("SessionOwner") == "", 5), "the owner's leaving was never announced"
    with dconf_service_stopped(ga_env):
        name, message = successor.error("ConfigureForSession", "asb", (dbus.Array(["grayscale"], signature="s"), True))
    assert name == GA_ERROR + "BackendFailed", (name, message)
    assert successor.prop("SessionOwner") == successor.unique_name
    successor.connection.close()
    assert pump(lambda: Recorder(ga_env).prop("SessionOwner") == "", 5), \
        "the successor is not followed: its leaving was never noticed"
    rec = Recorder(ga_env)
    rec.call("EndSession")
    assert_keys(ga_env.snapshot(), UNSET)


def test_keys_a_session_that_did_not_start_may_have_changed_are_put_back_after_a_kill_9(ga_env, gad):
    # text-scaling-factor at 1.5 is no value a session without features
    # would write: the restart puts it back because the journal owes it, not
    # because it guesses.
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")  # dconf-service runs
    baseline = ga_env.snapshot()
    with dconf_service_stopped(ga_env):
        name, message = Recorder(ga_env).error(
            "StartSession", "a{sv}", ({"features": dbus.Array(["large-text"], signature="s")},))
        assert name == GA_ERROR + "BackendFailed", (name, message)
        gad.kill9()  # before its first retry to put the keys back
    assert pump(lambda: ga_env.snapshot() != baseline, 5), "dconf-service never made the queued write"
    gad.start()
    assert Recorder(ga_env).prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), baseline)
