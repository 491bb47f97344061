"""Audit records in journald's native protocol.

The test binds the datagram socket journald would own and points the daemon
at it (GUIDEDACCESS_JOURNAL_SOCKET), then parses what arrives the way
journald does: KEY=value lines, or KEY, newline, 64-bit little-endian length
and value for values with newlines.
"""

import socket
import struct

from conftest import start_guidedaccessd

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
IDS = {
    "sessionStarted": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a51",
    "sessionResumed": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a52",
    "sessionEnded": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a53",
    "featuresChanged": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a54",
    "restrictionChanged": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a55",
    "callDenied": "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a56",
}


def parse(datagram):
    fields, i = {}, 0
    while i < len(datagram):
        end = datagram.index(b"\n", i)
        line = datagram[i:end]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            i = end + 1
        else:
            key = line
            (length,) = struct.unpack("<Q", datagram[end + 1:end + 9])
            value = datagram[end + 9:end + 9 + length]
            i = end + 9 + length + 1
        fields[key.decode()] = value.decode()
    return fields


class Journal:
    def __init__(self, path):
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(str(path))
        self.socket.settimeout(3)

    def next(self):
        return parse(self.socket.recv(65536))

    def until(self, event):
        while True:
            record = self.next()
            if record["GUIDEDACCESS_EVENT"] == event:
                return record


def daemon_with_journal(ga_env):
    path = ga_env.root / "journal.socket"
    journal = Journal(path)
    start_guidedaccessd(ga_env, extra_env={"GUIDEDACCESS_JOURNAL_SOCKET": str(path)})
    return journal


def test_session_start_features_and_end_each_leave_a_record_with_the_caller(ga_env):
    journal = daemon_with_journal(ga_env)
    assert ga_env.busctl_call("StartSession", "a{sv}", "1", "features", "as", "1", "zoom")[0] == 0
    started = journal.until("sessionStarted")
    assert started["MESSAGE_ID"] == IDS["sessionStarted"]
    assert started["GUIDEDACCESS_CALLER_UID"] == "0"
    assert started["GUIDEDACCESS_CALLER_EXE"] == "/usr/bin/busctl"
    assert started["GUIDEDACCESS_FEATURES"] == "zoom"
    assert int(started["GUIDEDACCESS_CALLER_PID"]) > 0
    assert started["SYSLOG_IDENTIFIER"] == "guidedaccessd"

    assert ga_env.busctl_call("ConfigureForSession", "asb", "1", "grayscale", "true")[0] == 0
    resumed = journal.until("sessionResumed")  # a new busctl process took the session over
    assert resumed["MESSAGE_ID"] == IDS["sessionResumed"]
    changed = journal.until("featuresChanged")
    assert changed["MESSAGE_ID"] == IDS["featuresChanged"]
    assert (changed["GUIDEDACCESS_CHANGED"], changed["GUIDEDACCESS_ENABLED"]) == ("grayscale", "true")
    assert changed["GUIDEDACCESS_FEATURES"] == "grayscale zoom"

    assert ga_env.busctl_call("EndSession")[0] == 0
    ended = journal.until("sessionEnded")
    assert (ended["MESSAGE_ID"], ended["GUIDEDACCESS_REASON"]) == (IDS["sessionEnded"], "ended")


def test_a_restriction_change_leaves_a_record(ga_env):
    journal = daemon_with_journal(ga_env)
    assert ga_env.busctl_call("RegisterRestrictions", "a(sss)", "1", "org.example.print", "Printing", "")[0] == 0
    assert ga_env.busctl_call("StartSession", "a{sv}", "0")[0] == 0
    assert ga_env.busctl_call("SetRestrictionState", "ss", "org.example.print", "deny")[0] == 0
    record = journal.until("restrictionChanged")
    assert record["MESSAGE_ID"] == IDS["restrictionChanged"]
    assert (record["GUIDEDACCESS_RESTRICTION"], record["GUIDEDACCESS_STATE"]) == ("org.example.print", "deny")


def test_a_denied_call_leaves_a_record_naming_the_caller(ga_env):
    journal = daemon_with_journal(ga_env)
    code, _, _ = ga_env.busctl_call("StartSession", "a{sv}", "0", prefix=NOBODY)
    assert code != 0
    denied = journal.until("callDenied")
    assert denied["MESSAGE_ID"] == IDS["callDenied"]
    assert denied["GUIDEDACCESS_CALLER_UID"] == "65534"
    assert denied["GUIDEDACCESS_METHOD"] == "StartSession"
    assert denied["GUIDEDACCESS_ERROR"] == "org.guidedaccess.GuidedAccess1.Error.NotAuthorized"
    assert denied["PRIORITY"] == "4"


def test_without_journald_the_record_goes_to_the_log(ga_env):
    daemon = start_guidedaccessd(
        ga_env, extra_env={"GUIDEDACCESS_JOURNAL_SOCKET": str(ga_env.root / "no-journal.socket")})
    assert ga_env.busctl_call("StartSession", "a{sv}", "0")[0] == 0
    assert "audit: guided access session started" in daemon.log()
    assert IDS["sessionStarted"] in daemon.log()


def test_with_stderr_as_the_journal_stream_lines_carry_their_priority(ga_env):
    # systemd sets JOURNAL_STREAM to stderr's DEVICE:INODE when stderr is
    # journald's stream; the daemon's lines then start with <priority> (which
    # journald takes as PRIORITY) and carry no timestamp of their own.
    import os
    import re

    daemon = ga_env.daemon()
    status = os.stat(daemon.log_path)
    daemon.process_env["JOURNAL_STREAM"] = f"{status.st_dev}:{status.st_ino}"
    daemon.process_env["GUIDEDACCESS_JOURNAL_SOCKET"] = str(ga_env.root / "no-journal.socket")
    daemon.start()
    assert ga_env.busctl_call("StartSession", "a{sv}", "0")[0] == 0
    assert ga_env.busctl_call("EndSession", prefix=NOBODY)[0] != 0  # a refusal: a warning
    lines = [line for line in daemon.log().splitlines() if line and not line.startswith("=====")]
    assert lines and all(re.match(r"<[2-7]>guidedaccessd: \[[A-Za-z]+\] ", line) for line in lines), lines
    assert any(line.startswith("<6>guidedaccessd: [guidedaccessd] ready: ") for line in lines), lines
    assert any(line.startswith("<5>guidedaccessd: [GuidedAccessService] session started by ") for line in lines), lines
    assert any(line.startswith("<4>") and "EndSession" in line for line in lines), lines


def test_with_another_journal_stream_lines_stay_plain(ga_env):
    # JOURNAL_STREAM naming some other file (inherited, stderr redirected):
    # the usual lines, with their timestamp and level.
    daemon = ga_env.daemon()
    daemon.process_env["JOURNAL_STREAM"] = "1:2"
    daemon.start()
    assert any(" info guidedaccessd: [guidedaccessd] ready: " in line for line in daemon.log().splitlines())


# A directory name with the control characters a caller could put in its
# executable's path: a line break and journald's priority prefix, C1's NEL,
# Unicode's line separator and an escape.
FORGED = "evil\r\n<2>forged\u0085<3>c1\u2028<3>ls\x1b[31m"
FORGED_ESCAPED = "evil\\r\\n<2>forged\\u0085<3>c1\\u2028<3>ls\\x1b[31m"


def forged_busctl(ga_env):
    """A copy of busctl whose path carries FORGED (busctl finds its library
    by an absolute RUNPATH)."""
    import shutil

    directory = ga_env.root / FORGED
    directory.mkdir()
    path = directory / "busctl"
    shutil.copy("/usr/bin/busctl", path)
    return path


def start_session_with(ga_env, busctl):
    from gadaemon import IFACE, NAME, PATH

    rc, out, err = ga_env.run([str(busctl), f"--address={ga_env.address}", "--", "call", NAME, PATH, IFACE,
                               "StartSession", "a{sv}", "0"])
    assert rc == 0, err


def test_a_callers_control_characters_stay_inside_its_journal_stream_line(ga_env):
    import os
    import re

    daemon = ga_env.daemon()
    status = os.stat(daemon.log_path)
    daemon.process_env["JOURNAL_STREAM"] = f"{status.st_dev}:{status.st_ino}"
    daemon.process_env["GUIDEDACCESS_JOURNAL_SOCKET"] = str(ga_env.root / "no-journal.socket")
    daemon.start()
    start_session_with(ga_env, forged_busctl(ga_env))
    # As journald splits the stream: at \n only; \r and the rest stay in the entry.
    lines = [line for line in daemon.log_path.read_bytes().decode().split("\n") if line and
             not line.startswith("=====")]
    assert all(re.match(r"<[2-7]>guidedaccessd: \[[A-Za-z]+\] ", line) for line in lines), lines
    assert not any(re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029]", line) for line in lines), lines
    started = [line for line in lines if "[GuidedAccessService] session started by" in line]
    assert len(started) == 1 and FORGED_ESCAPED in started[0] and started[0].startswith("<5>"), lines


def test_a_callers_control_characters_stay_inside_its_stderr_line(ga_env):
    import re

    daemon = start_guidedaccessd(ga_env)
    start_session_with(ga_env, forged_busctl(ga_env))
    lines = [line for line in daemon.log_path.read_bytes().decode().split("\n") if line and
             not line.startswith("=====")]
    assert all(re.match(r"\d{4}-\d\d-\d\dT\S+ [a-z]+ guidedaccessd: ", line) for line in lines), lines
    assert not any(re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029]", line) for line in lines), lines
    assert any("session started by" in line and FORGED_ESCAPED in line for line in lines), lines


def test_a_callers_control_characters_are_escaped_in_its_audit_record(ga_env):
    journal = daemon_with_journal(ga_env)
    busctl = forged_busctl(ga_env)
    start_session_with(ga_env, busctl)
    started = journal.until("sessionStarted")
    assert started["GUIDEDACCESS_CALLER_EXE"] == str(busctl).replace(FORGED, FORGED_ESCAPED)
    assert FORGED_ESCAPED in started["MESSAGE"], started["MESSAGE"]
    assert started["PRIORITY"] == "5"
