"""guidedaccessd: when dconf cannot write (the user's database path is made
a directory, so dconf-service's rename fails), calls are BackendFailed,
nothing stays changed, and a retry after the repair succeeds.
Contract: docs/dbus-api.md (StartSession, EndSession,
ConfigureForSession: BackendFailed)."""

import contextlib
import os

import dbus

from gadaemon import GA_ERROR, KEY_PATHS, assert_keys, expected_values, pump_for

UNSET = {path: None for path in KEY_PATHS}


@contextlib.contextmanager
def dconf_cannot_write(env):
    db = env.root / "config" / "dconf"
    db.mkdir(exist_ok=True)
    saved = db / "user.saved"
    if (db / "user").exists():
        os.rename(db / "user", saved)
    os.mkdir(db / "user")
    try:
        yield
    finally:
        os.rmdir(db / "user")
        if saved.exists():
            os.rename(saved, db / "user")


def start(rec, features=()):
    rec.call("StartSession", "a{sv}", (dbus.Dictionary(
        {"features": dbus.Array(list(features), signature="s")} if features else {}, signature="sv"),))


def test_start_session_when_dconf_cannot_write_is_backend_failed_and_starts_none(ga_env, gad, rec):
    ga_env.gsettings_set("org.gnome.desktop.a11y.magnifier", "mag-factor", "3.0")  # a database exists
    before = ga_env.snapshot()
    with dconf_cannot_write(ga_env):
        name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
        assert name == GA_ERROR + "BackendFailed", message
        assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), before)
    start(rec, ["zoom"])  # and it works again
    assert rec.prop("EnabledFeatures") == ["zoom"]


def test_configure_when_dconf_cannot_write_is_backend_failed_and_changes_nothing(ga_env, gad, rec):
    start(rec, ["zoom"])
    during = ga_env.snapshot()
    with dconf_cannot_write(ga_env):
        name, message = rec.error("ConfigureForSession", "asb", (["screen-reader", "high-contrast"], True))
        assert name == GA_ERROR + "BackendFailed", message
        assert rec.prop("EnabledFeatures") == ["zoom"]
    assert_keys(ga_env.snapshot(), during)
    rec.call("ConfigureForSession", "asb", (["screen-reader", "high-contrast"], True))
    assert_keys(ga_env.snapshot(), {**UNSET, **expected_values(["zoom", "screen-reader", "high-contrast"])})


def test_end_session_when_dconf_cannot_write_is_backend_failed_and_a_retry_restores(ga_env, gad, rec):
    start(rec, ["zoom", "grayscale"])
    with dconf_cannot_write(ga_env):
        name, message = rec.error("EndSession")
        assert name == GA_ERROR + "BackendFailed", message
        assert (rec.prop("SessionActive"), rec.prop("EnabledFeatures")) == (True, ["grayscale", "zoom"])
    rec.call("EndSession")
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)


def test_a_failed_end_at_the_time_limit_keeps_the_session_and_is_retried_until_it_succeeds(ga_env, gad, rec):
    rec.call("StartSession", "a{sv}", ({"time-limit": dbus.UInt64(1),
                                        "features": dbus.Array(["invert-colors"], signature="s")},))
    with dconf_cannot_write(ga_env):
        rec.clear()
        pump_for(2.0)
        assert rec.prop("SessionActive") is True
        assert ("SessionChanged", False, "time-limit") not in rec.events, rec.events
    # Repaired: a retry (with back-off) ends it.
    assert rec.wait_for(("SessionChanged", False, "time-limit"), 15), rec.events
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)
