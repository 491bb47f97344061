"""guidedaccessd in system mode across a reboot of the machine: a second
container whose changes survive power-off (nspawn.Container(persistent=True)).

Before the reboot the kiosk user has values of its own and root starts a
session. Powering off stops the service as a reboot does (SIGTERM: the
session stays in the journal). After the boot, before anyone calls, the
kiosk user still sees the session's values, locked; the first call starts
the service (D-Bus activation), which resumes the session from its journal;
EndSession gives the kiosk user its own values back, writable.
"""

from container_setup import FACTS, KIOSK_USER
from test_container import A11Y, MAG, OWN, UNIT, gdbus, kiosk_own_db, kiosk_view, prop, unit, wait_for

# zoom at 4.0 and invert-colors: the SESSION of test_container without
# high-contrast, which stays the kiosk user's own and writable
# (LockOutsideSession=false in the test's configuration).
SESSION = {**OWN, ("org.gnome.desktop.a11y.applications", "screen-magnifier-enabled"): "true",
           (MAG, "mag-factor"): "4.0", (MAG, "invert-lightness"): "true"}
FREE = {(A11Y, "high-contrast")}


def expect(ct, values, locked):
    assert kiosk_view(ct) == {
        key: (value, "false" if locked and key not in FREE else "true") for key, value in values.items()}


def test_a_session_survives_a_reboot_and_its_end_restores_the_kiosk_users_values(rebootable):
    ct = rebootable
    ct.run(["gsettings", "set", MAG, "mag-factor", "3.0"], user=KIOSK_USER)
    own_values = {**OWN}
    expect(ct, own_values, locked=False)
    own_db = kiosk_own_db(ct)
    gdbus(ct, "StartSession", "{'features': <['zoom', 'invert-colors']>, 'zoom-factor': <4.0>}")
    expect(ct, SESSION, locked=True)
    pid_before = int(unit(ct, "MainPID")["MainPID"])
    assert pid_before > 0

    seconds = ct.reboot()
    FACTS["reboot container: boot after the reboot"] = f"{seconds:.1f} s"
    ct.run(["systemctl", "start", f"user@{ct.uid(KIOSK_USER)}.service"])

    # Before any call, the lock holds: it is in the dconf database on disk.
    expect(ct, SESSION, locked=True)
    # A call (D-Bus activation if the service is not running) finds the
    # session resumed from the journal.
    assert prop(ct, "SessionActive") is True
    assert prop(ct, "EnabledFeatures") == ["invert-colors", "zoom"]
    log = ct.run(["journalctl", "--no-pager", "-b", "-u", UNIT, "-o", "cat"]).stdout
    assert "resumed the session of uid 0 running /usr/bin/gdbus" in log, log

    # Root with gdbus again: the same identity as the owner from before the reboot.
    gdbus(ct, "EndSession")
    wait_for(lambda: prop(ct, "SessionActive") is False, "the session's end")
    expect(ct, own_values, locked=False)
    assert kiosk_own_db(ct) == own_db, "the kiosk user's own database changed"
