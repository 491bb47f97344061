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

The page API (1.2) in steps 1 and 3: there the page is PAGE_URL, served on
127.0.0.1:8088 by python3's http.server (PAGE_SERVER, a transient unit of
tester's), its origin ORIGIN in `[Browser] AllowOrigins=` (step 1: tester's
~/.config/guidedaccess/guidedaccess.conf before the launcher activates the
unit; step 3: user_session.BROWSER_KIOSK_CONFIG, read by the system service
and the agent when they start). After the gdbus/guidedaccessctl session, the
test creates go-start in the served directory; the page (polling for it)
finds `typeof guidedAccess === 'object'` and calls startSession with an
unknown option (InvalidArgs naming it), startSession({features:
['invert-colors']}), configureForSession(['teleport'], true) (UnknownFeature)
and getState(); it gets `sessionchange` {active: true} and inverts; the
service's SessionOwnerOrigin (busctl --user / --system) is ORIGIN and
SessionOwner the launcher's unique name; go-end: endSession() resolves,
`sessionchange` {active: false}, SessionOwnerOrigin "", a second
endSession() → NotInSession. The page reports each call's outcome (the
error's `name` and `message`) and each event by POSTing JSON to its own
server, which appends it to RESULTS; the test reads that file.
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
# The page API (1.2): the page served over HTTP on 127.0.0.1 (PAGE_SERVER, as
# tester), its origin in [Browser] AllowOrigins= (tests 1 and 3).
ORIGIN = us.BROWSER_KIOSK_PAGE_ORIGIN  # "http://127.0.0.1:8088", in system mode's configuration too
PAGE_PORT = int(ORIGIN.rsplit(":", 1)[1])
WWW = f"{HOME}/www"
PAGE_URL = f"{ORIGIN}/page.html"
RESULTS = f"{HOME}/page-results.jsonl"
PAGE_SERVER_UNIT = "guidedaccess-test-page-server.service"

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

// The page API, served over HTTP only: every observation POSTed as JSON to
// the page's own server (PAGE_SERVER), numbered in the page's order. The
// test opens gates by creating files the page polls for (go-start, go-end).
let seq = 0, listening = false;
function report(kind, data) {
  const body = JSON.stringify(Object.assign({seq: seq++, kind, time: Date.now()}, data));
  console.log("guidedaccess-api " + body);
  return fetch("/result", {method: "POST", headers: {"Content-Type": "application/json"}, body}).catch(() => {});
}
function listen() {
  if (listening || typeof guidedAccess !== "object") return;
  listening = true;
  for (const type of ["sessionchange", "featureschange", "restrictionchange"])
    guidedAccess.addEventListener(type, (e) => report("event", {type, detail: e.detail}));
}
async function outcome(method, f) {
  try {
    const value = await f();
    await report("call", {method, ok: true, value: value === undefined ? null : value});
  }
  catch (e) { await report("call", {method, ok: false, name: e.name, message: e.message}); }
}
async function gate(name) {
  for (;;) {
    try { if ((await fetch(name, {cache: "no-store"})).ok) return; } catch (e) {}
    await new Promise((r) => setTimeout(r, 100));
  }
}
async function drive() {
  await report("loaded", {type: typeof guidedAccess, origin: location.origin});
  listen();
  await gate("go-start");
  listen();
  await report("go", {type: typeof guidedAccess, origin: location.origin,
                      members: typeof guidedAccess === "object" ? Object.keys(guidedAccess).sort() : null});
  if (typeof guidedAccess !== "object") return;
  await outcome("startSession(bad key)",
                () => guidedAccess.startSession({features: ["invert-colors"], teleport: true}));
  await outcome("startSession", () => guidedAccess.startSession({features: ["invert-colors"]}));
  await outcome("configureForSession(teleport)", () => guidedAccess.configureForSession(["teleport"], true));
  await outcome("getState", () => guidedAccess.getState());
  await report("started", {});
  await gate("go-end");
  await outcome("endSession", () => guidedAccess.endSession());
  await outcome("endSession(again)", () => guidedAccess.endSession());
  await report("ended", {});
}
if (location.protocol === "http:") drive();
</script></body></html>
"""

# The page's server: python's http.server for the files of WWW, and POST
# appends the request's body (one JSON object) as a line to RESULTS.
PAGE_SERVER = """\
import http.server, sys
port, results = int(sys.argv[1]), sys.argv[2]

class Handler(http.server.SimpleHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(results, "ab") as f:
            f.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(204)
        self.end_headers()

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""
# [1234:1234:1127/195646.043753:INFO:CONSOLE:7] "guidedaccess-test 1764273406043 filter=none zoom=1", source: …
_LOGGED = re.compile(r':INFO:CONSOLE[^\]]*\] "guidedaccess-test (\d+) filter=(.*?) zoom=(\S+)", source:')


def fact(name, value):
    FACTS[f"browser: {name}"] = value
    print(f"\nbrowser: {name}: {value}")


# --- the browser ------------------------------------------------------------------


def chromium(profile, *extra, url=URL):
    """Chromium's command line: headless, its console on stderr."""
    return ["chromium", "--headless=new", "--no-sandbox", "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={HOME}/{profile}", *extra, url]


def start_browser(ct, unit, argv, url=URL):
    """ARGV as tester's transient unit UNIT, stdout and stderr in
    ~/UNIT.log; returns once the page has logged its first look (Chromium
    runs and has loaded it). Returns the log's path."""
    log = f"{HOME}/{unit}.log"
    ct.sh(f"test -e {PAGE_PATH} || cat > {PAGE_PATH}", user=KIOSK_USER, input=PAGE)
    started = time.monotonic()
    ct.run(["systemd-run", "--user", "-q", f"--unit={unit}", f"--description=kiosk browser for tests ({unit})",
            "-p", f"StandardOutput=truncate:{log}", "-p", f"StandardError=truncate:{log}", "--", *argv],
           user=KIOSK_USER)
    wait_look(ct, log, "none", 0, f"Chromium ({unit}) to load {url}", timeout=30)
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


# --- the page API: the page's server, what the page reported ----------------------


def start_page_server(ct):
    """PAGE at PAGE_URL: PAGE_SERVER as tester's transient unit (python3's
    http.server in WWW), RESULTS emptied. Returns once it listens."""
    ct.sh(f"mkdir -p {WWW} && rm -f {WWW}/go-* {RESULTS} && cat > {WWW}/page.html", user=KIOSK_USER, input=PAGE)
    ct.sh(f"cat > {HOME}/page_server.py", user=KIOSK_USER, input=PAGE_SERVER)
    ct.run(["systemd-run", "--user", "-q", f"--unit={PAGE_SERVER_UNIT}", "--description=the kiosk page's server",
            "-p", f"WorkingDirectory={WWW}", "--", "python3", f"{HOME}/page_server.py", str(PAGE_PORT), RESULTS],
           user=KIOSK_USER)
    us.wait_for(lambda: [line for line in tcp_listeners(ct) if f"127.0.0.1:{PAGE_PORT} " in line],
                f"the page's server on 127.0.0.1:{PAGE_PORT}", timeout=10)


def page_results(ct):
    """What the page POSTed, in the page's order (its `seq`)."""
    text = ct.run(["cat", RESULTS], check=False).stdout
    return sorted((json.loads(line) for line in text.splitlines() if line.strip()), key=lambda r: r["seq"])


def wait_result(ct, log, what, predicate, timeout=10.0):
    """The first of the page's reports for which PREDICATE holds; fails with
    what the page reported and its console lines."""
    try:
        return us.wait_for(lambda: next((r for r in page_results(ct) if predicate(r)), None), what,
                           timeout=timeout, interval=0.05)
    except TimeoutError as error:
        api = [line for line in browser_log(ct, log).splitlines() if "guidedaccess-api" in line or "ERROR" in line]
        raise AssertionError(f"{error}; the page reported {page_results(ct)}; its console:\n" +
                             "\n".join(api[-40:]))


def page_api(ct, log, get_property, launcher, mode):
    """The page (PAGE_URL, its origin ORIGIN in AllowOrigins) uses
    `guidedAccess` once the test opens its gates: startSession with an
    unknown option → InvalidArgs naming it; startSession({features:
    ['invert-colors']}) → resolves, `sessionchange` {active: true}, the page
    inverted, SessionOwnerOrigin ORIGIN and SessionOwner LAUNCHER (through
    GET_PROPERTY(name) → value); configureForSession(['teleport'], true) →
    UnknownFeature; getState; endSession() → resolves, `sessionchange`
    {active: false}, SessionOwnerOrigin ""; endSession() again →
    NotInSession. Returns the figures."""
    loaded = wait_result(ct, log, "the page's `loaded` report", lambda r: r["kind"] == "loaded")
    since = len(looks(ct, log))
    ct.run(["touch", f"{WWW}/go-start"], user=KIOSK_USER)
    go = wait_result(ct, log, "the page's `go` report", lambda r: r["kind"] == "go")
    assert (go["type"], go["origin"]) == ("object", ORIGIN), (loaded, go)
    assert go["members"] == ["configureForSession", "endSession", "getState", "registerRestrictions",
                             "restrictionState", "startSession", "unregisterRestrictions"], go
    fact(f"{mode}, page API: typeof guidedAccess at load / at the gate",
         f"{loaded['type']} / {go['type']} (a page loaded before the attachment is loaded again, with the API)")
    wait_result(ct, log, "the page's `started` report", lambda r: r["kind"] == "started")
    calls = {r["method"]: r for r in page_results(ct) if r["kind"] == "call"}
    bad = calls["startSession(bad key)"]
    assert (bad["ok"], bad["name"]) == (False, "InvalidArgs") and "teleport" in bad["message"], bad
    start = calls["startSession"]
    assert (start["ok"], start["value"]) == (True, None), start
    teleport = calls["configureForSession(teleport)"]
    assert (teleport["ok"], teleport["name"]) == (False, "UnknownFeature"), teleport
    fact(f"{mode}, page API: configureForSession(['teleport'], true)", f"{teleport['name']}: {teleport['message']}")
    state = calls["getState"]
    assert state["ok"] and state["value"]["sessionActive"] is True, state
    assert state["value"]["enabledFeatures"] == ["invert-colors"], state
    active = wait_result(ct, log, "sessionchange {active: true}", lambda r: r["kind"] == "event"
                         and r["seq"] > go["seq"] and r["type"] == "sessionchange" and r["detail"]["active"] is True)
    inverted = wait_look(ct, log, "invert(1)", since, "the page to log filter=invert(1) for its own session")
    fact(f"{mode}, page API: startSession resolved → sessionchange {{active: true}} (page clock)",
         f"{(active['time'] - start['time']) / 1000:+.3f} s, detail {active['detail']}")
    fact(f"{mode}, page API: the gate → startSession resolved / page inverted",
         f"{(start['time'] - go['time']) / 1000:.3f} s / {inverted - go['time'] / 1000:.3f} s")
    owner = {name: get_property(name) for name in ("SessionActive", "SessionOwner", "SessionOwnerOrigin")}
    fact(f"{mode}, page API: the page's session", owner)
    assert owner == {"SessionActive": True, "SessionOwner": launcher, "SessionOwnerOrigin": ORIGIN}, owner

    since = len(looks(ct, log))
    ct.run(["touch", f"{WWW}/go-end"], user=KIOSK_USER)
    wait_result(ct, log, "the page's `ended` report", lambda r: r["kind"] == "ended")
    calls = {r["method"]: r for r in page_results(ct) if r["kind"] == "call"}
    end = calls["endSession"]
    assert (end["ok"], end["value"]) == (True, None), end
    again = calls["endSession(again)"]
    assert (again["ok"], again["name"]) == (False, "NotInSession"), again
    ended = wait_result(ct, log, "sessionchange {active: false}", lambda r: r["kind"] == "event"
                        and r["seq"] > go["seq"] and r["type"] == "sessionchange" and r["detail"]["active"] is False)
    wait_look(ct, log, "none", since, "the page to log filter=none after its endSession")
    owner = {name: get_property(name) for name in ("SessionActive", "SessionOwnerOrigin")}
    assert owner == {"SessionActive": False, "SessionOwnerOrigin": ""}, owner
    fact(f"{mode}, page API: endSession resolved → sessionchange {{active: false}} (page clock)",
         f"{(ended['time'] - end['time']) / 1000:+.3f} s, detail {ended['detail']}")
    events = [(r["type"], r["detail"]) for r in page_results(ct) if r["kind"] == "event" and r["seq"] > go["seq"]]
    fact(f"{mode}, page API: the events after the gate", events)


def busctl_property(ct, bus, name, user=None):
    """`busctl --BUS --json=short get-property` of the service: the value."""
    out = ct.run(["busctl", f"--{bus}", "--json=short", "get-property", BUS_NAME, OBJECT, BUS_NAME, name],
                 user=user).stdout
    return json.loads(out)["data"]


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
    # The page API for the page's origin (the service reads this when it starts).
    ct.sh(f"mkdir -p {USER_CONFIG.rsplit('/', 1)[0]} && cat > {USER_CONFIG}", user=KIOSK_USER,
          input=f"[Browser]\nAllowOrigins={ORIGIN}\n")
    start_page_server(ct)
    log = start_browser(ct, unit, ["guidedaccessctl", "browser", "--", *chromium("profile-pipe", url=PAGE_URL)],
                        url=PAGE_URL)
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
        # The page's own session through window.guidedAccess: the tab is the
        # caller (the launcher's name, the page's origin).
        started = time.monotonic()
        page_api(ct, log, lambda name: busctl_property(ct, "user", name, user=KIOSK_USER), launcher, "user mode")
        fact("user mode, page API: the steps", f"{time.monotonic() - started:.2f} s")
    finally:
        stop_browser(ct, unit)
        us.systemctl(ct, "stop", PAGE_SERVER_UNIT, check=False)
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
    # BROWSER_KIOSK_CONFIG allows ORIGIN: the agent serves the page API and
    # hands each call on to the system service (PageCall).
    start_page_server(ct)
    log = start_browser(ct, unit, ["guidedaccessctl", "--system", "browser", "--",
                                   *chromium("profile-system", url=PAGE_URL)], url=PAGE_URL)
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
        started = time.monotonic()
        page_api(ct, log, lambda name: busctl_property(ct, "system", name), record["GUIDEDACCESS_LAUNCHER"],
                 "system mode")
        fact("system mode, page API: the steps", f"{time.monotonic() - started:.2f} s")
    finally:
        stop_browser(ct, unit)
        us.systemctl(ct, "stop", PAGE_SERVER_UNIT, check=False)
    us.wait_for(lambda: desktop(system_prop(ct, "Desktop")) == "none",
                "Desktop without +browser after the browser's end", timeout=5)


def test_4_system_mode_devtools_endpoint_through_the_agent(browser_kiosk):
    ct = browser_kiosk
    unit = "guidedaccess-test-browser-system-port.service"
    log = start_browser(ct, unit, chromium("profile-system-port", f"--remote-debugging-port={PORT}"))
    try:
        ct.sh("cat > /etc/guidedaccess/guidedaccess.conf", input=us.BROWSER_KIOSK_CONFIG.replace(
            "[Browser]\n", f"[Browser]\nDevToolsEndpoint={ENDPOINT}\n"))
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
