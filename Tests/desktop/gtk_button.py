"""A kiosk's app, for desktop tests: a GTK 3 window titled TITLE whose only
control, a button labelled LABEL, has the keyboard focus:
    python3 gtk_button.py TITLE LABEL
It has what a screen reader needs to speak it (the accessibility bridge,
unless NO_AT_BRIDGE is set) and what text scaling and high contrast change:
the button is centred at its natural size, so its size on the screen is its
label's, in the theme's colours.

It prints a line, so a harness can wait for it, when the window is mapped
("mapped"), when it becomes the active window ("active": only once the seat
has a keyboard), when the button gets the keyboard focus ("focus": GTK's
focus event, which a screen reader speaks), and the GTK settings that
GuidedAccess's features change, at start and whenever they change
("animations on|off", "theme NAME", "dpi N": GTK's own view of
enable-animations, high-contrast and text-scaling-factor).

Run with the system's python3 (python3-gi, gir1.2-gtk-3.0) in the desktop's
environment: sway.Desktop.start_gtk_button(), gnomeshell.Desktop.show_window()."""

import sys

import gi

gi.require_version("Gtk", "3.0")
from gi.repository import Gtk  # noqa: E402


def say(line):
    print(line, flush=True)


def main(title, label):
    window = Gtk.Window(title=title)
    window.connect("destroy", Gtk.main_quit)
    window.connect("map-event", lambda *_: say("mapped"))
    window.connect("notify::is-active", lambda w, _: w.props.is_active and say("active"))
    button = Gtk.Button(label=label, halign=Gtk.Align.CENTER, valign=Gtk.Align.CENTER)
    button.connect("focus-in-event", lambda *_: say("focus"))
    window.add(button)
    settings = Gtk.Settings.get_default()
    for name, show in (("gtk-enable-animations", lambda v: f"animations {'on' if v else 'off'}"),
                       ("gtk-theme-name", lambda v: f"theme {v}"),
                       ("gtk-xft-dpi", lambda v: f"dpi {v}")):
        say(show(settings.get_property(name)))
        settings.connect(f"notify::{name}", lambda s, _, name=name, show=show: say(show(s.get_property(name))))
    window.show_all()
    button.grab_focus()
    Gtk.main()


if __name__ == "__main__":
    main(*sys.argv[1:3])
