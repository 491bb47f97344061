"""guidedaccessd: configuration (defaults, drop-ins, start-up errors), who is
admitted by [Clients]/[Operators], owners across restarts, and a system
whose schemas lack a mapped key (UnsupportedFeature, never a crash).
Contract: docs/dbus-api.md, docs/settings-mapping.md."""

import shutil
import subprocess
import time
from pathlib import Path

import dbus
import pytest

from conftest import start_guidedaccessd
from gadaemon import (
    A11Y_IFACE, DESKTOP_IFACE, GA_ERROR, KEY_PATHS, MAGNIFIER, NAME, NOBODY, P, Recorder, assert_keys,
    busctl_features, busctl_options, expected_values,
)

UNSET = {path: None for path in KEY_PATHS}


def ok(result):
    rc, out, err = result
    assert rc == 0, err
    return out


def start(rec, **options):
    rec.call("StartSession", "a{sv}", (dbus.Dictionary(options, signature="sv"),))


# ---------------------------------------------------------------- configuration


def test_session_defaults_come_from_the_config(ga_env):
    config = ga_env.write_config("[Service]\nDesktop=gnome-shell\n[Session]\nTimeLimitSec=600\nZoomFactor=3.0\nTextScale=1.25\nInhibitSleep=false\n")
    start_guidedaccessd(ga_env, config=config)
    rec = Recorder(ga_env)
    before = time.time()
    start(rec, features=dbus.Array(["zoom", "large-text"], signature="s"))
    deadline = rec.prop("SessionDeadline") / 1e6
    assert before + 600 - 1 <= deadline <= time.time() + 600 + 1, deadline
    assert_keys(ga_env.snapshot(), {**UNSET, **expected_values(["zoom", "large-text"], zoom_factor=3.0,
                                                               text_scale=1.25)})


def test_options_override_the_config_defaults(ga_env):
    config = ga_env.write_config("[Service]\nDesktop=gnome-shell\n[Session]\nTimeLimitSec=600\nZoomFactor=3.0\n")
    start_guidedaccessd(ga_env, config=config)
    rec = Recorder(ga_env)
    start(rec, **{"time-limit": dbus.UInt64(0), "zoom-factor": dbus.Double(7.0),
                  "features": dbus.Array(["zoom"], signature="s")})
    assert rec.prop("SessionDeadline") == 0
    assert ga_env.snapshot()[P(MAGNIFIER, "mag-factor")] == 7.0


def test_every_option_with_a_valid_value_is_accepted(ga_env, gad, rec):
    start(rec, **{"time-limit": dbus.UInt64(0), "features": dbus.Array([], signature="s"),
                  "zoom-factor": dbus.Double(32.0), "text-scale": dbus.Double(1.0),
                  "inhibit-sleep": dbus.Boolean(False)})
    assert rec.prop("SessionActive") is True


def test_drop_ins_are_read_in_name_order_after_the_file(ga_env):
    config = ga_env.write_config("[Service]\nBackend=gsettings\nDesktop=gnome-shell\n")
    drop_ins = Path(str(config) + ".d")
    drop_ins.mkdir()
    (drop_ins / "20-later.conf").write_text("[Service]\nBackend=memory\n")
    (drop_ins / "10-earlier.conf").write_text("[Service]\nBackend=gsettings\n")
    (drop_ins / "30-ignored.txt").write_text("[Service]\nBackend=gsettings\n")
    start_guidedaccessd(ga_env, config=config)
    assert Recorder(ga_env).prop("Backend") == "memory"


def test_a_missing_named_config_file_is_a_start_up_error(ga_env):
    missing = ga_env.root / "no-such.conf"
    code, log = ga_env.daemon(config=missing).expect_start_failure()
    assert code != 0
    assert str(missing) in log, log


@pytest.mark.parametrize("text,named", [
    ("[Session]\nZoomFactor=40.0\n", ["Session", "ZoomFactor", "40"]),
    ("[Session]\nTimeLimitSec=soon\n", ["Session", "TimeLimitSec", "soon"]),
    ("[Service]\nBackend=kwin-someday\n", ["Service", "Backend", "kwin-someday"]),
    ("[Service]\nColour=blue\n", ["Service", "Colour"]),
    ("[Passcode]\nValue=1234\n", ["Passcode"]),
], ids=["zoom-out-of-range", "time-limit-not-a-number", "unknown-backend", "unknown-key", "unknown-group"])
def test_an_invalid_config_is_a_start_up_error_naming_file_group_key_value(ga_env, text, named):
    config = ga_env.write_config(text, name="bad.conf")
    code, log = ga_env.daemon(config=config).expect_start_failure()
    assert code != 0
    for word in [str(config), *named]:
        assert word in log, f"{word!r} not named in the log:\n{log}"


# ---------------------------------------------------------------- who is admitted


def test_the_shipped_example_configuration_copied_as_it_is_into_user_mode_admits_the_kiosk_user(ga_env):
    """systemd/guidedaccess.conf.example (installed as
    /usr/share/doc/guidedaccess/examples/guidedaccess.conf) copied as it is:
    every key commented out, so the defaults hold — in user mode the bus's own
    user starts and ends sessions. (An uncommented empty [Clients] or
    [Operators] group replaced the built-in rule and denied every call.)"""
    example = Path(__file__).resolve().parents[2] / "systemd" / "guidedaccess.conf.example"
    text = example.read_text()
    config = ga_env.write_config(text.replace("#Desktop=auto", "Desktop=gnome-shell"), name="example.conf")
    start_guidedaccessd(ga_env, config=config)
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom"])))
    assert Recorder(ga_env).prop("EnabledFeatures") == ["zoom"]
    ok(ga_env.busctl_call("EndSession"))


def test_clients_allow_users_admits_that_user_and_no_longer_the_bus_user(ga_env, errmon_factory):
    config = ga_env.write_config("[Service]\nDesktop=gnome-shell\n[Clients]\nAllowUsers=nobody\n")
    daemon = start_guidedaccessd(ga_env, config=config)
    monitor = errmon_factory()
    name, message = monitor.busctl_error(daemon, "StartSession", *busctl_options())  # root, not listed
    assert name == GA_ERROR + "NotAuthorized", message
    # The way in, named: the caller's user and program, and the keys that would admit them.
    assert ("to admit uid 0 running /usr/bin/busctl, add [Clients] AllowUsers=root or "
            "AllowExecutables=/usr/bin/busctl to guidedaccess.conf") in message, message
    assert "polkit rule" not in message, message  # user mode asks no polkit
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom"]), prefix=NOBODY))
    rec = Recorder(ga_env)
    assert rec.prop("EnabledFeatures") == ["zoom"]
    # No [Operators] group: root, the bus's user, is still an operator.
    ok(ga_env.busctl_call("EndSession"))
    assert_keys(ga_env.snapshot(), UNSET)


def test_clients_allow_executables_admits_only_that_executable(ga_env, errmon_factory):
    config = ga_env.write_config("[Service]\nDesktop=gnome-shell\n[Clients]\nAllowExecutables=/usr/bin/gdbus\n")
    daemon = start_guidedaccessd(ga_env, config=config)
    monitor = errmon_factory()
    name, message = monitor.busctl_error(daemon, "StartSession", *busctl_options())
    assert name == GA_ERROR + "NotAuthorized", message
    ok(ga_env.gdbus_call("StartSession", "{'features': <['grayscale']>}"))
    assert Recorder(ga_env).prop("EnabledFeatures") == ["grayscale"]


def test_operators_group_without_the_bus_user_denies_it_end_session_of_others(ga_env, errmon_factory):
    config = ga_env.write_config("[Service]\nDesktop=gnome-shell\n[Operators]\nAllowUsers=nobody\n")
    daemon = start_guidedaccessd(ga_env, config=config)
    monitor = errmon_factory()
    rec = Recorder(ga_env)
    start(rec, features=dbus.Array(["zoom"], signature="s"))  # the owner stays connected
    name, message = monitor.busctl_error(daemon, "EndSession")  # root: a client, no longer an operator
    assert name == GA_ERROR + "NotAuthorized", message
    assert "to admit uid 0 running /usr/bin/busctl, add [Operators] AllowUsers=root to guidedaccess.conf" in message, \
        message
    assert rec.prop("SessionActive") is True
    ok(ga_env.busctl_call("EndSession", prefix=NOBODY))  # nobody: an operator
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)


def test_start_session_by_another_identity_while_the_owner_is_gone_is_session_busy(ga_env, gad, rec):
    ok(ga_env.busctl_call("StartSession", *busctl_options()))  # owner: busctl, gone
    rc, out, err = ga_env.gdbus_call("StartSession", "@a{sv} {}")  # gdbus: not the owner's identity
    assert rc != 0, out
    assert "GDBus.Error:" + GA_ERROR + "SessionBusy" in err, err
    # The way out, named: how it ends, and who may take it over.
    assert "EndSession by its owner or an operator (guidedaccessctl end), or at its time limit" in err, err
    assert "a program of the same user and executable takes it over with StartSession and no options" in err, err


# ---------------------------------------------------------------- owners across restarts


def test_a_connected_owner_stays_the_owner_across_a_restart(ga_env, gad, rec, errmon):
    start(rec)
    gad.restart_after_kill9()
    again = Recorder(ga_env)
    assert again.prop("SessionOwner") == rec.unique_name
    name, message = errmon.busctl_error(gad, "ConfigureForSession", *busctl_features(["zoom"], True))
    assert name == GA_ERROR + "NotAuthorized", message
    rec.call("ConfigureForSession", "asb", (["zoom"], True))
    assert again.prop("EnabledFeatures") == ["zoom"]


def test_an_owner_that_left_while_the_service_was_down_counts_as_gone(ga_env, gad):
    owner = ga_env.connect(mainloop=False)
    owner.call_blocking(NAME, "/org/guidedaccess/GuidedAccess1", "org.guidedaccess.GuidedAccess1",
                        "StartSession", "a{sv}", ({},), timeout=10)
    gad.kill9()
    owner.close()
    gad.start()
    rec = Recorder(ga_env)
    assert (rec.prop("SessionActive"), rec.prop("SessionOwner")) == (True, "")


# ---------------------------------------------------------------- a system without a mapped schema


@pytest.fixture
def schemas_without_a11y_applications(ga_env):
    """XDG_DATA_DIRS with compiled schemas that lack
    org.gnome.desktop.a11y.applications (screen reader, keyboard, magnifier
    switch)."""
    share = ga_env.root / "share"
    schemas = share / "glib-2.0" / "schemas"
    schemas.mkdir(parents=True)
    for source in Path("/usr/share/glib-2.0/schemas").iterdir():
        if source.suffix in (".xml", ".override") and source.name != "org.gnome.desktop.a11y.applications.gschema.xml":
            shutil.copy(source, schemas)
    subprocess.run(["glib-compile-schemas", str(schemas)], check=True)
    return {"XDG_DATA_DIRS": str(share)}


@pytest.fixture
def gad_lacking_schema(ga_env, schemas_without_a11y_applications):
    return start_guidedaccessd(ga_env, extra_env=schemas_without_a11y_applications)


def test_supported_features_leave_out_features_whose_schema_is_missing(ga_env, gad_lacking_schema):
    assert Recorder(ga_env).prop("SupportedFeatures") == ["high-contrast", "large-text", "reduce-motion"]


def test_turning_on_a_feature_whose_schema_is_missing_is_unsupported_feature(ga_env, gad_lacking_schema):
    rec = Recorder(ga_env)
    start(rec)
    name, message = rec.error("ConfigureForSession", "asb", (["zoom"], True))
    assert name == GA_ERROR + "UnsupportedFeature", message
    assert "zoom" in message, message
    assert gad_lacking_schema.alive()


def test_unsupported_feature_in_a_batch_changes_nothing(ga_env, gad_lacking_schema):
    rec = Recorder(ga_env)
    start(rec)
    name, message = rec.error("ConfigureForSession", "asb", (["high-contrast", "screen-reader"], True))
    assert name == GA_ERROR + "UnsupportedFeature", message
    assert rec.prop("EnabledFeatures") == []
    assert ga_env.snapshot()[P(A11Y_IFACE, "high-contrast")] is None


def test_start_session_with_an_unsupported_feature_starts_no_session(ga_env, gad_lacking_schema):
    rec = Recorder(ga_env)
    name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(
        ["reduce-motion", "on-screen-keyboard"], signature="s")},))
    assert name == GA_ERROR + "UnsupportedFeature", message
    assert "on-screen-keyboard" in message, message
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)


def test_turning_off_an_unsupported_feature_succeeds(ga_env, gad_lacking_schema):
    rec = Recorder(ga_env)
    start(rec, features=dbus.Array(["reduce-motion"], signature="s"))
    rec.call("ConfigureForSession", "asb", (["screen-reader", "zoom"], False))
    assert rec.prop("EnabledFeatures") == ["reduce-motion"]
    assert ga_env.snapshot()[P(DESKTOP_IFACE, "enable-animations")] is False


# ---------------------------------------------------------------- default paths (user mode)


def without_state_dir(daemon):
    i = daemon.argv.index("--state-dir")
    del daemon.argv[i:i + 2]
    return daemon


def test_the_default_config_is_xdg_config_home_guidedaccess_conf(ga_env):
    path = ga_env.root / "config" / "guidedaccess" / "guidedaccess.conf"
    path.write_text("[Service]\nBackend=memory\n")  # over the GNOME default GAEnv writes there
    start_guidedaccessd(ga_env)
    assert Recorder(ga_env).prop("Backend") == "memory"


def test_the_default_state_dir_is_xdg_state_home_guidedaccess(ga_env):
    state = Path(ga_env.env["XDG_STATE_HOME"]) / "guidedaccess"
    daemon = without_state_dir(ga_env.daemon())
    daemon.start()
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom"])))
    assert state.is_dir() and any(state.iterdir()), f"nothing in {state}"
    assert not any(ga_env.state_dir.iterdir())
    daemon.restart_after_kill9()
    assert Recorder(ga_env).prop("EnabledFeatures") == ["zoom"]


def test_state_directory_from_systemd_is_the_state_dir(ga_env):
    state = ga_env.root / "systemd-state"
    state.mkdir()
    daemon = without_state_dir(ga_env.daemon(extra_env={"STATE_DIRECTORY": str(state)}))
    daemon.start()
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom"])))
    assert any(state.iterdir()), f"nothing in {state}"
