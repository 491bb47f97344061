#!/usr/bin/python3
"""The kiosk-session example in Python with dbus-python: starts a Guided
Access session with the screen reader, turns zoom on with
ConfigureForSession, prints SessionChanged/RestrictionChanged as they come
for N seconds (a GLib main loop), then ends the session.

    python3 Examples/kiosk_session.py [--address ADDR] [--seconds N]

Contract: docs/dbus-api.md (org.guidedaccess.GuidedAccess1)."""

import argparse
import sys

import dbus
import dbus.mainloop.glib
from gi.repository import GLib

NAME = "org.guidedaccess.GuidedAccess1"
PATH = "/org/guidedaccess/GuidedAccess1"
IFACE = "org.guidedaccess.GuidedAccess1"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="bus address (default: the session bus)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the session lasts (default 5)")
    args = parser.parse_args()

    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    if args.address:
        bus = dbus.bus.BusConnection(args.address)
    else:
        bus = dbus.SessionBus()
    service = dbus.Interface(bus.get_object(NAME, PATH, introspect=False), IFACE)
    loop = GLib.MainLoop()

    def on_session_changed(active, reason):
        print(f"event: session {'active' if active else 'inactive'} ({reason})", flush=True)
        if not active and ending:
            loop.quit()

    def on_restriction_changed(identifier, state):
        print(f"event: restriction {identifier} {state}", flush=True)

    ending = []
    # Subscribed before the session starts, so its start is seen.
    bus.add_signal_receiver(on_session_changed, "SessionChanged", IFACE, NAME, PATH)
    bus.add_signal_receiver(on_restriction_changed, "RestrictionChanged", IFACE, NAME, PATH)

    try:
        service.StartSession(dbus.Dictionary({"features": dbus.Array(["screen-reader"], signature="s")},
                                             signature="sv"))
        service.ConfigureForSession(dbus.Array(["zoom"], signature="s"), True)
        print("session started: screen-reader, zoom", flush=True)

        failures = []

        def end():
            ending.append(True)
            try:
                service.EndSession()
            except dbus.exceptions.DBusException as error:
                failures.append(error)
                loop.quit()
                return False
            # The SessionChanged(false) signal stops the loop; this is a fallback.
            GLib.timeout_add(2000, loop.quit)
            return False

        GLib.timeout_add(int(args.seconds * 1000), end)
        loop.run()
        if failures:
            raise failures[0]
    except dbus.exceptions.DBusException as error:
        print(f"kiosk_session: {error.get_dbus_message()} ({error.get_dbus_name()})", file=sys.stderr)
        return 1
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
