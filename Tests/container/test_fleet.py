"""The audit trail collected centrally with journald's own transport, as
docs/fleet.md describes it: on a kiosk of its own (the `fleet_container`
fixture, installed as `installed` is), `systemd-journal-upload` sends the
journal to a collector, `systemd-journal-remote` listening on 127.0.0.1:19532
(plain HTTP: loopback inside a --private-network container), started by its
socket, writing to /var/log/journal/remote/.

One caller, root running python3-dbus under a unit of its own, makes
StartSession, ConfigureForSession and EndSession on one connection: the
collector must hold the three records (MESSAGE_IDs …51, …54, …53) with that
caller's uid, pid, executable, unit and unique name, as the kiosk's own
journal has them.

1. Upload is not running: a first session's records are in the kiosk's
   journal and not on the collector (journal-remote was never even started);
   once journal-upload starts they arrive, and its state file's cursor is
   past them.
2. Upload running (it follows the journal): a second session's records are
   on the collector within UPLOAD_BOUND seconds of EndSession's reply, and
   the cursor moved past them.
"""

import json
import time

from container_setup import FACTS
from test_container import MESSAGE_IDS, UNIT, journal_json, wait_for

REMOTE = "/var/log/journal/remote"
STATE_FILE = "/var/lib/systemd/journal-upload/state"
# What the kiosk's records may take to reach the collector once upload
# runs (measured: well under a second; the bound leaves room for a loaded
# 2-core machine).
UPLOAD_BOUND = 10.0
EVENTS = ("sessionStarted", "featuresChanged", "sessionEnded")

# The collector: journal-remote's own unit listens for HTTPS; on loopback,
# plain HTTP on the socket unit's port 19532 (fd 3).
REMOTE_DROP_IN = """\
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-journal-remote --listen-http=-3 --output=/var/log/journal/remote/
"""
UPLOAD_CONF = """\
[Upload]
URL=http://127.0.0.1:19532
"""

# One connection for the three calls: one pid, one unique name.
CALLER = """\
#!/usr/bin/python3
import json, os, time
import dbus

bus = dbus.SystemBus()
ga = dbus.Interface(bus.get_object("org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1"),
                    "org.guidedaccess.GuidedAccess1")
replies = {}
ga.StartSession(dbus.Dictionary({"features": dbus.Array(["zoom"], signature="s")}, signature="sv"), timeout=30)
replies["start"] = time.time()
ga.ConfigureForSession(dbus.Array(["high-contrast"], signature="s"), True, timeout=30)
replies["change"] = time.time()
ga.EndSession(timeout=30)
replies["end"] = time.time()
print(json.dumps({"uid": os.getuid(), "pid": os.getpid(), "exe": os.readlink("/proc/self/exe"),
                  "unique_name": bus.get_unique_name(), "replies": replies}))
"""

STATE = {}


def session_matches(caller):
    """journalctl matches for one caller's session records: the same field
    given twice is OR, different fields AND."""
    return [f"GUIDEDACCESS_CALLER_PID={caller['pid']}", *(f"MESSAGE_ID={MESSAGE_IDS[e]}" for e in EVENTS)]


def collected(ct, *matches):
    """Records on the collector (journalctl -D on its directory); none
    while journal-remote has not made the directory or a file in it."""
    if ct.run(["test", "-d", REMOTE], check=False).returncode != 0:
        return []
    result = ct.run(["journalctl", "--no-pager", "-o", "json", "-D", REMOTE, *matches], check=False)
    if result.returncode != 0:
        assert "No journal files were found" in result.stderr, result.stderr
        return []
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def by_event(records):
    events = {r["GUIDEDACCESS_EVENT"]: r for r in records}
    assert len(events) == len(records), [r["GUIDEDACCESS_EVENT"] for r in records]
    return events


def run_caller(ct, unit_name):
    out = ct.run(["systemd-run", "--quiet", "--wait", "--pipe", f"--unit={unit_name}", "--service-type=exec",
                  "/usr/local/bin/fleet-caller"], timeout=90).stdout
    caller = json.loads(out.strip().splitlines()[-1])
    caller["unit"] = f"{unit_name}.service"
    return caller


def upload_cursor(ct):
    text = ct.run(["cat", STATE_FILE]).stdout
    [cursor] = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("LAST_CURSOR=")]
    return cursor


def uploaded_past(ct, caller, cursor):
    """Whether none of the caller's records in the kiosk's journal comes
    after journal-upload's saved cursor."""
    return journal_json(ct, f"--after-cursor={cursor}", *session_matches(caller)) == []


def check_records(ct, caller, remote, local):
    """The collector's records are the kiosk's, field for field, and name
    the caller as it was."""
    assert set(remote) == set(EVENTS) == set(local), (sorted(remote), sorted(local))
    machine_id = ct.run(["cat", "/etc/machine-id"]).stdout.strip()
    hostname = ct.run(["hostname"]).stdout.strip()
    identity = {"GUIDEDACCESS_CALLER_UID": str(caller["uid"]), "GUIDEDACCESS_CALLER_PID": str(caller["pid"]),
                "GUIDEDACCESS_CALLER_EXE": caller["exe"], "GUIDEDACCESS_CALLER_UNIT": caller["unit"]}
    for event in EVENTS:
        record = remote[event]
        assert record["MESSAGE_ID"] == MESSAGE_IDS[event]
        assert {k: record.get(k) for k in identity} == identity, (event, record)
        assert record["_HOSTNAME"] == hostname and record["_MACHINE_ID"] == machine_id, record
        assert record["_SYSTEMD_UNIT"] == UNIT and record["SYSLOG_IDENTIFIER"] == "guidedaccessd"
        # Everything the kiosk's journal has, the collector has (its own
        # cursors and sequence numbers aside).
        mine = {k: v for k, v in local[event].items() if not k.startswith("__")}
        theirs = {k: v for k, v in record.items() if not k.startswith("__")}
        assert theirs == mine, (event, set(mine.items()) ^ set(theirs.items()))
        assert record["__REALTIME_TIMESTAMP"] == local[event]["__REALTIME_TIMESTAMP"]
    assert remote["sessionStarted"]["GUIDEDACCESS_OWNER"] == caller["unique_name"]
    assert remote["sessionStarted"]["GUIDEDACCESS_FEATURES"] == "zoom"
    assert {k: remote["featuresChanged"][k] for k in (
        "GUIDEDACCESS_CHANGED", "GUIDEDACCESS_ENABLED", "GUIDEDACCESS_FEATURES")} == {
        "GUIDEDACCESS_CHANGED": "high-contrast", "GUIDEDACCESS_ENABLED": "true",
        "GUIDEDACCESS_FEATURES": "high-contrast zoom"}
    assert remote["sessionEnded"]["GUIDEDACCESS_REASON"] == "ended"
    stamps = [int(remote[e]["__REALTIME_TIMESTAMP"]) for e in EVENTS]
    assert stamps == sorted(stamps), stamps


def local_records(ct, caller):
    ct.run(["journalctl", "--sync"])
    return by_event(journal_json(ct, f"_SYSTEMD_UNIT={UNIT}", *session_matches(caller)))


def wait_collected(ct, caller, timeout):
    """Polls the collector until the caller's three records are there.
    Returns (records by event, time.time() when they were seen)."""
    matches = (f"_SYSTEMD_UNIT={UNIT}", *session_matches(caller))
    records = wait_for(lambda: r if len(r := collected(ct, *matches)) == len(EVENTS) else None,
                       f"the caller's {len(EVENTS)} records on the collector", timeout, interval=0.05)
    return by_event(records), time.time()


def test_step1_records_reach_the_collector_only_through_journal_upload(fleet_container):
    ct = fleet_container
    ct.sh("cat > /usr/local/bin/fleet-caller && chmod 755 /usr/local/bin/fleet-caller", input=CALLER)
    ct.sh("mkdir -p /etc/systemd/system/systemd-journal-remote.service.d && "
          "cat > /etc/systemd/system/systemd-journal-remote.service.d/http.conf", input=REMOTE_DROP_IN)
    ct.sh("mkdir -p /etc/systemd/journal-upload.conf.d && "
          "cat > /etc/systemd/journal-upload.conf.d/collector.conf", input=UPLOAD_CONF)
    ct.run(["systemctl", "daemon-reload"])
    ct.run(["systemctl", "start", "systemd-journal-remote.socket"])
    # Nothing in the package is enabled: no upload, no collector yet.
    for name in ("systemd-journal-upload.service", "systemd-journal-remote.service"):
        assert ct.run(["systemctl", "is-active", name], check=False).stdout.strip() == "inactive", name
    assert ct.run(["test", "-e", STATE_FILE], check=False).returncode != 0

    caller = run_caller(ct, "fleet-caller-1")
    local = local_records(ct, caller)
    assert set(local) == set(EVENTS), sorted(local)
    time.sleep(1.0)
    assert collected(ct, *session_matches(caller)) == []
    assert ct.run(["systemctl", "is-active", "systemd-journal-remote.service"],
                  check=False).stdout.strip() == "inactive"

    started = time.monotonic()
    ct.run(["systemctl", "start", "systemd-journal-upload.service"])
    remote, _ = wait_collected(ct, caller, timeout=30.0)
    FACTS["fleet: backlog on the collector after journal-upload starts"] = f"{time.monotonic() - started:.2f} s"
    check_records(ct, caller, remote, local)
    # Its socket started the collector for the upload's connection.
    assert ct.run(["systemctl", "is-active", "systemd-journal-remote.service"]).stdout.strip() == "active"
    files = ct.run(["ls", REMOTE]).stdout.split()
    assert files and all(f.startswith("remote-") and f.endswith(".journal") for f in files), files
    FACTS["fleet: collector files"] = " ".join(files)
    # journal-upload saves its cursor after each finished upload.
    cursor = wait_for_cursor(ct, lambda c: uploaded_past(ct, caller, c))
    STATE["cursor"] = cursor


def wait_for_cursor(ct, good, timeout=UPLOAD_BOUND):
    def passed():
        if ct.run(["test", "-s", STATE_FILE], check=False).returncode != 0:
            return None
        cursor = upload_cursor(ct)
        return cursor if good(cursor) else None
    return wait_for(passed, "journal-upload's cursor to pass the records", timeout)


def test_step2_while_upload_follows_records_arrive_within_the_bound(fleet_container):
    ct = fleet_container
    assert "cursor" in STATE, "step 1 did not run"
    assert ct.run(["systemctl", "is-active", "systemd-journal-upload.service"]).stdout.strip() == "active"
    caller = run_caller(ct, "fleet-caller-2")
    remote, seen = wait_collected(ct, caller, timeout=UPLOAD_BOUND + 20)
    after_reply = seen - caller["replies"]["end"]
    # From each record's own time on the kiosk (journald's receipt) to the
    # poll that saw it on the collector (polled every ~0.1 s).
    worst = max(seen - int(r["__REALTIME_TIMESTAMP"]) / 1e6 for r in remote.values())
    FACTS["fleet: upload latency (EndSession reply → on the collector)"] = (
        f"{after_reply:.2f} s (record written → seen: at most {worst:.2f} s; bound {UPLOAD_BOUND:.0f} s)")
    assert after_reply <= UPLOAD_BOUND and worst <= UPLOAD_BOUND, (after_reply, worst)
    check_records(ct, caller, remote, local_records(ct, caller))
    cursor = wait_for_cursor(ct, lambda c: c != STATE["cursor"] and uploaded_past(ct, caller, c))
    assert cursor != STATE["cursor"]
    # The per-kiosk and per-caller queries of docs/fleet.md.
    machine_id = ct.run(["cat", "/etc/machine-id"]).stdout.strip()
    per_kiosk = collected(ct, f"_MACHINE_ID={machine_id}", f"MESSAGE_ID={MESSAGE_IDS['sessionStarted']}")
    assert len(per_kiosk) == 2, per_kiosk
    per_caller = collected(ct, "GUIDEDACCESS_CALLER_UID=0", f"GUIDEDACCESS_CALLER_UNIT={caller['unit']}")
    assert sorted(r["GUIDEDACCESS_EVENT"] for r in per_caller) == sorted(EVENTS)
    assert int(ct.run(["systemctl", "show", "-p", "NRestarts", "--value",
                       "systemd-journal-upload.service"]).stdout) == 0
