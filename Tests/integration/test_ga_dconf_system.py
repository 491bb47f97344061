"""System mode with the dconf backend: the session's values are imposed and
locked through a dconf system database, which the kiosk user's real gsettings
reads through a profile (`user-db:user`, then `file-db:` the test's database,
as settings-mapping.md's recipe for tests without /etc).

The test's private bus stands in for the system bus (dconf update sends its
WritabilityNotify there); the user's own database is served by the real
dconf-service on the same bus.
"""

import time

import dbus
import pytest

from conftest import pump, seat_session, start_guidedaccessd

MAG = ("org.gnome.desktop.a11y.magnifier", "mag-factor")
READER = ("org.gnome.desktop.a11y.applications", "screen-reader-enabled")


@pytest.fixture
def lockdown(ga_env):
    # The kiosk runs a GNOME session on seat0: every feature reaches it
    # through the locked keys, the screen reader through gnome-session.
    seat_session(ga_env, "gnome")
    db = ga_env.root / "db"
    db.mkdir()
    profile = ga_env.root / "profile"
    profile.write_text(f"user-db:user\nfile-db:{db}/guidedaccess\n")

    def start(lock_outside_session=False):
        config = ga_env.write_config(
            "[Service]\nBackend=dconf\n"
            f"[Dconf]\nDatabaseDir={db}\nDatabaseName=guidedaccess\n"
            f"LockOutsideSession={'true' if lock_outside_session else 'false'}\n")
        daemon = start_guidedaccessd(
            ga_env, config=config, args=("--system",), extra_env={"DBUS_SYSTEM_BUS_ADDRESS": ga_env.address})
        # Clients read the system database from here on.
        ga_env.env["DCONF_PROFILE"] = str(profile)
        return daemon

    return start


def get(ga_env, schema_key):
    code, out, err = ga_env.run(["gsettings", "get", *schema_key])
    assert code == 0, err
    return out.strip()


def writable(ga_env, schema_key):
    code, out, err = ga_env.run(["gsettings", "writable", *schema_key])
    assert code == 0, err
    return out.strip() == "true"


def test_session_values_are_imposed_and_locked_and_the_users_own_come_back(ga_env, lockdown):
    assert ga_env.run(["gsettings", "set", *MAG, "3.0"])[0] == 0  # the kiosk user's own value
    lockdown()
    assert get(ga_env, MAG) == "3.0"
    assert ga_env.busctl_call("StartSession", "a{sv}", "1", "features", "as", "1", "zoom")[0] == 0
    assert get(ga_env, MAG) == "2.0"
    assert not writable(ga_env, MAG)
    ga_env.run(["gsettings", "set", *MAG, "5.0"])
    assert get(ga_env, MAG) == "2.0", "a locked key changed"
    assert ga_env.busctl_call("EndSession")[0] == 0
    assert get(ga_env, MAG) == "3.0"
    assert writable(ga_env, MAG)


def test_dconf_update_announces_writability_on_the_system_bus(ga_env, lockdown):
    from dbus.mainloop.glib import DBusGMainLoop

    seen = []
    bus = dbus.bus.BusConnection(ga_env.address, mainloop=DBusGMainLoop())
    bus.add_signal_receiver(
        lambda *args, **kw: seen.append(kw["path"]), signal_name="WritabilityNotify",
        dbus_interface="ca.desrt.dconf.Writer", path_keyword="path")
    lockdown()
    assert ga_env.busctl_call("StartSession", "a{sv}", "1", "features", "as", "1", "screen-reader")[0] == 0
    assert pump(lambda: seen, 5), "no WritabilityNotify"
    assert seen[0] == "/ca/desrt/dconf/Writer/guidedaccess"


def test_outside_a_session_the_mapped_keys_are_locked_at_their_baseline(ga_env, lockdown):
    lockdown(lock_outside_session=True)
    assert not writable(ga_env, READER)
    assert get(ga_env, READER) == "false"
    ga_env.run(["gsettings", "set", *READER, "true"])
    assert get(ga_env, READER) == "false"
    assert ga_env.busctl_call("StartSession", "a{sv}", "1", "features", "as", "1", "screen-reader")[0] == 0
    assert get(ga_env, READER) == "true"
    assert ga_env.busctl_call("EndSession")[0] == 0
    assert get(ga_env, READER) == "false"
    assert not writable(ga_env, READER)


def test_kill_9_keeps_the_session_and_the_lock(ga_env, lockdown):
    daemon = lockdown()
    assert ga_env.busctl_call("StartSession", "a{sv}", "1", "features", "as", "1", "zoom")[0] == 0
    daemon.kill9()
    assert get(ga_env, MAG) == "2.0" and not writable(ga_env, MAG)
    daemon.start()
    code, out, _ = ga_env.busctl("get-property", "org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                                 "org.guidedaccess.GuidedAccess1", "EnabledFeatures")
    assert out.strip() == 'as 1 "zoom"'
    assert ga_env.busctl_call("EndSession")[0] == 0
    assert writable(ga_env, MAG)


def test_restarted_without_lock_outside_session_the_keys_are_the_users_again(ga_env, lockdown):
    daemon = lockdown(lock_outside_session=True)
    assert not writable(ga_env, READER)
    daemon.stop()
    # The operator turns LockOutsideSession off and restarts the service.
    lockdown(lock_outside_session=False)
    assert writable(ga_env, READER)
    assert writable(ga_env, MAG)
    assert ga_env.run(["gsettings", "set", *READER, "true"])[0] == 0
    assert get(ga_env, READER) == "true"
    # A session still locks what it imposes, and lets go at its end.
    assert ga_env.busctl_call("StartSession", "a{sv}", "1", "features", "as", "1", "zoom")[0] == 0
    assert not writable(ga_env, MAG)
    assert ga_env.busctl_call("EndSession")[0] == 0
    assert writable(ga_env, MAG)
    assert get(ga_env, READER) == "true"


def test_a_corrupt_journal_does_not_leave_the_session_layer_locked_for_good(ga_env, lockdown):
    daemon = lockdown()
    assert ga_env.busctl_call("StartSession", "a{sv}", "1", "features", "as", "1", "zoom")[0] == 0
    assert not writable(ga_env, MAG)
    daemon.kill9()
    (ga_env.state_dir / "journal.json").write_text("{ not json")
    daemon.start()
    # The journal is kept aside; no session can end what it imposed, so it goes.
    assert list(ga_env.state_dir.glob("journal.corrupt-*"))
    assert writable(ga_env, MAG)
    code, out, _ = ga_env.busctl("get-property", "org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                                 "org.guidedaccess.GuidedAccess1", "SessionActive")
    assert out.strip() == "b false"


@pytest.mark.parametrize("line, warned", [(None, True), ("user-db:user\n", True),
                                          ("user-db:user\nsystem-db:guidedaccess\n", False)])
def test_a_profile_that_does_not_read_the_database_is_a_start_up_warning_naming_the_way_out(ga_env, line, warned):
    """System mode without the profile line: sessions would succeed and
    change nothing on the screen. The profile beside the databases
    (/etc/dconf/profile/user for /etc/dconf/db; here the test's) is read at
    start-up, and a missing line is a warning that names the fix."""
    seat_session(ga_env, "gnome")
    db = ga_env.root / "dconf" / "db"
    db.mkdir(parents=True)
    profile = ga_env.root / "dconf" / "profile" / "user"
    if line is not None:
        profile.parent.mkdir()
        profile.write_text(line)
    config = ga_env.write_config(f"[Service]\nBackend=dconf\n[Dconf]\nDatabaseDir={db}\nDatabaseName=guidedaccess\n"
                                 "LockOutsideSession=false\n")
    daemon = start_guidedaccessd(ga_env, config=config, args=("--system",),
                                 extra_env={"DBUS_SYSTEM_BUS_ADDRESS": ga_env.address})
    time.sleep(0.3)
    log = daemon.log()
    warning = f"{profile} does not read system-db:guidedaccess"
    assert (warning in log) == warned, log
    if warned:
        assert "run guidedaccess-dconf-profile once" in log, log
