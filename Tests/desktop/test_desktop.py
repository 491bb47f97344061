"""guidedaccessd against a real, headless GNOME Shell 43: what a kiosk client
turns on through D-Bus must show on the screen, and the screen must be as it
was once the session ends.

A dbus-python connection plays the kiosk (a client we did not write), on the
session bus of a headless gnome-shell (gnomeshell.py); guidedaccessd --user
runs on that bus with the shell's dconf. After each step the test waits until
the screen has settled (screenshots through org.gnome.Shell.Screenshot,
polled) and asserts on measured pixels, never on keys:

- ConfigureForSession outside a session: NotInSession, screen unchanged;
- invert-colors: the mean lightness of the wallpaper goes to 1 - before;
- grayscale: the mean saturation goes to ~0;
- zoom (factor 2): most pixels change, and the screen is the middle
  640×400 of the screen before, scaled ×2;
- high-contrast: the shell's high-contrast stylesheet makes the top bar's
  labels pure white (#f2f2f2 before): the "Activities" label brightens;
- each feature turned off again, and EndSession: the screen equals the one
  before (ImageMagick compare -metric AE = 0, the clock left out).

Screenshots of the steps go, 640 px wide, to $GA_DESKTOP_PICTURES (relative
to the current directory) or else .build/desktop-pictures; the pictures the README links,
pictures under docs/pictures/ are made with
    GA_DESKTOP_PICTURES=docs/pictures .venv/bin/python -m pytest -q Tests/desktop
Contract: docs/dbus-api.md, docs/settings-mapping.md."""

import os
import time
from pathlib import Path

import pytest

import gnomeshell
from gnomeshell import ACTIVITIES, BODY, GA_ERROR, GA_IFACE, GA_NAME, GA_PATH, HEIGHT, TOP_BAR, WIDTH, changed_pixels

PIXELS = WIDTH * HEIGHT


def pictures_dir():
    configured = os.environ.get("GA_DESKTOP_PICTURES")
    return Path(configured).resolve() if configured else gnomeshell.REPO_ROOT / ".build" / "desktop-pictures"


@pytest.fixture
def desk(request):
    """A headless GNOME Shell with a known wallpaper and the overview closed,
    and guidedaccessd on its session bus. Afterwards every process it started
    must be gone."""
    missing = gnomeshell.missing_tools()
    if missing:
        pytest.skip(f"cannot run a real GNOME Shell here: {', '.join(missing)} not installed "
                    "(scripts/install-deps installs gnome-shell and imagemagick)")
    desktop = gnomeshell.Desktop()
    request.node.desktop = desktop
    try:
        wallpaper = desktop.root / "wallpaper.png"
        gnomeshell.write_wallpaper(wallpaper)
        desktop.gsettings_set("org.gnome.desktop.background", "picture-uri", f"'file://{wallpaper}'")
        # No banners: the shell greets root with a "privileged user"
        # notification that would come and go during the test.
        desktop.gsettings_set("org.gnome.desktop.notifications", "show-banners", "false")
        desktop.start_shell()
        desktop.close_overview()
        desktop.start_daemon()
        yield desktop
    finally:
        left = desktop.stop()
        assert not left, f"processes still running after the test: {left}"
        assert not desktop.root.exists(), f"{desktop.root} is still there"


class Kiosk:
    """The kiosk program: its own dbus-python connection, calling the service."""

    def __init__(self, desktop):
        import dbus

        self.dbus = dbus
        self.connection = desktop.connect()
        self.proxy = self.connection.get_object(GA_NAME, GA_PATH, introspect=False)

    def call(self, member, *args, signature=None):
        return self.proxy.get_dbus_method(member, GA_IFACE)(*args, signature=signature, timeout=15)

    def start_session(self, features=()):
        options = {"features": self.dbus.Array(features, signature="s")} if features else {}
        self.call("StartSession", self.dbus.Dictionary(options, signature="sv"), signature="a{sv}")

    def configure(self, features, enabled):
        self.call("ConfigureForSession", self.dbus.Array(features, signature="s"), enabled, signature="asb")

    def end_session(self):
        self.call("EndSession")

    def error_of(self, member, *args, **kwargs):
        try:
            getattr(self, member)(*args, **kwargs)
        except self.dbus.exceptions.DBusException as error:
            return error.get_dbus_name()
        raise AssertionError(f"{member}{args} succeeded; an error was expected")


def test_features_show_on_a_real_gnome_shell_and_the_session_end_restores_the_screen(desk):
    started = time.monotonic()
    figures = []
    pictures = pictures_dir()
    kiosk = Kiosk(desk)

    def note(text):
        figures.append(text)
        print(text)

    def back_to_before(step):
        shot = desk.settle(lambda s: s.same(before))
        changed = changed_pixels(before, shot)
        assert changed == 0, f"{step}: {changed} pixels still differ from the screen before the session"
        return shot

    # guidedaccessctl doctor says what this test proves.
    report = gnomeshell.doctor_agrees(
        desk.run([str(gnomeshell.CTL_BINARY), "--address", desk.session_address, "doctor", "--json"], check=False),
        str([str(f) for f in kiosk.proxy.Get(GA_IFACE, "SupportedFeatures",
                                            dbus_interface="org.freedesktop.DBus.Properties")]))
    assert report["desktop"] == "gnome-shell", report
    note(f"guidedaccessctl doctor: desktop {report['desktop']}, missing {report['missing']}: "
         + "; ".join(report["features"][name]["reason"] for name in report["missing"]))

    before = desk.settle()
    gnomeshell.write_picture(before, pictures / "before.png")
    l_before, s_before = before.lightness(), before.saturation()
    note(f"before: mean lightness {l_before:.3f}, mean saturation {s_before:.3f}")

    # ---- outside a session: refused, and nothing changes on the screen
    assert kiosk.error_of("configure", ["invert-colors"], True) == GA_ERROR + "NotInSession"
    differing = desk.unchanged_for(before, 1.5)
    assert not differing, (f"ConfigureForSession outside a session changed the screen: "
                           f"{changed_pixels(before, differing[0])} pixels")
    note("ConfigureForSession outside a session: NotInSession, 0 pixels changed in 1.5 s")

    # ---- invert-colors (as part of StartSession): lightness L becomes 1 - L
    kiosk.start_session(["invert-colors"])
    inverted = desk.settle(lambda s: not s.same(before))
    l_inverted = inverted.lightness()
    gnomeshell.write_picture(inverted, pictures / "inverted.png")
    note(f"invert-colors: mean lightness {l_before:.3f} -> {l_inverted:.3f}, "
         f"{changed_pixels(before, inverted)} of {PIXELS} pixels changed")
    assert l_inverted > l_before + 0.3 and abs(l_inverted - (1 - l_before)) < 0.03, (
        f"invert-colors: mean lightness {l_before:.3f} -> {l_inverted:.3f}; expected about {1 - l_before:.3f}")
    kiosk.configure(["invert-colors"], False)
    back_to_before("invert-colors off")

    # ---- grayscale: saturation to ~0, lightness kept
    kiosk.configure(["grayscale"], True)
    gray = desk.settle(lambda s: not s.same(before))
    s_gray, l_gray = gray.saturation(), gray.lightness()
    gnomeshell.write_picture(gray, pictures / "grayscale.png")
    note(f"grayscale: mean saturation {s_before:.3f} -> {s_gray:.3f} (lightness {l_before:.3f} -> {l_gray:.3f})")
    assert s_before > 0.5 and s_gray < 0.02, f"grayscale: mean saturation {s_before:.3f} -> {s_gray:.3f}"
    assert abs(l_gray - l_before) < 0.03, f"grayscale changed the lightness: {l_before:.3f} -> {l_gray:.3f}"
    kiosk.configure(["grayscale"], False)
    back_to_before("grayscale off")

    # ---- zoom ×2: the middle of the screen, magnified (the pointer rests in
    # the middle of the virtual monitor, where the magnifier follows it)
    kiosk.configure(["zoom"], True)
    zoomed = desk.settle(lambda s: not s.same(before))
    gnomeshell.write_picture(zoomed, pictures / "zoomed.png")
    changed = changed_pixels(before, zoomed)
    # Under the top bar: the zoomed screen's clock area shows wallpaper, and
    # is masked all the same.
    middle = before.region_file((WIDTH // 4, HEIGHT // 4 + TOP_BAR // 2, WIDTH // 2, HEIGHT // 2 - TOP_BAR // 2),
                                scale=f"{WIDTH}x{HEIGHT - TOP_BAR}!")
    error_scaled = gnomeshell.compare("RMSE", middle, zoomed.region_file(BODY))
    error_unscaled = gnomeshell.compare("RMSE", before.region_file(BODY), zoomed.region_file(BODY))
    note(f"zoom: {changed} of {PIXELS} pixels changed; RMSE against the middle of before scaled x2 "
         f"{error_scaled:.4f}, against before itself {error_unscaled:.4f}")
    assert changed > PIXELS // 2, f"zoom changed only {changed} of {PIXELS} pixels"
    assert error_scaled < 0.05 and error_scaled < error_unscaled / 3, (
        f"zoom: the screen is not the middle of the one before scaled x2 (RMSE {error_scaled:.4f}; "
        f"{error_unscaled:.4f} against the unscaled screen)")
    kiosk.configure(["zoom"], False)
    back_to_before("zoom off")

    # ---- high-contrast: the shell's stylesheet changes; its top bar labels
    # turn from #f2f2f2 to #ffffff
    kiosk.configure(["high-contrast"], True)
    contrast = desk.settle(lambda s: not s.same(before))
    gnomeshell.write_picture(contrast, pictures / "high-contrast.png")
    label_before, label_after = before.brightest(ACTIVITIES), contrast.brightest(ACTIVITIES)
    label_changed = changed_pixels(before, contrast, ACTIVITIES)
    body_changed = changed_pixels(before, contrast, BODY)
    note(f"high-contrast: 'Activities' label: {label_changed} pixels changed, brightest gray "
         f"{label_before:.3f} -> {label_after:.3f}; wallpaper: {body_changed} pixels changed")
    assert label_changed > 50 and label_before < 0.97 and label_after > 0.99, (
        f"high-contrast: the 'Activities' label did not turn white: {label_changed} pixels changed, "
        f"brightest {label_before:.3f} -> {label_after:.3f}")
    assert body_changed == 0, f"high-contrast changed {body_changed} pixels of the wallpaper"

    # ---- EndSession: the screen before the session, exactly
    kiosk.end_session()
    restored = back_to_before("after EndSession")
    gnomeshell.write_picture(restored, pictures / "restored.png")
    note("EndSession: 0 pixels differ from the screen before the session (clock left out)")

    # ---- outside a session again: still refused, still nothing on screen
    assert kiosk.error_of("configure", ["zoom"], True) == GA_ERROR + "NotInSession"
    differing = desk.unchanged_for(before, 1.0)
    assert not differing, "ConfigureForSession after the session changed the screen"

    note(f"steps took {time.monotonic() - started:.1f} s; pictures in {pictures}")
