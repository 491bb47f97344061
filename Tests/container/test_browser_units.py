"""The browser layer under the installed, sandboxed units: Debian 12's
Chromium, headless, in a container from the browser root filesystem
(conftest `browser_rootfs`), run by the kiosk user `tester` as a transient
unit of its own manager (`systemd-run --user`), its stdout and stderr in a
file.

The page is a file:// page (PAGE, in tester's home; no web server) whose
script polls `getComputedStyle(document.documentElement)`'s `filter` and
`zoom` every 50 ms and `console.log`s them, with `Date.now()`, when they
change; Chromium run with `--enable-logging=stderr --v=0` writes each as an
`INFO:CONSOLE` line to its stderr. That is how the test sees the page
change: it has no DevTools connection of its own.

1. User mode (`browser_container`): `guidedaccessctl browser -- chromium …`
   D-Bus-activates the installed user unit guidedaccessd-user.service and
   attaches the browser's `--remote-debugging-pipe` (fds 3 and 4 pipes, no
   TCP port: `ss -ltnp` lists no socket of Chromium); `Desktop` ends in
   `+browser`, the unit's journal and audit record say so; StartSession
   (invert-colors) by tester with gdbus → the page logs `invert(1)`,
   EndSession → `none`; the browser stopped → `Desktop` without `+browser`.
2. User mode, `[Browser] DevToolsEndpoint=http://127.0.0.1:9333` (Chromium
   with `--remote-debugging-port=9333`): the unit restarted connects
   (`RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6`), the page shows the
   invert; with a drop-in putting back the old `RestrictAddressFamilies=AF_UNIX`
   it cannot (`socket: Address family not supported by protocol`) and
   `Desktop` never gets `+browser`.
3. System mode with the session agent (`browser_kiosk`): `guidedaccessctl
   --system browser -- chromium …` as tester; the system service (still
   `PrivateNetwork=yes`, `AF_UNIX` only) hands the socket to the agent, whose
   browser driver drives the page: StartSession (invert-colors) by root →
   invert, EndSession → none.
4. System mode, `[Browser] DevToolsEndpoint=` through the agent.
The figures are printed (-s) and in the run's summary.
"""

import json
import re
import time

import user_session as us
from container_setup import FACTS, KIOSK_UID, KIOSK_USER

SERVICE = "guidedaccessd-user.service"
AGENT = us.AGENT_UNIT
BUS_NAME = "org.guidedaccess.GuidedAccess1"
OBJECT = "/org/guidedaccess/GuidedAccess1"
APP_SLICE = f"/user.slice/user-{KIOSK_UID}.slice/user@{KIOSK_UID}.service/app.slice/"
HOME = f"/home/{KIOSK_USER}"
PAGE_PATH = f"{HOME}/page.html"
URL = f"file://{PAGE_PATH}"
PORT = 9333
ENDPOINT = f"http://127.0.0.1:{PORT}"
USER_CONFIG = f"{HOME}/.config/guidedaccess/guidedaccess.conf"
DROP_INS = f"{HOME}/.config/systemd/user/{SERVICE}.d"
BROWSER_ATTACHED = "3c4bd2b4c5a24b8f9c6e0a1d2f3e4a5c"
INVERT = "{'features': <['invert-colors']>}"

# The page: its root's filter and zoom, logged with the time whenever they change.
PAGE = """\
<!doctype html>
<html><head><meta charset="utf-8"><title>kiosk page</title></head>
<body><p>A kiosk page.</p>
<script>
let last = null;
function look() {
  const style = getComputedStyle(document.documentElement);
  const now = "filter=" + style.filter + " zoom=" + style.zoom;
  if (now !== last) { last = now; console.log("guidedaccess-test " + Date.now() + " " + now); }
}
look();
setInterval(look, 50);
</script></body></html>
"""
# [1234:1234:1127/195646.043753:INFO:CONSOLE:7] "guidedaccess-test 1764273406043 filter=none zoom=1", source: …
_LOGGED = re.compile(r':INFO:CONSOLE[^\]]*\] "guidedaccess-test (\d+) filter=(.*?) zoom=(\S+)", source:')


def fact(name, value):
    FACTS[f"browser: {name}"] = value
    print(f"\nbrowser: {name}: {value}")


# --- the browser ------------------------------------------------------------------


def chromium(profile, *extra):
    """Chromium's command line: headless, its console on stderr."""
    return ["chromium", "--headless=new", "--no-sandbox", "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={HOME}/{profile}", *extra, URL]


def start_browser(ct, unit, argv):
    """ARGV as tester's transient unit UNIT, stdout and stderr in
    ~/UNIT.log; returns once the page has logged its first look (Chromium
    runs and has loaded it). Returns the log's path."""
    log = f"{HOME}/{unit}.log"
    ct.sh(f"test -e {PAGE_PATH} || cat > {PAGE_PATH}", user=KIOSK_USER, input=PAGE)
    started = time.monotonic()
    ct.run(["systemd-run", "--user", "-q", f"--unit={unit}", f"--description=kiosk browser for tests ({unit})",
            "-p", f"StandardOutput=truncate:{log}", "-p", f"StandardError=truncate:{log}", "--", *argv],
           user=KIOSK_USER)
    wait_look(ct, log, "none", 0, f"Chromium ({unit}) to load {URL}", timeout=30)
    fact(f"{unit}: start → the page's first console line", f"{time.monotonic() - started:.2f} s")
    return log


def stop_browser(ct, unit):
    """Stops UNIT (SIGTERM to the launcher, which passes it on, and to the
    unit's cgroup) and waits until no Chromium process of tester is left:
    Chromium moves itself into a scope of its own (app-org.chromium.Chromium-PID.scope),
    out of the unit's cgroup."""
    us.systemctl(ct, "stop", unit, check=False)
    us.wait_for(lambda: ct.run(["pgrep", "-u", KIOSK_USER, "-x", "chromium"], check=False).returncode == 1,
                f"no Chromium process left after stopping {unit}", timeout=10)


def browser_log(ct, log):
    return ct.run(["cat", log], check=False).stdout


def looks(ct, log):
    """[(seconds since the epoch, filter, zoom)]: what the page logged, in order."""
    return [(int(ms) / 1000, filt, zoom) for ms, filt, zoom in _LOGGED.findall(browser_log(ct, log))]


def wait_look(ct, log, filt, since, what, timeout=5.0):
    """The time of the first look after the first SINCE whose filter is
    FILT, once the page has logged one; fails with Chromium's stderr."""
    def found():
        return next((t for t, f, _ in looks(ct, log)[since:] if f == filt), None)

    try:
        return us.wait_for(found, what, timeout=timeout, interval=0.05)
    except TimeoutError as error:
        text = browser_log(ct, log)
        noise = ("dbus/", "bus.cc")  # Chromium's complaints about D-Bus services the container lacks
        tail = "\n".join(line for line in text.splitlines() if not any(n in line for n in noise))[-4000:]
        raise AssertionError(f"{error}; the page logged {looks(ct, log)}; the browser's stdout and stderr "
                             f"({log}, D-Bus complaints left out):\n{tail}")


def tcp_listeners(ct):
    """`ss -ltnpH` inside the container: every listening TCP socket, with its process."""
    return ct.run(["ss", "-ltnpH"]).stdout.strip().splitlines()


def pipe_of_the_browser(ct, unit):
    """The launcher (UNIT's main process) and its child Chromium: Chromium's
    command line and what its fds 3 and 4 are."""
    launcher = us.unit(ct, unit, "MainPID")["MainPID"]
    assert us.comm(ct, launcher) == "guidedaccessctl"
    [child] = ct.run(["pgrep", "-P", launcher]).stdout.split()
    # Chromium rewrites its command line into one string (its process title).
    argv = ct.run(["cat", f"/proc/{child}/cmdline"]).stdout.replace("\0", " ").split()
    fds = [ct.run(["readlink", f"/proc/{child}/fd/{n}"]).stdout.strip() for n in (3, 4)]
    return argv, fds


def audit_records(ct, user=None):
    """The browserAttached audit records, fields that matter only."""
    out = ct.run(["journalctl", *(["--user"] if user else []), "--no-pager", "-o", "json",
                  f"MESSAGE_ID={BROWSER_ATTACHED}"], user=user).stdout
    keep = ("GUIDEDACCESS_EVENT", "GUIDEDACCESS_BROWSER", "GUIDEDACCESS_LAUNCHER", "GUIDEDACCESS_CALLER_UID",
            "GUIDEDACCESS_CALLER_EXE", "_SYSTEMD_UNIT", "_SYSTEMD_USER_UNIT", "MESSAGE")
    return [{k: r.get(k) for k in keep} for r in map(json.loads, out.splitlines())]


# --- user mode: the kiosk user's gdbus, the user unit ------------------------------


def gdbus(ct, method, *args):
    """`gdbus call --session` as tester: (reply, sent, replied), the times
    in seconds since the epoch, taken in the container."""
    out = ct.run(["sh", "-c", 'date +%s.%N && gdbus call --session "$@" && date +%s.%N', "sh", "--dest", BUS_NAME,
                  "--object-path", OBJECT, "--method", method, *args], user=KIOSK_USER).stdout
    sent, reply, replied = out.strip().split("\n")
    return reply, float(sent), float(replied)


def prop(ct, name):
    return gdbus(ct, "org.freedesktop.DBus.Properties.Get", BUS_NAME, name)[0]


def desktop(text):
    """The string in gdbus's `(<'none+browser'>,)`."""
    return re.fullmatch(r"\(<'(.*)'>,\)", text).group(1)


def user_log(ct, unit, pid=None):
    """UNIT's journal (the kiosk user's); only process PID's lines when given."""
    ct.run(["journalctl", "--sync"])
    return ct.run(["journalctl", "--user", "--no-pager", "-q", "-o", "cat", "-u", unit,
                   *([f"_PID={pid}"] if pid else [])], user=KIOSK_USER).stdout


def show_in_page(ct, log, start, end):
    """START() then END() (the calls, each returning (sent, replied)): the
    page logs `invert(1)` after the first and `none` after the second;
    returns the figures (seconds from the call's reply to the page's log)."""
    since = len(looks(ct, log))
    sent, replied = start()
    on = wait_look(ct, log, "invert(1)", since, "the page to log filter=invert(1)")
    since = len(looks(ct, log))
    sent_end, replied_end = end()
    off = wait_look(ct, log, "none", since, "the page to log filter=none")
    # The service answers once the pages have the look (or after 1.5 s);
    # the page looks every 50 ms: it logs it about when the reply comes.
    assert sent - 0.1 <= on <= replied + 1.0 and sent_end - 0.1 <= off <= replied_end + 1.0, \
        (sent, on, replied, sent_end, off, replied_end)
    return on - replied, off - replied_end, replied - sent


def test_1_user_mode_the_launcher_attaches_the_pipe_to_the_user_unit(browser_container):
    ct = browser_container
    unit = "guidedaccess-test-browser-pipe.service"
    assert us.unit(ct, SERVICE, "ActiveState")["ActiveState"] == "inactive"
    log = start_browser(ct, unit, ["guidedaccessctl", "browser", "--", *chromium("profile-pipe")])
    try:
        # The launcher's AttachBrowser D-Bus-activated the user unit.
        us.wait_for(lambda: "guidedaccessctl browser: attached: " in browser_log(ct, log), "the launcher attached")
        state = us.unit(ct, SERVICE, "ActiveState", "MainPID", "ControlGroup", "RestrictAddressFamilies")
        assert (state["ActiveState"], state["ControlGroup"]) == ("active", APP_SLICE + SERVICE), state
        main = state["MainPID"]
        assert us.comm(ct, main) == "guidedaccessd"
        # Its unified-hierarchy line (a hybrid host adds v1 lines).
        cgroup = [line for line in ct.run(["cat", f"/proc/{main}/cgroup"]).stdout.splitlines() if line.startswith("0::")]
        assert cgroup == [f"0::{APP_SLICE}{SERVICE}"], cgroup
        assert set(state["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}, state
        fact("user unit: MainPID's cgroup, RestrictAddressFamilies",
             f"{APP_SLICE}{SERVICE}, {state['RestrictAddressFamilies']}")
        shown = desktop(prop(ct, "Desktop"))
        fact("user mode, attached: Desktop", shown)
        assert shown.endswith("+browser")
        # DevTools on the pipe (fds 3 and 4 of the launcher's child), no port.
        argv, fds = pipe_of_the_browser(ct, unit)
        fact("user mode, attached: the launcher's child", f"{' '.join(argv[:3])} …; fds 3, 4: {', '.join(fds)}")
        assert "--remote-debugging-pipe" in argv and not [a for a in argv if "remote-debugging-port" in a], argv
        assert all(fd.startswith("pipe:[") for fd in fds), fds
        listeners = tcp_listeners(ct)
        fact("user mode, attached: ss -ltnp", listeners or "no listening TCP socket")
        assert not [line for line in listeners if "chromium" in line]
        connected = re.search(r"browser layer: connected to (Chrome/\S+) attached by (:1\.\d+) \(uid 1000\)",
                              user_log(ct, SERVICE, main))
        assert connected, user_log(ct, SERVICE, main)
        fact("user unit's journal", connected.group(0))
        product, launcher = connected.groups()
        assert audit_records(ct, user=KIOSK_USER) == [{
            "GUIDEDACCESS_EVENT": "browserAttached", "GUIDEDACCESS_BROWSER": product,
            "GUIDEDACCESS_LAUNCHER": launcher, "GUIDEDACCESS_CALLER_UID": str(KIOSK_UID),
            "GUIDEDACCESS_CALLER_EXE": "/usr/bin/guidedaccessctl", "_SYSTEMD_UNIT": f"user@{KIOSK_UID}.service",
            "_SYSTEMD_USER_UNIT": SERVICE, "MESSAGE": f"browser {product} attached by {launcher}"}]
        on, off, call = show_in_page(ct, log, lambda: gdbus(ct, f"{BUS_NAME}.StartSession", INVERT)[1:],
                                     lambda: gdbus(ct, f"{BUS_NAME}.EndSession")[1:])
        fact("user mode, pipe: StartSession call (sent → reply)", f"{call:.2f} s")
        fact("user mode, pipe: StartSession reply → page logs invert(1)", f"{on:+.3f} s")
        fact("user mode, pipe: EndSession reply → page logs none", f"{off:+.3f} s")
    finally:
        stop_browser(ct, unit)
    # The launcher gone, the service lets go of the browser.
    us.wait_for(lambda: desktop(prop(ct, "Desktop")) == "none", "Desktop without +browser after the browser's end",
                timeout=5)


def test_2_user_mode_devtools_endpoint_needs_af_inet_in_the_user_unit(browser_container):
    ct = browser_container
    unit = "guidedaccess-test-browser-port.service"
    log = start_browser(ct, unit, chromium("profile-port", f"--remote-debugging-port={PORT}"))
    try:
        listeners = tcp_listeners(ct)
        assert [line for line in listeners if f"127.0.0.1:{PORT} " in line and '"chromium"' in line], listeners
        ct.sh(f"mkdir -p {USER_CONFIG.rsplit('/', 1)[0]} && cat > {USER_CONFIG}", user=KIOSK_USER,
              input=f"[Browser]\nDevToolsEndpoint={ENDPOINT}\n")
        restarted = time.monotonic()
        us.systemctl(ct, "restart", SERVICE)
        prop(ct, "SupportedFeatures")  # a read makes the service look for the endpoint
        us.wait_for(lambda: desktop(prop(ct, "Desktop")).endswith("+browser"), "Desktop …+browser", timeout=5)
        fact("user mode, endpoint: restart → Desktop …+browser", f"{time.monotonic() - restarted:.2f} s")
        main = us.unit(ct, SERVICE, "MainPID")["MainPID"]
        assert "browser layer: connected to Chrome/" in user_log(ct, SERVICE, main)
        assert f" at {ENDPOINT}" in user_log(ct, SERVICE, main)
        on, off, _ = show_in_page(ct, log, lambda: gdbus(ct, f"{BUS_NAME}.StartSession", INVERT)[1:],
                                  lambda: gdbus(ct, f"{BUS_NAME}.EndSession")[1:])
        fact("user mode, endpoint: StartSession reply → page logs invert(1)", f"{on:+.3f} s")
        fact("user mode, endpoint: EndSession reply → page logs none", f"{off:+.3f} s")

        # The unit as it was before: AF_UNIX only (the empty assignment
        # resets the list; a second one alone would be merged with it).
        ct.sh(f"mkdir -p {DROP_INS} && printf '[Service]\\nRestrictAddressFamilies=\\n"
              f"RestrictAddressFamilies=AF_UNIX\\n' > {DROP_INS}/af-unix-only.conf", user=KIOSK_USER)
        us.systemctl(ct, "daemon-reload")
        assert us.unit(ct, SERVICE, "RestrictAddressFamilies") == {"RestrictAddressFamilies": "AF_UNIX"}
        us.systemctl(ct, "restart", SERVICE)
        main = us.unit(ct, SERVICE, "MainPID")["MainPID"]
        seen = set()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            prop(ct, "SupportedFeatures")
            seen.add(desktop(prop(ct, "Desktop")))
            time.sleep(0.2)
        fact("user mode, endpoint, AF_UNIX only: Desktop for 3 s", sorted(seen))
        assert not [d for d in seen if d.endswith("+browser")]
        why = [line for line in user_log(ct, SERVICE, main).splitlines() if "browser layer" in line]
        fact("user mode, endpoint, AF_UNIX only: the journal", why)
        assert any(f"no browser at {ENDPOINT}: socket: Address family not supported by protocol" in line
                   for line in why), why
    finally:
        ct.run(["rm", "-rf", DROP_INS], user=KIOSK_USER)
        us.systemctl(ct, "daemon-reload")
        stop_browser(ct, unit)


# --- system mode: root's guidedaccessctl, the system service, the agent -----------


def ctl(ct, *args):
    """`guidedaccessctl --system ARGS` as root: (sent, replied), in the container."""
    lines = ct.run(["sh", "-c", 'date +%s.%N && guidedaccessctl --system "$@" && date +%s.%N', "sh", *args]
                   ).stdout.strip().split("\n")
    return float(lines[0]), float(lines[-1])


def system_prop(ct, name):
    return ct.run(["gdbus", "call", "--system", "--dest", BUS_NAME, "--object-path", OBJECT, "--method",
                   "org.freedesktop.DBus.Properties.Get", BUS_NAME, name]).stdout.strip()


def agent_registered(ct):
    us.wait_for(lambda: system_prop(ct, "Agent") == "(<'tester'>,)", "the agent registered", timeout=20)


def test_3_system_mode_the_launcher_attaches_the_pipe_through_the_system_service_to_the_agent(browser_kiosk):
    ct = browser_kiosk
    agent_registered(ct)
    # The system unit keeps no network; the agent's unit has AF_INET now.
    system = dict(line.split("=", 1) for line in ct.run(
        ["systemctl", "show", "-p", "PrivateNetwork,RestrictAddressFamilies", "guidedaccessd.service"]
    ).stdout.splitlines())
    assert system == {"PrivateNetwork": "yes", "RestrictAddressFamilies": "AF_UNIX"}, system
    agent = us.unit(ct, AGENT, "ActiveState", "RestrictAddressFamilies", "ControlGroup")
    assert agent["ActiveState"] == "active" and agent["ControlGroup"] == APP_SLICE + AGENT, agent
    assert set(agent["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}, agent
    assert desktop(system_prop(ct, "Desktop")) == "none"
    unit = "guidedaccess-test-browser-system.service"
    log = start_browser(ct, unit, ["guidedaccessctl", "--system", "browser", "--", *chromium("profile-system")])
    try:
        us.wait_for(lambda: "guidedaccessctl browser: attached: " in browser_log(ct, log), "the launcher attached")
        us.wait_for(lambda: desktop(system_prop(ct, "Desktop")).endswith("+browser"), "Desktop …+browser",
                    timeout=5)
        fact("system mode, attached: Desktop", desktop(system_prop(ct, "Desktop")))
        argv, fds = pipe_of_the_browser(ct, unit)
        assert "--remote-debugging-pipe" in argv and all(f.startswith("pipe:[") for f in fds), (argv, fds)
        listeners = tcp_listeners(ct)
        fact("system mode, attached: ss -ltnp", listeners or "no listening TCP socket")
        assert not [line for line in listeners if "chromium" in line]
        # The agent drives the pages; the system service keeps the audit record.
        agent_pid = us.unit(ct, AGENT, "MainPID")["MainPID"]
        connected = re.search(r"browser layer: connected to (Chrome/\S+) attached by (:1\.\d+) \(uid 1000\)",
                              user_log(ct, AGENT, agent_pid))
        assert connected, user_log(ct, AGENT, agent_pid)
        fact("agent's journal", connected.group(0))
        [record] = audit_records(ct)
        assert (record["GUIDEDACCESS_EVENT"], record["GUIDEDACCESS_CALLER_UID"], record["GUIDEDACCESS_CALLER_EXE"],
                record["_SYSTEMD_UNIT"]) == ("browserAttached", str(KIOSK_UID), "/usr/bin/guidedaccessctl",
                                             "guidedaccessd.service"), record
        assert record["GUIDEDACCESS_BROWSER"] == connected.group(1), record
        on, off, _ = show_in_page(ct, log, lambda: ctl(ct, "start", "--feature", "invert-colors"),
                                  lambda: ctl(ct, "end"))
        fact("system mode, pipe: StartSession reply → page logs invert(1)", f"{on:+.3f} s")
        fact("system mode, pipe: EndSession reply → page logs none", f"{off:+.3f} s")
    finally:
        stop_browser(ct, unit)
    us.wait_for(lambda: desktop(system_prop(ct, "Desktop")) == "none",
                "Desktop without +browser after the browser's end", timeout=5)


def test_4_system_mode_devtools_endpoint_through_the_agent(browser_kiosk):
    ct = browser_kiosk
    unit = "guidedaccess-test-browser-system-port.service"
    log = start_browser(ct, unit, chromium("profile-system-port", f"--remote-debugging-port={PORT}"))
    try:
        ct.sh("cat >> /etc/guidedaccess/guidedaccess.conf", input=f"\n[Browser]\nDevToolsEndpoint={ENDPOINT}\n")
        # The agent reads the system service's configuration when it starts.
        restarted = time.monotonic()
        us.systemctl(ct, "restart", AGENT)
        us.wait_for(lambda: desktop(system_prop(ct, "Desktop")).endswith("+browser"), "Desktop …+browser",
                    timeout=5)
        fact("system mode, endpoint: agent restart → Desktop …+browser", f"{time.monotonic() - restarted:.2f} s")
        agent_pid = us.unit(ct, AGENT, "MainPID")["MainPID"]
        assert "browser layer: connected to Chrome/" in user_log(ct, AGENT, agent_pid)
        assert f" at {ENDPOINT}" in user_log(ct, AGENT, agent_pid)
        on, off, _ = show_in_page(ct, log, lambda: ctl(ct, "start", "--feature", "invert-colors"),
                                  lambda: ctl(ct, "end"))
        fact("system mode, endpoint: StartSession reply → page logs invert(1)", f"{on:+.3f} s")
        fact("system mode, endpoint: EndSession reply → page logs none", f"{off:+.3f} s")
    finally:
        stop_browser(ct, unit)
