"""A bare X11 kiosk (issue 26): Xvfb with GLX, matchbox, the kiosk's GTK
window, run as a non-root test user (x11.py), and guidedaccessd --user
started in that user's session WITHOUT DISPLAY, XAUTHORITY or
WAYLAND_DISPLAY: it finds the X server by its socket in /tmp/.X11-unix and
the cookie by the server's -auth argument, and calls its desktop "x11".
There it starts Orca itself (and Orca, given that display and cookie,
speaks the focused button: heard in speech-dispatcher's log and recorded),
runs picom with a window shader for invert-colors and grayscale (measured on
root-window screenshots, the screen given back pixel for pixel after the
session), restarts a picom that dies, adopts it after a kill -9 of its own
and stops it when the session ended meanwhile; and where the kiosk runs a
compositor of its own, it starts no second one and says whose it is.
GTK's settings (high-contrast, large-text, reduce-motion) go through an
xsettingsd the service runs, likewise never beside one of the kiosk's own.

Each test takes 5 to 15 s, the file 30 to 45 s (two cores; -s prints
what was measured). Run as root (the harness makes the test
user and a mount namespace), with the service GUIDEDACCESSD or
.build/debug/guidedaccessd:

    .venv/bin/python -m pytest -q -rs -s Tests/desktop/test_x11.py"""

import os
import signal
import time
from pathlib import Path
from typing import NamedTuple

import pytest

import gnomeshell
import speech
import x11
from test_screen_reader import LABEL, Kiosk, daemon_pid, end_session_and_hear_nothing_more, hear_the_focused_button, \
    orcas, wait_until

pytestmark = pytest.mark.skipif(bool(x11.missing_tools()), reason=f"not installed: {x11.missing_tools()}")

# Seconds for the screen to show a change the service made: a bound, not a
# figure (the calls return once the filter is on the screen; a picom started
# again after it died paints in 1 to 2 s, GLX on llvmpipe; 3.5 s was seen
# with both cores busy).
SHOT_TIMEOUT = 10.0
TOLERANCE = 0.01


@pytest.fixture
def make_desk(request):
    """Makes the X11 desktop (display up, matchbox managing it); at the end
    stops it and checks that nothing of it is left."""
    made = []

    def make():
        desk = x11.Desktop()
        made.append(desk)
        request.node.desktop = desk
        desk.start_x()
        return desk

    yield make
    for desk in made:
        left = desk.stop()
        assert left == [], f"left behind by the X11 desktop: {left}"
        assert not Path(f"/tmp/.X11-unix/X{desk.display_number}").exists()


@pytest.fixture
def colour_desk(make_desk):
    """The kiosk's window painted in saturated colours (for the colour
    filters), guidedaccessd running; the screen before any session."""
    desk = make_desk()
    desk.start_gtk_button(colourful=True)
    desk.start_daemon()
    desk.before = desk.settle()
    desk.measured_before = x11.means(desk.before)
    assert desk.measured_before["saturation"] > 0.4, f"the kiosk's window is not colourful: {desk.measured_before}"
    assert desk.compositors() == {} and desk.selection_owner() == 0
    return desk


# ---------------------------------------------------------------- helpers


class Seen(NamedTuple):
    shot: Path  # once the screen settled
    measured: dict  # its x11.means
    took: float  # seconds until the first screenshot that showed it
    at_once: bool  # whether the first screenshot showed it


def wait_for_screen(desk, condition, what, timeout=SHOT_TIMEOUT):
    """Screenshots until condition(means) holds, then once the screen has
    settled checks it again (a frame half-way through a compositor's start
    must not pass)."""
    started = time.monotonic()
    deadline = started + timeout
    shots = 0
    while True:
        measured = x11.means(desk.screenshot())
        shots += 1
        if condition(measured):
            break
        assert time.monotonic() < deadline, f"{what} within {timeout} s: the screen measures {measured}"
        time.sleep(0.05)
    took = time.monotonic() - started
    shot = desk.settle()
    measured = x11.means(shot)
    assert condition(measured), f"{what}: it did at first, but not once the screen settled: {measured}"
    return Seen(shot, measured, took, shots == 1)


def when(seen):
    """How soon the screen showed it, for the printed figures."""
    return "on the screen at the reply" if seen.at_once else f"on the screen {seen.took:.2f} s after the reply"


def inverted_from(before):
    return lambda m: abs(m["lightness"] - (1 - before["lightness"])) <= TOLERANCE


def gray_of(before, invert=False):
    """Rec. 709 luma of `before` (of its inversion with `invert`), as gray."""
    expected = 1 - x11.luma(before) if invert else x11.luma(before)
    return lambda m: m["saturation"] <= TOLERANCE and abs(x11.luma(m) - expected) <= TOLERANCE


def wait_for_the_screen_before(desk, timeout=SHOT_TIMEOUT):
    """Waits until the screen is pixel for pixel `desk.before`; how long it took."""
    started = time.monotonic()
    while True:
        changed = gnomeshell.compare("AE", desk.before, desk.screenshot())
        if changed == 0:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, \
            f"the screen is not as before the session: {changed} pixels differ after {timeout} s"
        time.sleep(0.05)


def one_compositor(desk, timeout=2.0, other_than=()):
    """The pid of the one picom of the desktop (not in `other_than`) once
    there is exactly one, within `timeout`."""
    found = wait_until(lambda: [pid for pid in desk.compositors() if pid not in other_than], timeout,
                       "no picom runs")
    time.sleep(0.1)
    found = [pid for pid in desk.compositors() if pid not in other_than]
    assert len(found) == 1, f"not one picom: {desk.compositors()}"
    return found[0]


def no_compositor_left(desk, timeout=2.0, but=()):
    wait_until(lambda: set(desk.compositors()) <= set(but), timeout,
               f"picom still runs: {desk.compositors()}")
    if not but:
        assert desk.selection_owner() == 0, "a compositing manager still owns _NET_WM_CM_S0"


def unsupported(kiosk, feature, method="ConfigureForSession"):
    """The UnsupportedFeature message for turning `feature` on."""
    with pytest.raises(RuntimeError, match=f"UnsupportedFeature: {feature}: ") as raised:
        if method == "StartSession":
            kiosk.call("StartSession", f"{{'features': <['{feature}']>}}")
        else:
            kiosk.call("ConfigureForSession", f"['{feature}']", "true")
    return str(raised.value).split(f"UnsupportedFeature: {feature}: ", 1)[1].strip()


def environ(pid):
    entries = (entry.decode(errors="replace") for entry in speech.environment(pid))
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


# ---------------------------------------------------------------- 1. the screen reader


SCREEN_READER_TOOLS = ("/usr/bin/orca", "/usr/libexec/at-spi-bus-launcher")


def missing_for_the_screen_reader():
    return speech.missing_tools() + [path for path in SCREEN_READER_TOOLS if not os.access(path, os.X_OK)]


@pytest.mark.skipif(bool(missing_for_the_screen_reader()), reason=f"not installed: {missing_for_the_screen_reader()}")
def test_on_bare_x11_the_service_finds_the_display_itself_and_its_screen_reader_speaks_the_focused_button(make_desk):
    desk = make_desk()
    desk.start_speech()
    desk.start_gtk_button(label=LABEL)
    # matchbox gives the new window the focus: it is the kiosk's app in use.
    desk.wait_for_output("gtk-button", "active", 10)
    daemon = desk.start_daemon()  # no DISPLAY, XAUTHORITY, WAYLAND_DISPLAY
    assert not {"DISPLAY", "XAUTHORITY", "WAYLAND_DISPLAY"} & set(environ(daemon.pid))
    kiosk = Kiosk(desk)
    assert kiosk.prop("Desktop") == "(<'x11'>,)", desk.log("guidedaccessd")
    assert f"DISPLAY={desk.display}" in desk.log("guidedaccessd")
    supported = kiosk.prop("SupportedFeatures")
    assert "'screen-reader'" in supported and "'zoom'" not in supported and "'on-screen-keyboard'" not in supported, \
        supported
    assert orcas(desk) == []

    kiosk.call("StartSession", "{}")
    on, _ = kiosk.call("ConfigureForSession", "['screen-reader']", "true")
    hear_the_focused_button(desk, on, "x11: ConfigureForSession")
    [orca] = orcas(desk)
    # What it found is what Orca got: the display, and the cookie from
    # Xvfb's -auth (there is no ~/.Xauthority).
    found = environ(orca)
    assert (found.get("DISPLAY"), found.get("XAUTHORITY")) == (desk.display, str(desk.xauthority)), found
    assert "WAYLAND_DISPLAY" not in found

    end_session_and_hear_nothing_more(desk, kiosk, "x11")


# ---------------------------------------------------------------- 2. the colour filters


def test_invert_colors_and_grayscale_are_a_picom_the_service_runs_and_the_screen_comes_back(colour_desk):
    desk = colour_desk
    before = desk.measured_before
    kiosk = Kiosk(desk)
    assert kiosk.prop("Desktop") == "(<'x11'>,)"
    supported = kiosk.prop("SupportedFeatures")
    assert "'invert-colors'" in supported and "'grayscale'" in supported, supported

    kiosk.call("StartSession", "{'features': <['invert-colors']>}")
    seen = wait_for_screen(desk, inverted_from(before), "the screen was not inverted (L -> 1 - L)")
    picom = one_compositor(desk)
    argv = desk.compositors()[picom]
    assert "--backend" in argv and argv[argv.index("--backend") + 1] == "glx" and "--glx-fshader-win" in argv, argv
    assert desk.selection_owner() != 0
    print(f"\ninvert-colors: mean lightness {before['lightness']:.3f} -> {seen.measured['lightness']:.3f}, "
          f"{when(seen)} (StartSession; picom pid {picom})")

    kiosk.call("ConfigureForSession", "['invert-colors']", "false")
    kiosk.call("ConfigureForSession", "['grayscale']", "true")
    seen = wait_for_screen(desk, gray_of(before), "the screen was not grayscale (Rec. 709 luma)")
    gray = seen.measured
    one_compositor(desk)
    print(f"grayscale: mean saturation {before['saturation']:.3f} -> {gray['saturation']:.3f}, mean luma "
          f"{x11.luma(before):.3f} -> {x11.luma(gray):.3f}, {when(seen)}")

    kiosk.call("ConfigureForSession", "['invert-colors']", "true")
    seen = wait_for_screen(desk, gray_of(before, invert=True), "the screen was not grayscale and inverted (1 - luma)")
    one_compositor(desk)
    print(f"both: mean saturation {seen.measured['saturation']:.3f}, mean luma {x11.luma(gray):.3f} -> "
          f"{x11.luma(seen.measured):.3f}, {when(seen)}")

    kiosk.call("EndSession")
    took = wait_for_the_screen_before(desk)
    no_compositor_left(desk)
    print(f"EndSession: the screen as before (AE 0) {took:.2f} s after the reply; no picom left")


# ---------------------------------------------------------------- 3. the compositor supervised


def test_a_dying_picom_is_restarted_a_killed_service_adopts_it_and_one_ended_meanwhile_is_stopped(colour_desk):
    desk = colour_desk
    before = desk.measured_before
    kiosk = Kiosk(desk)
    inverted = inverted_from(before)

    kiosk.call("StartSession", "{'features': <['invert-colors']>}")
    wait_for_screen(desk, inverted, "the screen was not inverted")
    picom = one_compositor(desk)

    # picom dies: another within 2 s, and the screen inverted again.
    killed = time.monotonic()
    os.kill(picom, signal.SIGKILL)
    wait_until(lambda: set(desk.compositors()) - {picom}, 2.0, "picom was not started again")
    restarted = time.monotonic() - killed
    again = one_compositor(desk, other_than=(picom,))
    watched = time.monotonic() - killed
    seen = wait_for_screen(desk, inverted, "the screen was not inverted again after picom was killed")
    print(f"\nkilled picom {picom}: started again as {again} {restarted:.2f} s later, "
          f"the screen inverted again {watched + seen.took:.2f} s after the kill")

    # The service is killed and started again: the same picom, adopted.
    os.kill(daemon_pid(desk), signal.SIGKILL)
    desk.processes["guidedaccessd"].wait(5)
    assert list(desk.compositors()) == [again], "picom should outlive the killed service"
    desk.start_daemon()
    assert kiosk.prop("EnabledFeatures") == "(<['invert-colors']>,)"
    time.sleep(1.0)  # a second one would have been started by now
    assert list(desk.compositors()) == [again], \
        f"the resumed session does not have exactly the picom it had ({again}): {desk.compositors()}"
    wait_for_screen(desk, inverted, "the screen is not inverted after the service came back")
    # Its own picom, adopted, is not "a compositor of the kiosk's own": the
    # colour filters can still be changed.
    supported = kiosk.prop("SupportedFeatures")
    assert "'invert-colors'" in supported and "'grayscale'" in supported, \
        f"after adopting its own picom the service no longer offers the colour filters: {supported}"
    kiosk.call("ConfigureForSession", "['grayscale']", "true")
    wait_for_screen(desk, gray_of(before, invert=True), "grayscale was not added after the service came back")
    one_compositor(desk)
    kiosk.call("EndSession")
    wait_for_the_screen_before(desk)
    no_compositor_left(desk)

    # A session whose time limit passes while the service is down: the
    # service, back, stops its picom and gives the screen back.
    # (No screenshots here: the 2 s are soon over.)
    kiosk.call("StartSession", "{'features': <['invert-colors']>, 'time-limit': <uint64 2>}")
    started = time.monotonic()
    picom = one_compositor(desk)
    os.kill(daemon_pid(desk), signal.SIGKILL)
    desk.processes["guidedaccessd"].wait(5)
    time.sleep(max(0.0, started + 2.5 - time.monotonic()))
    assert list(desk.compositors()) == [picom], "picom should outlive the killed service until it comes back"
    back = time.monotonic()
    desk.start_daemon()
    no_compositor_left(desk)
    stopped = time.monotonic() - back
    wait_for_the_screen_before(desk)
    assert kiosk.prop("SessionActive") == "(<false>,)"
    print(f"a session that ended while the service was down: its picom stopped {stopped:.2f} s after the "
          f"service was started again; the screen as before")


# ---------------------------------------------------------------- 4. the kiosk's own compositor


def test_with_a_compositor_of_the_kiosks_own_the_colour_filters_are_unsupported_and_name_it(make_desk):
    desk = make_desk()
    desk.start_gtk_button(colourful=True)
    theirs = desk.spawn("kiosk-picom", [x11.TOOLS["picom"], "--backend", "xrender"])
    wait_until(lambda: desk.selection_owner() != 0, 5, "the kiosk's picom did not become the compositing manager")
    before = desk.settle()
    desk.start_daemon()
    kiosk = Kiosk(desk)
    assert kiosk.prop("Desktop") == "(<'x11'>,)"
    supported = kiosk.prop("SupportedFeatures")
    assert "'invert-colors'" not in supported and "'grayscale'" not in supported, supported

    named = f"picom (pid {theirs.pid})"
    reason = unsupported(kiosk, "invert-colors", "StartSession")
    assert named in reason, reason
    assert kiosk.prop("SessionActive") == "(<false>,)", "a StartSession that failed started a session"
    kiosk.call("StartSession", "{}")
    for feature in ("grayscale", "invert-colors"):
        reason = unsupported(kiosk, feature)
        assert named in reason, reason
    print(f"\ninvert-colors, grayscale: UnsupportedFeature: {reason}")
    # What X11 has nothing for, whatever the compositor.
    for feature in ("zoom", "on-screen-keyboard"):
        reason = unsupported(kiosk, feature)
        assert reason, f"{feature}: UnsupportedFeature without a reason"
        print(f"{feature}: UnsupportedFeature: {reason}")
    time.sleep(0.5)
    assert list(desk.compositors()) == [theirs.pid], f"a second compositor was started: {desk.compositors()}"
    kiosk.call("EndSession")
    assert theirs.poll() is None, "the kiosk's own compositor was stopped"
    assert gnomeshell.compare("AE", before, desk.settle()) == 0, "the screen is not as before the session"


# ---------------------------------------------------------------- GTK's settings through XSETTINGS

needs_xsettingsd = pytest.mark.skipif(bool(x11.missing_tools(xsettings=True)),
                                      reason=f"not installed: {x11.missing_tools(xsettings=True)}")
GTK_FEATURES = ("high-contrast", "large-text", "reduce-motion")


@needs_xsettingsd
def test_large_text_high_contrast_and_reduce_motion_reach_a_gtk_window_through_xsettings_and_go_back(make_desk):
    from test_wlroots_features import gtk_settings, ink, wait_for_settings

    desk = make_desk()
    desk.start_gtk_button()
    desk.start_daemon()
    kiosk = Kiosk(desk)
    supported = kiosk.prop("SupportedFeatures")
    assert all(f"'{feature}'" in supported for feature in GTK_FEATURES), supported
    before = desk.settle()
    original = gtk_settings(desk)
    assert original["theme"] == "Adwaita" and original["animations"] == "on", original
    text_before = ink(before)

    kiosk.call("StartSession", "{'features': <['large-text']>, 'text-scale': <1.5>}")
    wait_for_settings(desk, {"dpi": str(int(int(original["dpi"]) * 1.5))})
    text_large = ink(desk.settle())
    ratio = text_large[0] / text_before[0], text_large[1] / text_before[1]
    print(f"\nlarge-text 1.5: the label's ink {text_before} -> {text_large} px")
    assert 1.35 < ratio[0] < 1.65 and 1.25 < ratio[1] < 1.65, ratio
    [xsettingsd] = desk.programs("xsettingsd")

    kiosk.call("ConfigureForSession", "['high-contrast']", "true")
    wait_for_settings(desk, {"theme": "HighContrast"})

    # The service is killed and started again: the same xsettingsd, adopted,
    # still its own (the features still offered), and a change still reaches GTK.
    os.kill(daemon_pid(desk), signal.SIGKILL)
    desk.processes["guidedaccessd"].wait(5)
    desk.start_daemon()
    time.sleep(0.5)
    assert list(desk.programs("xsettingsd")) == [xsettingsd], desk.programs("xsettingsd")
    supported = kiosk.prop("SupportedFeatures")
    assert all(f"'{feature}'" in supported for feature in GTK_FEATURES), \
        f"after adopting its own xsettingsd the service no longer offers GTK's settings: {supported}"
    kiosk.call("ConfigureForSession", "['reduce-motion']", "true")
    wait_for_settings(desk, {"animations": "off", "theme": "HighContrast"})

    kiosk.call("EndSession")
    wait_for_settings(desk, original)
    wait_until(lambda: not desk.programs("xsettingsd"), 2, "xsettingsd still runs after EndSession")
    assert gnomeshell.compare("AE", before, desk.settle()) == 0, "the window is not as it was before the session"


@needs_xsettingsd
def test_with_a_settings_manager_of_the_kiosks_own_gtks_settings_are_unsupported_and_name_it(make_desk):
    desk = make_desk()
    desk.start_gtk_button()
    config = desk.root / "kiosk-xsettingsd.conf"
    config.write_text('Net/ThemeName "Adwaita"\n')
    os.chown(config, desk.user.pw_uid, desk.user.pw_gid)
    theirs = desk.spawn("kiosk-xsettingsd", [x11.XSETTINGSD, "-c", config])
    wait_until(lambda: desk.selection_owner("_XSETTINGS_S0") != 0, 5,
               "the kiosk's xsettingsd did not become the settings manager")
    desk.start_daemon()
    kiosk = Kiosk(desk)
    supported = kiosk.prop("SupportedFeatures")
    assert not any(f"'{feature}'" in supported for feature in GTK_FEATURES), supported
    kiosk.call("StartSession", "{}")
    named = f"xsettingsd (pid {theirs.pid})"
    for feature in GTK_FEATURES:
        reason = unsupported(kiosk, feature)
        assert named in reason, reason
    print(f"\n{', '.join(GTK_FEATURES)}: UnsupportedFeature: {reason}")
    time.sleep(0.5)
    assert list(desk.programs("xsettingsd")) == [theirs.pid], f"a second one was started: {desk.programs('xsettingsd')}"
    kiosk.call("EndSession")
    assert theirs.poll() is None, "the kiosk's own xsettingsd was stopped"
