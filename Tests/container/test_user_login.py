"""guidedaccessd in user mode across a power cut, on a real systemd: the
installed user unit enabled for every user (`systemctl --global enable
guidedaccessd-user.service`, docs/dbus-api.md "Running the service") starts
at the kiosk user's login — user@UID.service reaching default.target, as
pam_systemd starts it — and takes up the journal before any client calls: a
session whose time limit passed while the kiosk was off is ended, one in
progress is resumed. A container of its own whose changes survive power-off
(nspawn.Container(persistent=True)); the kiosk user's configuration names
its desktop, as there is no graphical session here to detect.
"""

import time

import nspawn
import pytest
import user_session as us
from conftest import _CONTAINER, shut_down
from container_setup import FACTS, KIOSK_USER, install_package

SERVICE = "guidedaccessd-user.service"
ZOOM_KEY = ("org.gnome.desktop.a11y.applications", "screen-magnifier-enabled")
DCONF_KEY = "/org/gnome/desktop/a11y/applications/screen-magnifier-enabled"
USER_CONFIG = "[Service]\nDesktop=gnome-shell\n"


@pytest.fixture(scope="module")
def login_kiosk(rootfs, stage, workdir):
    directory = workdir / "login"
    directory.mkdir()
    ct = nspawn.Container(rootfs, stage, directory, persistent=True, suffix="-login")
    ct.failure_journal = ("the kiosk user's manager and units", ["_UID=1000", "-u", "user@1000.service"])
    try:
        FACTS["login container: boot"] = f"{ct.boot():.1f} s"
        _CONTAINER.insert(0, ct)  # the one a failure's report reads the journal of
        install_package(ct)
        us.add_user(ct)
        ct.sh(f"mkdir -p ~/.config/guidedaccess && printf '{USER_CONFIG}' > ~/.config/guidedaccess/guidedaccess.conf",
              user=KIOSK_USER)
        yield ct
    finally:
        shut_down(ct, "login container")


def log_in(ct):
    """What a login does for the kiosk user: pam_systemd starts its manager,
    which starts default.target. Returns the seconds until the service runs."""
    started = time.monotonic()
    ct.run(["systemctl", "start", f"user@{ct.uid(KIOSK_USER)}.service"])
    us.wait_unit(ct, SERVICE, "started at login", lambda u: u["ActiveState"] == "active", "ActiveState")
    return time.monotonic() - started


def magnifier(ct):
    """The key as the kiosk user reads it: straight from its dconf database
    (`dconf read` needs no bus), so that nothing here calls anything."""
    return ct.run(["dconf", "read", DCONF_KEY], user=KIOSK_USER).stdout.strip()


def gdbus(ct, method, *args):
    return ct.run(["gdbus", "call", "--session", "--dest", "org.guidedaccess.GuidedAccess1", "--object-path",
                   "/org/guidedaccess/GuidedAccess1", "--method", f"org.guidedaccess.GuidedAccess1.{method}", *args],
                  user=KIOSK_USER).stdout.strip()


def service_log(ct):
    ct.run(["journalctl", "--sync"])
    return ct.run(["journalctl", "--user", "-b", "--no-pager", "-q", "-o", "cat", "-u", SERVICE], user=KIOSK_USER).stdout


def activations(ct):
    """The session bus's D-Bus activations of the service since boot."""
    ct.run(["journalctl", "--sync"])
    return ct.run(["journalctl", "--user", "-b", "--no-pager", "-q", "-o", "cat", "-u", "dbus.service"],
                  user=KIOSK_USER).stdout.count("org.guidedaccess.GuidedAccess1")


def test_the_package_does_not_enable_the_user_unit(login_kiosk):
    ct = login_kiosk
    assert ct.run(["systemctl", "--global", "is-enabled", SERVICE], check=False).stdout.strip() == "disabled"


def test_a_session_whose_time_limit_passed_during_a_power_cut_is_ended_at_the_next_login(login_kiosk):
    ct = login_kiosk
    ct.run(["systemctl", "--global", "enable", SERVICE])
    FACTS["login container: login → service running"] = f"{log_in(ct):.2f} s"
    assert activations(ct) == 0, "the service was D-Bus activated, not started at login"
    assert magnifier(ct) in ("", "false")
    gdbus(ct, "StartSession", "{'features': <['zoom']>, 'time-limit': <uint64 2>}")
    started = time.monotonic()
    assert magnifier(ct) == "true"

    ct.reboot()
    # The power came back: the session's zoom is still in the kiosk user's
    # settings, and nobody has logged in yet.
    assert magnifier(ct) == "true"
    time.sleep(max(0.0, started + 2.5 - time.monotonic()))
    login = time.monotonic()
    seconds = log_in(ct)
    # No client calls: the service, started at login, ends the session.
    us.wait_for(lambda: magnifier(ct) == "", "zoom off after the login", timeout=10)
    FACTS["login container: login → zoom off (time limit passed while off)"] = f"{time.monotonic() - login:.2f} s"
    assert activations(ct) == 0, "a client call started the service"
    log = service_log(ct)
    assert "its time limit passed while the service was down; ending it" in log, log
    assert "session ended (time-limit)" in log, log
    assert seconds < 10


def test_a_session_in_progress_at_a_power_cut_is_resumed_at_the_next_login(login_kiosk):
    ct = login_kiosk
    if ct.run(["systemctl", "--global", "is-enabled", SERVICE], check=False).stdout.strip() != "enabled":
        ct.run(["systemctl", "--global", "enable", SERVICE])
        log_in(ct)
    gdbus(ct, "StartSession", "{'features': <['zoom']>}")
    ct.reboot()
    log_in(ct)
    us.wait_for(lambda: "resumed the session of uid 1000" in service_log(ct), "the session resumed at login")
    assert activations(ct) == 0
    assert magnifier(ct) == "true"
    # gdbus again: the owner's identity (same user, same program) takes it over and ends it.
    gdbus(ct, "EndSession")
    us.wait_for(lambda: magnifier(ct) == "", "zoom off after EndSession")
    ct.run(["systemctl", "--global", "disable", SERVICE])
