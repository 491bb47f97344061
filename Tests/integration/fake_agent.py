"""A session agent that misbehaves on purpose, for the service's fault
tests: argv CALLS DELAY MODE. It exports org.guidedaccess.Agent1 at
/org/guidedaccess/Agent on the system bus (DBUS_SYSTEM_BUS_ADDRESS),
claiming to deliver large-text and screen-reader on sway, and registers
with the service. Every call it gets is appended to the file CALLS
("Apply large-text,screen-reader", "Release"). Apply([]) is answered at
once; an Apply with features after DELAY seconds (MODE "answer"), or the
process exits inside it without answering (MODE "exit"). Prints "registered" or "refused NAME: MESSAGE" once.
"""

import sys

import dbus
import dbus.service
from dbus.mainloop.glib import DBusGMainLoop
from gi.repository import GLib

IFACE = "org.guidedaccess.Agent1"
PATH = "/org/guidedaccess/Agent"
calls_path, delay, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]


def note(text):
    with open(calls_path, "a") as out:
        out.write(text + "\n")


class Agent(dbus.service.Object):
    @dbus.service.method(IFACE, in_signature="asa{sv}", out_signature="", async_callbacks=("reply", "error"))
    def Apply(self, features, parameters, reply, error):
        note("Apply " + ",".join(sorted(str(f) for f in features)))
        if not features:
            reply()
            return
        if mode == "exit":
            sys.stdout.flush()
            GLib.idle_add(lambda: sys.exit(0) or False)
            loop.quit()
            return
        GLib.timeout_add(int(delay * 1000), lambda: reply() or False)

    @dbus.service.method(IFACE, in_signature="", out_signature="")
    def Release(self):
        note("Release")

    @dbus.service.method(dbus.PROPERTIES_IFACE, in_signature="ss", out_signature="v")
    def Get(self, interface, name):
        return self.GetAll(interface)[name]

    @dbus.service.method(dbus.PROPERTIES_IFACE, in_signature="s", out_signature="a{sv}")
    def GetAll(self, interface):
        return {
            "SupportedFeatures": dbus.Array(["large-text", "screen-reader"], signature="s"),
            "Desktop": "sway",
            "UnsupportedReasons": dbus.Dictionary({}, signature="ss"),
        }


DBusGMainLoop(set_as_default=True)
bus = dbus.SystemBus()
agent = Agent(bus, PATH)
try:
    bus.call_blocking("org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                      "org.guidedaccess.GuidedAccess1", "RegisterAgent", "", (), timeout=10)
    print("registered", flush=True)
except dbus.exceptions.DBusException as error:
    print(f"refused {error.get_dbus_name()}: {error.get_dbus_message()}", flush=True)
loop = GLib.MainLoop()
loop.run()
