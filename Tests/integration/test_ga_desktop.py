"""guidedaccessd: the desktop it detects (the Desktop property, [Service]
Desktop=), followed live, and SupportedFeatures promising only what the
kiosk delivers (spec: "Making features real (1.1)"). The screen reader
really speaking is Tests/desktop/test_screen_reader.py's."""

import os
import stat

import dbus

from conftest import start_guidedaccessd
from gadaemon import GA_ERROR, Recorder, SupportChanged, pump

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
    # The way out: the desktop that delivers it, and where a browser would, how to attach one.
    assert message == ("zoom: the desktop 'none' does not act on it (gnome-shell and gnome-kiosk do), and no browser is attached: "
                       "start the kiosk browser with guidedaccessctl browser")
    assert rec.prop("SessionActive") is False


def test_the_shell_coming_and_going_on_the_bus_changes_desktop_and_supported_features(ga_env):
    ga_env.stand_for_no_desktop()
    start_guidedaccessd(ga_env)
    rec = Recorder(ga_env)
    rec.clear()
    shell = ga_env.connect(mainloop=False)
    shell.request_name(SHELL)
    expected = SupportChanged("gnome-shell", [f for f in FEATURES if f != "screen-reader"])
    assert pump(lambda: expected in rec.events, 5), f"no PropertiesChanged for the shell: {rec.events}"
    assert rec.prop("Desktop") == "gnome-shell"
    shell.release_name(SHELL)
    gone = SupportChanged("none", [])
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
    assert (name, message) == (GA_ERROR + "UnsupportedFeature", "screen-reader: orca is not installed (package orca)")


def test_screen_reader_without_an_x_display_is_unsupported_naming_why(ga_env):
    config = ga_env.write_config("[Service]\nDesktop=sway\n")
    start_guidedaccessd(ga_env, config=config)
    rec = Recorder(ga_env)
    assert "screen-reader" not in rec.prop("SupportedFeatures")
    start_session(rec, "large-text")
    name, message = rec.error("ConfigureForSession", "asb", (["screen-reader"], True))
    assert name == GA_ERROR + "UnsupportedFeature"
    assert message == "screen-reader: the session has no X display, which Orca needs (on Wayland: the compositor's Xwayland)"


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


# ---------------------------------------------------------------- GNOME Kiosk (spec 1.2, section 3)

FAKE_KIOSK = r"""
import os, socket, sys, time
import dbus
# What GNOME Kiosk shows the service: the Wayland socket it serves, and its
# names on the session bus, org.gnome.Kiosk first (kiosk-compositor.c).
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(os.path.join(os.environ["XDG_RUNTIME_DIR"], "wayland-0"))
listener.listen(8)
bus = dbus.bus.BusConnection(os.environ["DBUS_SESSION_BUS_ADDRESS"])
for name in sys.argv[1:]:
    bus.request_name(name)
print("ready", flush=True)
while True:
    connection, _ = listener.accept()
    connection.close()
"""


def start_fake_kiosk(env, tmp_path, names=("org.gnome.Kiosk", SHELL), magnifier=False, program="gnome-kiosk"):
    """A process whose name is gnome-kiosk (a copy of the interpreter, as
    GNOME Kiosk's executable is called) serving wayland-0 and owning NAMES.
    With `magnifier` its executable holds the magnifier key's name, as
    GNOME Kiosk 50's does (kiosk-magnifier.c)."""
    import shutil
    import subprocess
    import sys

    executable = tmp_path / program
    shutil.copy(os.path.realpath("/usr/bin/python3"), executable)
    if magnifier:
        with open(executable, "ab") as out:
            out.write(b"\0screen-magnifier-enabled\0")
    script = tmp_path / "fake-kiosk.py"
    script.write_text(FAKE_KIOSK)
    process = subprocess.Popen([str(executable), str(script), *names], stdout=subprocess.PIPE, env=env.env, text=True)
    env._extra_processes.append(process)
    assert process.stdout.readline().strip() == "ready"
    return process


def test_gnome_kiosk_is_recognised_by_its_name_before_the_shells_and_claims_no_colour_effects(ga_env, tmp_path):
    ga_env.stand_for_no_desktop()
    start_fake_kiosk(ga_env, tmp_path)
    daemon = start_guidedaccessd(ga_env)
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "gnome-kiosk"
    supported = rec.prop("SupportedFeatures")
    assert {"high-contrast", "large-text", "reduce-motion"} <= set(supported)
    assert not {"invert-colors", "grayscale", "zoom", "on-screen-keyboard"} & set(supported)
    for feature in ("invert-colors", "grayscale"):
        name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array([feature], signature="s")},))
        assert (name, message) == (
            GA_ERROR + "UnsupportedFeature",
            f"{feature}: the desktop 'gnome-kiosk' does not act on it (GNOME Kiosk has no colour effects; gnome-shell and x11 do), and no browser is attached: start the kiosk browser with guidedaccessctl browser")
    name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
    assert message == ("zoom: the desktop 'gnome-kiosk' does not act on it (GNOME Kiosk has a magnifier from "
                       "version 50, and the one running has none; gnome-shell does), and no browser is attached: start the kiosk "
                       "browser with guidedaccessctl browser"), message
    assert "desktop: gnome-kiosk (detected; WAYLAND_DISPLAY=wayland-0, compositor gnome-kiosk" in daemon.log()
    rec.call("StartSession", "a{sv}", ({"features": dbus.Array(["high-contrast", "large-text"], signature="s")},))
    assert rec.prop("EnabledFeatures") == ["high-contrast", "large-text"]


def test_gnome_kiosk_50_magnifies_the_screen(ga_env, tmp_path):
    ga_env.stand_for_no_desktop()
    start_fake_kiosk(ga_env, tmp_path, magnifier=True)
    start_guidedaccessd(ga_env)
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "gnome-kiosk"
    assert "zoom" in rec.prop("SupportedFeatures")
    assert not {"invert-colors", "grayscale"} & set(rec.prop("SupportedFeatures"))
    rec.call("StartSession", "a{sv}", ({"features": dbus.Array(["zoom"], signature="s")},))
    assert ga_env.snapshot()["/org/gnome/desktop/a11y/applications/screen-magnifier-enabled"] is True


def test_gnome_kiosk_owning_org_gnome_shell_is_not_taken_for_gnome_shell_and_its_arrival_is_followed(ga_env, tmp_path):
    ga_env.stand_for_no_desktop()
    start_guidedaccessd(ga_env)
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "none"
    rec.clear()
    # Only its names this time (the compositor on another socket): the bus decides.
    kiosk = ga_env.connect(mainloop=False)
    kiosk.request_name("org.gnome.Kiosk")
    kiosk.request_name(SHELL)
    assert pump(lambda: any(e[0] == "PropertiesChanged" and e[1].get("Desktop") == "gnome-kiosk" for e in rec.events), 5), \
        f"no PropertiesChanged to gnome-kiosk: {rec.events}"
    assert "invert-colors" not in rec.prop("SupportedFeatures")


def test_xdg_current_desktop_naming_gnome_kiosk_is_gnome_kiosk(ga_env, tmp_path):
    ga_env.stand_for_no_desktop()
    # A Wayland socket served by a process of another name: the compositor
    # could not be asked; XDG_CURRENT_DESKTOP as GNOME Kiosk's sessions set it.
    start_fake_kiosk(ga_env, tmp_path, names=(), program="compositor")
    start_guidedaccessd(ga_env, extra_env={"XDG_CURRENT_DESKTOP": "GNOME-Kiosk:GNOME"})
    assert Recorder(ga_env).prop("Desktop") == "gnome-kiosk"


LATE_LISTENER = r"""
import os, socket, sys, time
# A compositor as every server makes its socket: bind (the file appears, and
# the service's watch sees it), some work, then listen.
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(os.path.join(os.environ["XDG_RUNTIME_DIR"], "wayland-0"))
print("bound", flush=True)
time.sleep(float(sys.argv[1]))
listener.listen(8)
print("listening", flush=True)
while True:
    connection, _ = listener.accept()
    connection.close()
"""


def test_a_display_socket_that_listens_only_after_it_appeared_is_found_once_it_listens(ga_env, tmp_path):
    """The watch sees a display's socket when its server binds it, before
    the server listens: the service looks again while the new socket does
    not answer, and finds the display once it does (the session agent of a
    kiosk whose X server started with it missed it for good)."""
    import subprocess
    import time

    ga_env.stand_for_no_desktop()
    start_guidedaccessd(ga_env, extra_env={"XDG_CURRENT_DESKTOP": "sway"})
    rec = Recorder(ga_env)
    assert rec.prop("Desktop") == "none"
    script = tmp_path / "late-listener.py"
    script.write_text(LATE_LISTENER)
    process = subprocess.Popen(["/usr/bin/python3", str(script), "0.4"], stdout=subprocess.PIPE, env=ga_env.env,
                               text=True)
    ga_env._extra_processes.append(process)
    assert process.stdout.readline().strip() == "bound"
    assert process.stdout.readline().strip() == "listening"
    listening = time.monotonic()
    while Recorder(ga_env).prop("Desktop") != "sway":
        assert time.monotonic() - listening < 3, "the display that listens now is not found"
        time.sleep(0.05)
