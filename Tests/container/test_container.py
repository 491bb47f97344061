"""guidedaccessd in system mode, installed from its Debian package into a Debian 12
container booted with systemd as PID 1: real D-Bus activation, bus policy,
polkit, logind, dconf system databases with locks, Restart=, the journal and
`systemd-analyze security`.

The steps run in order and build on each other (one container for the
module): the session that step 3 starts is the one step 4 looks at, step 5
kills the service under, step 6 ends and step 9 finds in the journal.
Clients are gdbus (it names D-Bus errors), busctl, gsettings and dconf.
"""

import json
import re
import time

import pytest
from container_setup import CONFIG, FACTS, KIOSK_USER

BUS = "org.guidedaccess.GuidedAccess1"
OBJECT = "/org/guidedaccess/GuidedAccess1"
IFACE = "org.guidedaccess.GuidedAccess1"
UNIT = "guidedaccessd.service"

MAG = "org.gnome.desktop.a11y.magnifier"
APPS = "org.gnome.desktop.a11y.applications"
A11Y = "org.gnome.desktop.a11y.interface"
# The keys zoom, invert-colors and high-contrast write (settings-mapping.md).
KEYS = [
    (APPS, "screen-magnifier-enabled"),
    (MAG, "mag-factor"),
    (MAG, "screen-position"),
    (MAG, "invert-lightness"),
    (A11Y, "high-contrast"),
]
# What the kiosk user set before any session (step 0), and what the rest
# of these keys are by default.
OWN = {
    (APPS, "screen-magnifier-enabled"): "false",
    (MAG, "mag-factor"): "3.0",
    (MAG, "screen-position"): "'full-screen'",
    (MAG, "invert-lightness"): "false",
    (A11Y, "high-contrast"): "false",
}
# What the session of step 3 imposes: zoom at 4.0, invert-colors, high-contrast.
SESSION = {
    (APPS, "screen-magnifier-enabled"): "true",
    (MAG, "mag-factor"): "4.0",
    (MAG, "screen-position"): "'full-screen'",
    (MAG, "invert-lightness"): "true",
    (A11Y, "high-contrast"): "true",
}
# The schema defaults: what LockOutsideSession=true imposes outside a session.
DEFAULTS = {**OWN, (MAG, "mag-factor"): "2.0"}
RESTRICTION = "org.example.kiosk.print"

MESSAGE_IDS = {
    "sessionStarted": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a51",
    "sessionResumed": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a52",
    "sessionEnded": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a53",
    "featuresChanged": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a54",
    "restrictionChanged": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a55",
    "callDenied": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a56",
}

# What the steps learn and later steps check (main pids of the service).
STATE = {}


# --- clients ---------------------------------------------------------------


def gdbus(ct, method, *args, user=None, interactive=False, interface=IFACE, check=True):
    argv = ["gdbus", "call", "--system", "-d", BUS, "-o", OBJECT, "-m", f"{interface}.{method}", *args]
    if interactive:
        argv.insert(3, "--interactive")
    return ct.run(argv, user=user, check=check)


def error_of(result):
    """The D-Bus error name of a failed gdbus call."""
    assert result.returncode != 0, f"the call succeeded: {result.stdout}"
    match = re.search(r"GDBus\.Error:([\w.]+):", result.stderr)
    assert match, f"no D-Bus error in: {result.stderr}"
    return match.group(1)


def prop(ct, name, user=None):
    out = ct.run(["busctl", "--json=short", "get-property", BUS, OBJECT, IFACE, name], user=user).stdout
    return json.loads(out)["data"]


def unit(ct, *properties):
    out = ct.run(["systemctl", "show", "-p", ",".join(properties), UNIT]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def is_active(ct):
    return ct.run(["systemctl", "is-active", UNIT], check=False).stdout.strip()


def kiosk_view(ct):
    """{(schema, key): (value, writable)} as the kiosk user's gsettings sees it."""
    script = "".join(
        f'printf "%s\\t%s\\n" "$(gsettings get {s} {k})" "$(gsettings writable {s} {k})"\n' for s, k in KEYS)
    lines = ct.sh(script, user=KIOSK_USER).stdout.splitlines()
    assert len(lines) == len(KEYS), lines
    return {key: tuple(line.split("\t")) for key, line in zip(KEYS, lines)}


def kiosk_own_db(ct):
    """The kiosk user's own database alone (a profile with just user-db:user):
    what guidedaccessd must never write."""
    ct.sh("printf 'user-db:user\\n' > /tmp/user-db-only")
    out = ct.run(["env", "DCONF_PROFILE=/tmp/user-db-only", "dconf", "dump", "/"], user=KIOSK_USER).stdout
    return out


def inhibitors(ct):
    out = ct.run(["busctl", "--json=short", "call", "org.freedesktop.login1", "/org/freedesktop/login1",
                  "org.freedesktop.login1.Manager", "ListInhibitors"]).stdout
    return [i for i in json.loads(out)["data"][0] if i[1] == "GuidedAccess"]


def start_kiosk_monitor(ct):
    """`gsettings monitor` of the magnifier schema, a program of the kiosk
    user that keeps running (a transient unit, output to the journal)."""
    ct.run(["systemd-run", "--unit=kiosk-monitor", f"--uid={KIOSK_USER}", f"--setenv=HOME=/home/{KIOSK_USER}",
            f"--setenv=XDG_RUNTIME_DIR=/run/user/{ct.uid(KIOSK_USER)}",
            f"--setenv=DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{ct.uid(KIOSK_USER)}/bus",
            "gsettings", "monitor", MAG])


def monitored(ct):
    """What the running monitor was last told of each key (`key: value` lines)."""
    ct.run(["journalctl", "--sync"])
    out = ct.run(["journalctl", "--no-pager", "-o", "cat", "-u", "kiosk-monitor"]).stdout
    seen = {}
    for line in out.splitlines():
        key, _, value = line.partition(": ")
        if value:
            seen[key] = value
    return seen


def wait_for(predicate, what, timeout=15.0, interval=0.1):
    """predicate()'s first true value, polled every `interval` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def expect_view(ct, values, writable):
    view = kiosk_view(ct)
    expected = {key: (values[key], "true" if writable else "false") for key in KEYS}
    assert view == expected


# --- the steps ------------------------------------------------------------


def test_step0_kiosk_user_has_values_of_its_own(installed):
    """Before any session: the kiosk user sets values in its own database
    through its own dconf-service; they are what it sees, and writable."""
    ct = installed
    ct.run(["gsettings", "set", MAG, "mag-factor", "3.0"], user=KIOSK_USER)
    ct.run(["gsettings", "set", A11Y, "high-contrast", "false"], user=KIOSK_USER)
    expect_view(ct, OWN, writable=True)
    own = kiosk_own_db(ct)
    assert "mag-factor=3.0" in own and "high-contrast=false" in own, own
    start_kiosk_monitor(ct)
    assert ct.run(["systemctl", "is-active", "kiosk-monitor"]).stdout.strip() == "active"


def test_step1_dbus_activation(installed):
    """Installed but not started; the first call starts it through D-Bus
    activation (dbus-daemon hands the start to systemd)."""
    ct = installed
    assert is_active(ct) == "inactive"
    assert prop(ct, "Backend") == "dconf"
    assert is_active(ct) == "active"
    ct.run(["journalctl", "--sync"])
    bus_log = ct.run(["journalctl", "--no-pager", "-o", "cat", "-u", "dbus.service"]).stdout
    assert f"Activating via systemd: service name='{BUS}' unit='{UNIT}'" in bus_log, bus_log[-2000:]
    state = unit(ct, "MainPID", "ActiveState", "SubState", "Type", "BusName")
    assert state["Type"] == "dbus" and state["BusName"] == BUS and state["SubState"] == "running", state
    STATE["pid"] = int(state["MainPID"])
    assert STATE["pid"] > 0
    assert prop(ct, "SessionActive") is False
    assert {"zoom", "invert-colors", "high-contrast"} <= set(prop(ct, "SupportedFeatures"))


def test_step2_non_root_refused_by_polkit_and_bus_policy(installed):
    ct = installed
    # polkit knows the installed actions and their defaults.
    for action, default in (("start-session", "auth_admin_keep"), ("end-session", "auth_admin"),
                            ("manage-restrictions", "auth_admin")):
        out = ct.run(["pkaction", "--verbose", "--action-id", f"org.guidedaccess.GuidedAccess1.{action}"]).stdout
        assert re.search(rf"implicit any:\s+{default}\n", out), out
    # Anyone may read the properties (bus policy and service agree).
    assert prop(ct, "SessionActive", user=KIOSK_USER) is False
    # polkit: start-session is auth_admin_keep. Without the interactive flag
    # polkit's challenge is InteractiveAuthorizationRequired (dbus-api.md,
    # Authorization); with it and no authentication agent, NotAuthorized.
    start = gdbus(ct, "StartSession", "{}", user=KIOSK_USER, check=False)
    assert error_of(start) == "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
    assert "org.guidedaccess.GuidedAccess1.start-session" in start.stderr
    start = gdbus(ct, "StartSession", "{}", user=KIOSK_USER, interactive=True, check=False)
    assert error_of(start) == "org.guidedaccess.GuidedAccess1.Error.NotAuthorized"
    assert "polkit" in start.stderr
    assert prop(ct, "SessionActive") is False
    # The bus policy: a non-root caller may not reach another interface of
    # the service at all (AccessDenied from dbus-daemon); root reaches the
    # service, which answers UnknownMethod.
    foreign = gdbus(ct, "Foo", user=KIOSK_USER, interface="org.example.Nope", check=False)
    assert error_of(foreign) == "org.freedesktop.DBus.Error.AccessDenied"
    assert "Rejected send message" in foreign.stderr
    assert error_of(gdbus(ct, "Foo", interface="org.example.Nope", check=False)) == \
        "org.freedesktop.DBus.Error.UnknownMethod"
    # ... nor own its name.
    own = ct.run(["gdbus", "call", "--system", "-d", "org.freedesktop.DBus", "-o", "/org/freedesktop/DBus",
                  "-m", "org.freedesktop.DBus.RequestName", BUS, "4"], user=KIOSK_USER, check=False)
    assert error_of(own) == "org.freedesktop.DBus.Error.AccessDenied"
    assert "not allowed to own" in own.stderr, own.stderr


def test_step3_root_starts_a_session_with_features(installed):
    ct = installed
    gdbus(ct, "StartSession", "{'features': <['zoom', 'invert-colors']>, 'zoom-factor': <4.0>}")
    gdbus(ct, "ConfigureForSession", "['high-contrast']", "true")
    gdbus(ct, "RegisterRestrictions", f"[('{RESTRICTION}', 'Printing', 'The print button')]")
    gdbus(ct, "SetRestrictionState", RESTRICTION, "deny")
    assert prop(ct, "SessionActive") is True
    assert prop(ct, "EnabledFeatures") == ["high-contrast", "invert-colors", "zoom"]
    assert gdbus(ct, "GetRestrictionState", RESTRICTION).stdout.strip() == "('deny',)"
    # logind's sleep:idle inhibitor, held by the service.
    held = inhibitors(ct)
    assert [(i[0], i[3], i[5]) for i in held] == [("sleep:idle", "block", STATE["pid"])], held
    # The kiosk user may neither end the session nor touch restrictions
    # (end-session and manage-restrictions are auth_admin).
    for method, args in (("EndSession", []), ("SetRestrictionState", [RESTRICTION, "allow"])):
        refused = gdbus(ct, method, *args, user=KIOSK_USER, check=False)
        assert error_of(refused) == "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired", method
        refused = gdbus(ct, method, *args, user=KIOSK_USER, interactive=True, check=False)
        assert error_of(refused) == "org.guidedaccess.GuidedAccess1.Error.NotAuthorized", method
    assert prop(ct, "SessionActive") is True
    assert gdbus(ct, "GetRestrictionState", RESTRICTION).stdout.strip() == "('deny',)"


def test_step4_kiosk_user_sees_the_session_and_cannot_change_it(installed):
    ct = installed
    expect_view(ct, SESSION, writable=False)
    # A program of the kiosk user that was already running is told, live
    # (dconf update's notification on the system bus): no new login needed.
    wait_for(lambda: {k: monitored(ct).get(k) for k in ("mag-factor", "invert-lightness")}
             == {"mag-factor": "4.0", "invert-lightness": "true"}, "the running monitor to see the session")
    refused = ct.run(["gsettings", "set", MAG, "mag-factor", "5.0"], user=KIOSK_USER, check=False)
    assert refused.returncode != 0 and "not writable" in refused.stderr, refused
    refused = ct.run(["dconf", "write", "/org/gnome/desktop/a11y/interface/high-contrast", "false"],
                     user=KIOSK_USER, check=False)
    assert refused.returncode != 0 and "non-writable" in refused.stderr, refused
    # A reset always succeeds in dconf (on the user's own database) and
    # changes nothing the user sees.
    ct.run(["gsettings", "reset", MAG, "invert-lightness"], user=KIOSK_USER)
    expect_view(ct, SESSION, writable=False)
    # The kiosk user's own database is untouched: the session is imposed
    # from the system database.
    own = kiosk_own_db(ct)
    assert "mag-factor=3.0" in own and "high-contrast=false" in own and "invert-lightness" not in own, own
    # What the service wrote, in the place the profile names.
    locks = ct.run(["cat", "/etc/dconf/db/guidedaccess.d/locks/guidedaccess"]).stdout
    assert "/org/gnome/desktop/a11y/magnifier/mag-factor" in locks
    assert ct.run(["guidedaccess-dconf-profile", "--check"]).returncode == 0


def test_step5_kill_9_loses_neither_session_nor_lock(installed):
    ct = installed
    old = STATE["pid"]
    restarts = int(unit(ct, "NRestarts")["NRestarts"])
    ct.run(["kill", "-9", str(old)])
    # The lock is in the database, not in the process.
    view = kiosk_view(ct)
    assert all(writable == "false" for _, writable in view.values()), view
    # Restart=on-failure brings it back.
    def restarted():
        state = unit(ct, "ActiveState", "MainPID")
        pid = int(state["MainPID"])
        return pid if state["ActiveState"] == "active" and pid not in (0, old) else None

    new = wait_for(restarted, "the service to come back after kill -9")
    assert int(unit(ct, "NRestarts")["NRestarts"]) == restarts + 1
    STATE["pid2"] = new
    assert prop(ct, "SessionActive") is True
    assert prop(ct, "EnabledFeatures") == ["high-contrast", "invert-colors", "zoom"]
    assert prop(ct, "SessionOwner") == ""  # the owner's connection is gone
    assert gdbus(ct, "GetRestrictionState", RESTRICTION).stdout.strip() == "('deny',)"
    expect_view(ct, SESSION, writable=False)
    # What carried the session over: the journal in the private state directory.
    assert ct.run(["stat", "-c", "%a %U", "/var/lib/guidedaccess"]).stdout.split() == ["700", "root"]
    assert ct.run(["test", "-s", "/var/lib/guidedaccess/journal.json"]).returncode == 0
    held = wait_for(lambda: inhibitors(ct), "the sleep inhibitor to be taken again", timeout=5)
    assert [(i[0], i[5]) for i in held] == [("sleep:idle", new)], held


def test_step6_end_session_gives_the_kiosk_user_its_own_values_back(installed):
    ct = installed
    # Root with gdbus again: the same identity as the gone owner, so a take-over.
    gdbus(ct, "EndSession")
    assert prop(ct, "SessionActive") is False
    assert prop(ct, "EnabledFeatures") == []
    assert gdbus(ct, "GetRestrictionState", RESTRICTION).stdout.strip() == "('allow',)"
    assert inhibitors(ct) == []
    expect_view(ct, OWN, writable=True)
    wait_for(lambda: {k: monitored(ct).get(k) for k in ("mag-factor", "invert-lightness")}
             == {"mag-factor": "3.0", "invert-lightness": "false"}, "the running monitor to see the end")
    # Writable for real: the kiosk user changes a key and back.
    ct.run(["gsettings", "set", A11Y, "high-contrast", "true"], user=KIOSK_USER)
    assert kiosk_view(ct)[(A11Y, "high-contrast")] == ("true", "true")
    ct.run(["gsettings", "set", A11Y, "high-contrast", "false"], user=KIOSK_USER)
    assert ct.run(["cat", "/etc/dconf/db/guidedaccess.d/locks/guidedaccess"], check=False).returncode != 0


def test_step7_lock_outside_session_default(installed):
    """With LockOutsideSession at its default (true) the mapped keys are
    locked at their schema defaults from start-up on, before any session:
    the kiosk user's own 3.0 is hidden, not lost."""
    ct = installed
    config = CONFIG.replace("LockOutsideSession=false\n", "")
    assert config != CONFIG
    ct.sh("cat > /etc/guidedaccess/guidedaccess.conf", input=config)
    ct.run(["systemctl", "restart", UNIT])
    STATE["pid3"] = int(unit(ct, "MainPID")["MainPID"])
    assert prop(ct, "SessionActive") is False
    expect_view(ct, DEFAULTS, writable=False)
    refused = ct.run(["gsettings", "set", MAG, "mag-factor", "3.5"], user=KIOSK_USER, check=False)
    assert refused.returncode != 0
    assert "mag-factor=3.0" in kiosk_own_db(ct)


def test_step8_systemd_analyze_security(installed):
    ct = installed
    out = ct.run(["systemd-analyze", "security", "--no-pager", UNIT]).stdout
    match = re.search(r"Overall exposure level for guidedaccessd\.service: (\d+\.\d+) (\w+)", out)
    assert match, out[-2000:]
    exposure = float(match.group(1))
    FACTS["systemd-analyze security guidedaccessd"] = f"{exposure} {match.group(2)}"
    assert exposure <= 1.5, out


def journal_json(ct, *arguments):
    """The records journalctl ARGUMENTS selects, as dicts (-o json)."""
    out = ct.run(["journalctl", "--no-pager", "-o", "json", *arguments]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def journal(ct, event):
    ct.run(["journalctl", "--sync"])
    records = journal_json(ct, f"_SYSTEMD_UNIT={UNIT}", f"MESSAGE_ID={MESSAGE_IDS[event]}")
    for record in records:
        assert record["GUIDEDACCESS_EVENT"] == event
        assert record["SYSLOG_IDENTIFIER"] == "guidedaccessd"
        assert record["_TRANSPORT"] == "journal"
        assert record["PRIORITY"] == ("4" if event == "callDenied" else "5")
    return records


def test_step9_journal_audit_records(installed):
    ct = installed
    root = {"GUIDEDACCESS_CALLER_UID": "0", "GUIDEDACCESS_CALLER_EXE": "/usr/bin/gdbus"}

    def fields(record, *names):
        return {n: record.get(n) for n in names}

    [started] = journal(ct, "sessionStarted")
    assert int(started["_PID"]) == STATE["pid"]
    # The unit's sandbox was in force: CAP_SYS_PTRACE (bit 19) is the only capability.
    assert started["_CAP_EFFECTIVE"] == "80000"
    assert fields(started, *root, "GUIDEDACCESS_FEATURES", "GUIDEDACCESS_DEADLINE_USEC") == dict(
        root, GUIDEDACCESS_FEATURES="invert-colors zoom", GUIDEDACCESS_DEADLINE_USEC="0")
    assert started["GUIDEDACCESS_OWNER"].startswith(":1.")

    [changed] = journal(ct, "featuresChanged")
    assert fields(changed, *root, "GUIDEDACCESS_CHANGED", "GUIDEDACCESS_ENABLED", "GUIDEDACCESS_FEATURES") == dict(
        root, GUIDEDACCESS_CHANGED="high-contrast", GUIDEDACCESS_ENABLED="true",
        GUIDEDACCESS_FEATURES="high-contrast invert-colors zoom")

    [restriction] = journal(ct, "restrictionChanged")
    assert fields(restriction, *root, "GUIDEDACCESS_RESTRICTION", "GUIDEDACCESS_STATE") == dict(
        root, GUIDEDACCESS_RESTRICTION=RESTRICTION, GUIDEDACCESS_STATE="deny")

    # Every gdbus call is a new connection: ConfigureForSession took the
    # session over from the gone StartSession caller, and so did EndSession
    # after the restart (the same identity: root running gdbus).
    resumed = journal(ct, "sessionResumed")
    assert [int(r["_PID"]) for r in resumed] == [STATE["pid"], STATE["pid2"]]
    assert all(fields(r, *root) == root for r in resumed)

    # The service's own log lines (stderr, journald's stream) carry their
    # priority and no timestamp of their own.
    out = ct.run(["journalctl", "--no-pager", "-o", "json", f"_SYSTEMD_UNIT={UNIT}", "_TRANSPORT=stdout"]).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    [begun] = [r for r in lines if "] session started by " in r["MESSAGE"]]
    assert begun["PRIORITY"] == "5" and begun["MESSAGE"].startswith("guidedaccessd: [GuidedAccessService] "), begun
    assert any(r["PRIORITY"] == "6" and "] ready: " in r["MESSAGE"] for r in lines), lines

    [ended] = journal(ct, "sessionEnded")
    assert int(ended["_PID"]) == STATE["pid2"]
    assert fields(ended, *root, "GUIDEDACCESS_REASON", "GUIDEDACCESS_RESTORED_KEYS") == dict(
        root, GUIDEDACCESS_REASON="ended", GUIDEDACCESS_RESTORED_KEYS="5")

    denied = journal(ct, "callDenied")
    seen = sorted((r["GUIDEDACCESS_METHOD"], r["GUIDEDACCESS_ERROR"]) for r in denied)
    interactive = "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
    not_authorized = "org.guidedaccess.GuidedAccess1.Error.NotAuthorized"
    assert seen == sorted([(m, e) for m in ("StartSession", "EndSession", "SetRestrictionState")
                           for e in (interactive, not_authorized)])
    for record in denied:
        assert fields(record, "GUIDEDACCESS_CALLER_UID", "GUIDEDACCESS_CALLER_EXE") == {
            "GUIDEDACCESS_CALLER_UID": "1000", "GUIDEDACCESS_CALLER_EXE": "/usr/bin/gdbus"}


def test_step10_a_polkit_rule_admits_the_kiosk_user(installed):
    """The other side of step 2: where a polkit rule grants start-session,
    the kiosk user may start a session (and, as its owner, end it)."""
    ct = installed
    ct.sh("cat > /etc/polkit-1/rules.d/50-guidedaccess-kiosk.rules", input="""\
polkit.addRule(function(action, subject) {
    if (action.id == "org.guidedaccess.GuidedAccess1.start-session" && subject.user == "tester")
        return polkit.Result.YES;
});
""")
    # polkitd notices new rules by itself; wait until it has.
    def admitted():
        result = gdbus(ct, "StartSession", "{'features': <['zoom']>}", user=KIOSK_USER, check=False)
        if result.returncode == 0:
            return True
        # A start that succeeded but whose reply gdbus gave up waiting for:
        # the retry finds the session there, and retrying cannot help.
        return "SessionBusy" in result.stderr and prop(ct, "SessionActive") is True

    wait_for(admitted, "polkit to admit the kiosk user")
    assert prop(ct, "EnabledFeatures") == ["zoom"]
    assert kiosk_view(ct)[(MAG, "mag-factor")] == ("2.0", "false")
    # Other actions are still refused.
    refused = gdbus(ct, "SetRestrictionState", RESTRICTION, "deny", user=KIOSK_USER, interactive=True, check=False)
    assert error_of(refused) == "org.guidedaccess.GuidedAccess1.Error.NotAuthorized"
    gdbus(ct, "EndSession", user=KIOSK_USER)
    assert prop(ct, "SessionActive") is False
    # LockOutsideSession (step 7's configuration): the baseline is locked again.
    expect_view(ct, DEFAULTS, writable=False)
    [started] = [r for r in journal(ct, "sessionStarted") if r["GUIDEDACCESS_CALLER_UID"] == "1000"]
    assert started["GUIDEDACCESS_FEATURES"] == "zoom"
