"""guidedaccessd: the desktop it detects (the Desktop property, [Service]
Desktop=), followed live, and SupportedFeatures promising only what the
kiosk delivers (spec: "Making features real (1.1)"). The screen reader
really speaking is Tests/desktop/test_screen_reader.py's."""

import os
import stat

import dbus

from conftest import start_guidedaccessd
from gadaemon import GA_ERROR, Recorder, pump

FEATURES = ["grayscale", "high-contrast", "invert-colors", "large-text", "on-screen-keyboard", "reduce-motion",
            "screen-reader", "zoom"]
SHELL = "org.gnome.Shell"
READER_KEY = "/org/gnome/desktop/a11y/applications/screen-reader-enabled"


def start_session(rec, *features):
    rec.call("StartSession", "a{sv}", ({"features": dbus.Array(features, signature="s")},))


def test_on_a_bare_bus_the_desktop_is_none_and_no_feature_is_supported(ga_env):
    ga_env.stand_for_no_desktop()
    start_guidedaccessd(ga_env)
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "none"
    assert rec.prop("SupportedFeatures") == []
    name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
    assert name == GA_ERROR + "UnsupportedFeature"
    assert message == "zoom: the desktop 'none' does not act on it"
    assert rec.prop("SessionActive") is False


def test_the_shell_coming_and_going_on_the_bus_changes_desktop_and_supported_features(ga_env):
    ga_env.stand_for_no_desktop()
    start_guidedaccessd(ga_env)
    rec = Recorder(ga_env)
    rec.clear()
    shell = ga_env.connect(mainloop=False)
    shell.request_name(SHELL)
    expected = ("PropertiesChanged", {"Desktop": "gnome-shell",
                                      "SupportedFeatures": [f for f in FEATURES if f != "screen-reader"]}, [])
    assert pump(lambda: expected in rec.events, 5), f"no PropertiesChanged for the shell: {rec.events}"
    assert rec.prop("Desktop") == "gnome-shell"
    shell.release_name(SHELL)
    gone = ("PropertiesChanged", {"Desktop": "none", "SupportedFeatures": []}, [])
    assert pump(lambda: gone in rec.events, 5), f"no PropertiesChanged for the shell leaving: {rec.events}"


def test_the_configured_desktop_is_used_and_named_in_the_log(ga_env):
    config = ga_env.write_config("[Service]\nDesktop=sway\n")
    daemon = start_guidedaccessd(ga_env, config=config, extra_env={"DISPLAY": ":99"})
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "sway"
    # GTK apps on Wayland read these keys; the screen reader is the service's.
    assert rec.prop("SupportedFeatures") == ["high-contrast", "large-text", "reduce-motion", "screen-reader"]
    assert "desktop: sway ([Service] Desktop=" in daemon.log()


def test_screen_reader_without_orca_installed_is_unsupported_naming_why(ga_env, tmp_path):
    config = ga_env.write_config("[Service]\nDesktop=x11\n")
    start_guidedaccessd(ga_env, config=config, extra_env={"DISPLAY": ":99", "PATH": str(tmp_path)})
    rec = Recorder(ga_env)
    assert rec.prop("SupportedFeatures") == []
    name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["screen-reader"], signature="s")},))
    assert (name, message) == (GA_ERROR + "UnsupportedFeature", "screen-reader: orca is not installed")


def test_screen_reader_without_an_x_display_is_unsupported_naming_why(ga_env):
    config = ga_env.write_config("[Service]\nDesktop=sway\n")
    start_guidedaccessd(ga_env, config=config)
    rec = Recorder(ga_env)
    assert "screen-reader" not in rec.prop("SupportedFeatures")
    start_session(rec, "large-text")
    name, message = rec.error("ConfigureForSession", "asb", (["screen-reader"], True))
    assert name == GA_ERROR + "UnsupportedFeature"
    assert message == "screen-reader: the session has no X display, which Orca needs (Xwayland on Wayland)"


def test_a_screen_reader_that_cannot_be_started_fails_the_call_and_changes_nothing(ga_env, tmp_path):
    # An `orca` that exec refuses (not a program): what a broken install looks like.
    orca = tmp_path / "orca"
    orca.write_bytes(b"\x7fELF not really\n")
    orca.chmod(stat.S_IRWXU)
    # A bare gnome-shell (no gnome-session): the service starts the screen reader.
    ga_env.stand_for_no_desktop()
    config = ga_env.write_config("[Service]\nDesktop=gnome-shell\n")
    start_guidedaccessd(ga_env, config=config,
                        extra_env={"DISPLAY": ":99", "PATH": f"{tmp_path}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    rec = Recorder(ga_env)
    assert rec.prop("SupportedFeatures") == FEATURES
    before = ga_env.snapshot()

    name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["screen-reader"], signature="s")},))
    assert name == GA_ERROR + "BackendFailed", message
    assert message.startswith(f"screen-reader: cannot start {orca}: "), message
    assert rec.prop("SessionActive") is False
    assert ga_env.snapshot() == before

    rec.call("StartSession", "a{sv}", ({},))
    name, message = rec.error("ConfigureForSession", "asb", (["zoom", "screen-reader"], True))
    assert name == GA_ERROR + "BackendFailed", message
    assert rec.prop("EnabledFeatures") == []
    assert ga_env.snapshot() == before, "the keys written for zoom and the screen reader were not put back"
    assert ga_env.snapshot()[READER_KEY] is None
    rec.call("EndSession")
    assert ga_env.snapshot() == before
