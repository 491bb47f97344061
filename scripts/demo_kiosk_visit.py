"""scripts/demo's body: one customer's visit to a kiosk on a real headless
GNOME Shell 43 (no gnome-session: nothing but guidedaccessd starts a screen
reader), showing what the customer gets — the screen measured on
screenshots, and the words the screen reader spoke, heard in
speech-dispatcher's log and as sound recorded from a PipeWire null sink —
and that the next customer gets the kiosk back exactly as it was.

Everything runs on private buses, in a private directory and a private
mount namespace (Tests/desktop/gnomeshell.py, speech.py); nothing of the
machine's own settings is touched, and it is all removed at the end.
GUIDEDACCESSD names the binary; GA_DEMO_PICTURES=DIR keeps the screenshots."""

import os
import re
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "Tests" / "desktop"))

import gnomeshell  # noqa: E402
import speech  # noqa: E402
from gnomeshell import BODY, GA_IFACE, GA_NAME, GA_PATH, HEIGHT, WIDTH, changed_pixels  # noqa: E402

PIXELS = WIDTH * HEIGHT
A11Y_APPS = "org.gnome.desktop.a11y.applications"
MAGNIFIER = "org.gnome.desktop.a11y.magnifier"


def say(text):
    print(f"\n== {text}", flush=True)


def note(text):
    print(f"   {text}", flush=True)


class Demo:
    def __init__(self, desk):
        self.desk = desk

    def show(self, *argv):
        """Runs a command in the desktop, printing it and its output."""
        print(f"$ {' '.join(argv)}", flush=True)
        started = time.time()
        out = self.desk.run(list(argv))
        for line in out.strip().splitlines():
            note(line)
        return started, time.time()

    def busctl(self, verb, *args):
        return self.show("busctl", f"--address={self.desk.session_address}", verb, GA_NAME, GA_PATH, GA_IFACE, *args)

    def gsettings(self, schema, key):
        return self.desk.run(["gsettings", "get", schema, key]).strip()

    def dconf(self, path):
        return self.desk.run(["dconf", "read", path]).strip() or "(unset)"


def main():
    missing = gnomeshell.missing_tools(screen_reader=True) + speech.missing_tools()
    if missing:
        sys.exit(f"demo: not installed: {', '.join(missing)} (scripts/install-deps installs them)")
    pictures = Path(os.environ["GA_DEMO_PICTURES"]).resolve() if os.environ.get("GA_DEMO_PICTURES") else None
    desk = gnomeshell.Desktop(xwayland=True, accessibility=True)
    capture = speech.Speech(desk.env, desk.root / "speech", spawn=desk.spawn)
    demo = Demo(desk)
    try:
        say("A real GNOME Shell 43, headless (1280x800), without gnome-session, on private buses")
        note(f"(HOME, XDG_RUNTIME_DIR, the buses ... under {desk.root}; Xwayland in a private /tmp, for Orca)")
        wallpaper = desk.root / "wallpaper.png"
        gnomeshell.write_wallpaper(wallpaper)
        desk.gsettings_set("org.gnome.desktop.background", "picture-uri", f"'file://{wallpaper}'")
        desk.gsettings_set("org.gnome.desktop.notifications", "show-banners", "false")
        desk.start_shell()
        capture.start()
        desk.close_overview()
        desk.show_window(title="Kiosk", label="Order now")
        desk.press(gnomeshell.KEY_TAB)
        desk.wait_for_output("gtk-button", "active", 10)
        note("the kiosk's app: a GTK window 'Kiosk' with a focused button 'Order now'")
        note("speech: speech-dispatcher's log, and the sound recorded from a PipeWire null sink")

        say("The kiosk's own settings: a magnification of 1.5; the rest unset")
        demo.show("gsettings", "set", MAGNIFIER, "mag-factor", "1.5")
        before = desk.settle()
        l_before = before.lightness()
        note(f"the screen: mean lightness {l_before:.3f}")

        say("guidedaccessd --user, started as D-Bus activation would (no DISPLAY, no WAYLAND_DISPLAY)")
        desk.start_daemon(without=("WAYLAND_DISPLAY", "DISPLAY", "XAUTHORITY"))
        for line in desk.log("guidedaccessd").splitlines():
            if "desktop:" in line or "supported features" in line:
                note(line.split("] ", 1)[-1])
        demo.busctl("get-property", "Desktop", "Backend", "SupportedFeatures")

        say("A customer arrives: the kiosk app starts a session with zoom and invert colors")
        demo.busctl("call", "StartSession", "a{sv}", "1", "features", "as", "2", "zoom", "invert-colors")
        shot = desk.settle(lambda s: not s.same(before))
        note(f"the screen: mean lightness {l_before:.3f} -> {shot.lightness():.3f} (inverted), "
             f"{changed_pixels(before, shot)} of {PIXELS} pixels changed (magnified x2)")
        if pictures:
            gnomeshell.write_picture(shot, pictures / "visit-zoom-invert.png")

        say("...and, for a blind customer, the screen reader")
        on, _ = demo.busctl("call", "ConfigureForSession", "asb", "1", "screen-reader", "true")
        note(f"Orca running: pid {', '.join(map(str, speech.screen_readers(desk.env)))} (started by guidedaccessd)")
        capture.log.wait_for("Order now push button", after=on, timeout=15)
        time.sleep(1.0)
        note("what the customer hears (speech-dispatcher's log; peak level of the recorded sound):")
        for utterance in capture.log.utterances():
            if utterance.time >= on:
                level = capture.recording.level(utterance.time, utterance.time + 0.6)
                note(f"  +{utterance.time - on:4.2f} s  \"{utterance.text}\"   (peak {level.peak:.2f})")
        first = capture.recording.first_sound(on, on + 10)
        note(f"first sound {first - on:.2f} s after the reply")

        say("The customer leaves: the session ends")
        end, _ = demo.busctl("call", "EndSession")
        deadline = time.time() + 3
        while speech.screen_readers(desk.env) and time.time() < deadline:
            time.sleep(0.02)
        gone = time.time() - end
        last = capture.recording.last_sound(end, end + 3)
        note(f"Orca gone {gone:.2f} s after the reply; last sound "
             f"{'none' if last is None else f'{last - end:+.2f} s'} after it (queued speech is cancelled)")
        restored = desk.settle(lambda s: s.same(before))
        note(f"the screen: {changed_pixels(before, restored)} pixels differ from before the session (clock left out)")
        if pictures:
            gnomeshell.write_picture(restored, pictures / "visit-restored.png")

        say("Everything is as the kiosk had it: 1.5 again, the unset keys unset again (not written with defaults)")
        note(f"mag-factor {demo.gsettings(MAGNIFIER, 'mag-factor')}; dconf: "
             f"screen-magnifier-enabled {demo.dconf('/org/gnome/desktop/a11y/applications/screen-magnifier-enabled')}, "
             f"invert-lightness {demo.dconf('/org/gnome/desktop/a11y/magnifier/invert-lightness')}, "
             f"screen-reader-enabled {demo.dconf('/org/gnome/desktop/a11y/applications/screen-reader-enabled')}")

        say("What the service logged")
        # What the programs it ran wrote (Orca's goodbye included) is in the
        # same log, at info and labelled with the program ("orca[PID]: ..."):
        # counted here, not shown as if it were the service's.
        programs = {}
        for line in desk.log("guidedaccessd").splitlines():
            labelled = re.search(r"\] ([A-Za-z0-9_.+-]+)\[\d+\]: ", line)
            if labelled:
                programs[labelled.group(1)] = programs.get(labelled.group(1), 0) + 1
            else:
                note(line)
        for program, count in sorted(programs.items()):
            note(f"(and {count} lines {program} itself wrote, kept in the service's log as {program}[PID]: ...)")
    finally:
        capture.stop()
        desk.stop()


if __name__ == "__main__":
    main()
