"""The kiosk browser's DevTools on a pipe: `AttachBrowser(h)` and its
launcher, `guidedaccessctl browser -- COMMAND`.

Contract (what was just implemented, as its brief states it; the tests are
written against that, not against the code):
- `AttachBrowser(h browser)`: one end of a socketpair(AF_UNIX, SOCK_STREAM)
  whose other end relays a Chromium's `--remote-debugging-pipe` (JSON
  messages each followed by a NUL byte). The service sends
  Browser.getVersion at once (2 s timeout) and answers the call only after
  the browser's answer; then its browser layer drives the pages as over the
  WebSocket endpoint. While attached, `Desktop` ends in `+browser` and the
  browser features are in `SupportedFeatures`. Not a Unix stream socket:
  InvalidArgs naming it; no answer within 2 s: InvalidArgs "no DevTools at
  the other end of the socket: …"; a 9th browser: LimitExceeded; a caller
  not admitted as a StartSession caller: NotAuthorized. The same connection
  attaching again replaces its attachment. The service's ids on the pipe
  start at a random value below 2^29 and stay below 2^30. The socket closed:
  the attachment dropped. Audit: `browserAttached`, GUIDEDACCESS_BROWSER
  (the product), GUIDEDACCESS_LAUNCHER (the sender).
- The launcher runs COMMAND with `--remote-debugging-pipe` after argv[0],
  the pipe on the child's fds 3 (commands) and 4 (replies, events), stays
  its parent, and relays the pipe to the service. stderr: "attached: …",
  "attached again: …" after a restart of the service, "the service let go
  of the browser; attaching again when it is back", and "not attached
  (ERRORNAME): MESSAGE; the browser runs without the service's features
  until it is" once per distinct reason (retries 0.1 s doubling to 5 s).
  When an attachment ends it sends the browser Target.setAutoAttach
  {autoAttach: false, waitForDebuggerOnStart: false, flatten: true} with an
  id ≥ 2^30+1; it passes the browser only whole messages. SIGTERM, SIGINT,
  SIGHUP go to the browser; it exits with the browser's status (128+N when
  signal N killed it). Without a service the browser runs all the same.
- A hostile browser on the pipe (issue 18's checks, as
  test_ga_hostile_peers.py makes them over the WebSocket endpoint): another
  client's Properties.Get answered within 100 ms throughout, the service's
  RSS back within 2 MiB once the flood stops, the browser layer's log lines
  limited (a burst of 3, one more every 2 s; the tests allow one a second).

The browser is devtools_pipe_fake.py: run as the launcher's COMMAND (it
records what it receives in a JSON-lines log), or in the test's own process
on one end of a socketpair for the calls made with dbus-python. Every test
runs on a bare bus (`Desktop=none`): whatever SupportedFeatures holds is
the browser's. The figures are printed (`pytest -s`).
"""

import json
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agents import readable
from conftest import start_guidedaccessd
from devtools_pipe_fake import LAUNCHER_IDS, FakePipeBrowser
from gadaemon import (_STARTED, DBUS_ERROR, GA_ERROR, HERE, IFACE, NAME, NOBODY, PATH, REPO_ROOT, Recorder,
                      SupportChanged, _die_with_parent, busctl_options, poll, pump)
from test_ga_browser_faults import BROWSER_FEATURES, CALL_LIMIT, PAGE_COMMANDS, get
from test_ga_hostile_peers import (LATENCY_BOUND, SYSTEM_PYTHON, Prober, browser_layer_lines, get_timed, log_between,
                                   log_size, spawn, status_kib)

CTL = Path(os.environ.get("GUIDEDACCESSCTL", REPO_ROOT / ".build" / "debug" / "guidedaccessctl"))
FAKE = HERE / "devtools_pipe_fake.py"
CONFIG = "[Service]\nDesktop=none\n"
ATTACHED = "guidedaccessctl browser: attached: "
ATTACHED_AGAIN = "guidedaccessctl browser: attached again: "
LET_GO = "guidedaccessctl browser: the service let go of the browser; attaching again when it is back"
NOT_ATTACHED = re.compile(
    r"^guidedaccessctl browser: not attached \(([\w.]+)\): (.*); the browser runs without the service's "
    r"features until it is$")
INVERT = "invert(1)"
ZOOM = "zoom: 2"
GETVERSION_TIMEOUT = 2.0
LIMIT = 8

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs a caller as nobody through setpriv")


@pytest.fixture
def env(ga_env):
    ga_env.stand_for_no_desktop()
    return ga_env


def start(env, **kwargs):
    return start_guidedaccessd(env, config=env.write_config(CONFIG), **kwargs)


# ---------------------------------------------------------------- the launcher and its fake browser


class Said:
    """The lines a stream carries (the launcher's stderr), each with the
    monotonic time it was read, collected by a thread."""

    def __init__(self, stream):
        self.lines = []  # (time, line)
        self.cond = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()

    def all(self):
        with self.cond:
            return [line for _, line in self.lines]

    def matching(self, test, since=0.0):
        with self.cond:
            return [(t, line) for t, line in self.lines if t >= since and test(line)]

    def wait(self, test, timeout, since=0.0):
        """The first (time, line) read at or after `since` for which
        test(line); None after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [(t, line) for t, line in self.lines if t >= since and test(line)]
                if found:
                    return found[0]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.cond.wait(remaining)


class Launcher:
    """`guidedaccessctl --address BUS browser -- devtools_pipe_fake.py ARGS`,
    the fake configured by FAKE_* variables; its stderr in `said`, the
    fake's records read from its log."""

    def __init__(self, env, number, address=None, args=(), fake_env=None):
        if not CTL.exists():
            pytest.fail(f"{CTL} does not exist: build it with 'swift build --product guidedaccessctl' "
                        "or set GUIDEDACCESSCTL", pytrace=False)
        os.chmod(FAKE, 0o755)
        self.log_path = env.root / f"fake-browser-{number}.jsonl"
        self.log_path.touch()
        self.argv = [str(CTL), "--address", address or env.address, "browser", "--", str(FAKE), *args]
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**env.env, "FAKE_LOG": str(self.log_path), **(fake_env or {})}, preexec_fn=_die_with_parent)
        _STARTED.append(self.process)
        self.started = time.monotonic()
        self.said = Said(self.process.stderr)
        self.out = Said(self.process.stdout)
        self._pid = None

    # -- the fake's records

    def records(self, kind=None):
        out = []
        with open(self.log_path) as log:
            for line in log:
                if not line.endswith("\n"):
                    break  # being written
                record = json.loads(line)
                if kind is None or record["kind"] == kind:
                    out.append(record)
        return out

    def received(self, method=None, since=0.0, target=None, browser_only=False):
        return [r for r in self.records("recv")
                if (method is None or r["method"] == method) and r["t"] >= since
                and (target is None or r["target"] == target) and (not browser_only or r["sessionId"] is None)]

    def wait(self, condition, timeout, interval=0.02):
        return poll(condition, timeout, interval)

    def fake_pid(self, timeout=5.0):
        if self._pid is None:
            starts = self.wait(lambda: self.records("start"), timeout)
            assert starts, f"the fake browser did not start: {self.said.all()}"
            self._pid = starts[0]["pid"]
        return self._pid

    def fake_alive(self):
        try:
            with open(f"/proc/{self.fake_pid()}/cmdline", "rb") as cmdline:
                return b"devtools_pipe_fake" in cmdline.read()
        except FileNotFoundError:
            return False

    def signal_fake(self, signum):
        os.kill(self.fake_pid(), signum)

    def bad(self):
        return self.records("bad")

    # -- the launcher

    def wait_said(self, text, timeout, since=0.0):
        """The first stderr line starting with `text`: (time, line) or None."""
        return self.said.wait(lambda line: line.startswith(text), timeout, since)

    def attached(self, timeout=5.0):
        found = self.wait_said(ATTACHED, timeout)
        assert found, f"the launcher did not say it attached within {timeout} s: {self.said.all()}"
        return found

    def exit_status(self, timeout):
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        pid = self._pid
        if pid is None:
            starts = self.records("start")
            pid = starts[0]["pid"] if starts else None
        if pid is not None:
            self._pid = pid
            if self.fake_alive():
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def logs(self):
        try:
            records = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            records = []
        return [(f"launcher {' '.join(self.argv)}: stderr (exit {self.process.poll()})",
                 "\n".join(f"{t:.3f} {line}" for t, line in self.said.lines)),
                ("its fake browser's records (the last 150)", "\n".join(r[:400] for r in records[-150:]))]


@pytest.fixture
def launch(request, env):
    """Starts launchers (each with its fake browser); stops them after the
    test (the fakes first); their stderr and the fakes' records go to a
    failure's report. A fake that received something other than whole JSON
    commands fails the test: the launcher passes only whole messages."""
    made = []
    if not hasattr(request.node, "_dbus_buses"):
        request.node._dbus_buses = []

    def make(pages=2, address=None, args=(), **fake_env):
        launcher = Launcher(env, len(made) + 1, address=address, args=args,
                            fake_env={"FAKE_PAGES": str(pages), **{k: str(v) for k, v in fake_env.items()}})
        made.append(launcher)
        request.node._dbus_buses.append(launcher)
        return launcher

    yield make
    for launcher in made:
        launcher.stop()
    for launcher in made:
        assert not launcher.bad(), f"the fake browser received what is not a whole command: {launcher.bad()[:5]}"


def showed(browser, target, css, since=0.0):
    """Whether page `target` got the look at or after `since`: the time it
    had both its style in a document script and in the current document
    (None: not yet)."""
    scripts = [r["t"] for r in browser.received("Page.addScriptToEvaluateOnNewDocument", since, target)
               if css in r["params"].get("source", "")]
    now = [r["t"] for r in browser.received("Runtime.evaluate", since, target)
           if css in r["params"].get("expression", "")]
    return max(scripts[0], now[0]) if scripts and now else None


def wait_showed(browser, targets, css, since=0.0, timeout=3.0):
    """{page: time it had the look}, once every page of `targets` has it;
    None after `timeout` s."""
    def all_shown():
        times = {t: showed(browser, t, css, since) for t in targets}
        return times if all(times.values()) else None

    return browser.wait(all_shown, timeout)


def pages_of(count):
    return [f"PAGE{i + 1}" for i in range(count)]


def start_session(env, *features):
    started = time.monotonic()
    rc, _, err = env.busctl_call("StartSession", *busctl_options(features=list(features)))
    return rc, err.strip(), time.monotonic() - started


def listening_sockets(pids):
    """The lines of `ss -ltunpH` (TCP and UDP sockets listening or bound)
    owned by one of `pids`."""
    completed = subprocess.run(["ss", "-ltunpH"], capture_output=True, text=True, timeout=10)
    assert completed.returncode == 0, completed.stderr
    return [line for line in completed.stdout.splitlines()
            if any(re.search(rf"\bpid={pid}\b", line) for pid in pids)]


def wait_property(env, name, value, timeout):
    """Polls a property through busctl until it equals `value`; the seconds
    it took, or None."""
    started = time.monotonic()
    while True:
        if get(env, name) == value:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            return None
        time.sleep(0.02)


# ---------------------------------------------------------------- attaching through the launcher


def test_the_launcher_attaches_its_browser_and_a_session_reaches_every_page(env, launch):
    """The launcher starts the browser with `--remote-debugging-pipe` right
    after argv[0] and the pipe on fds 3 and 4 (pipes; nothing else of its
    own: no socket to the service or the bus), and attaches it: `Desktop`
    becomes `none+browser`, the browser features are supported. The first
    thing the browser hears is Browser.getVersion, with an id below 2^29,
    and every id of the service stays below 2^30. A session with
    invert-colors reaches each of the three pages (the page commands of the
    WebSocket endpoint's layer, the style in a document script and in the
    current document); EndSession takes it away from each again and lets go
    of the pages (auto-attach off). Neither the launcher nor the browser
    listens on any TCP or UDP port."""
    daemon = start(env)
    rec = Recorder(env)
    before = {"Desktop": rec.prop("Desktop"), "SupportedFeatures": rec.prop("SupportedFeatures")}
    assert before == {"Desktop": "none", "SupportedFeatures": []}, before
    rec.clear()
    browser = launch(pages=3, args=("--kiosk", "https://kiosk.example/"))
    when, line = browser.attached()
    attach_took = when - browser.started
    after = {"Desktop": rec.prop("Desktop"), "SupportedFeatures": rec.prop("SupportedFeatures")}
    changed = SupportChanged("none+browser", BROWSER_FEATURES)
    announced = pump(lambda: changed in rec.events, 2)

    start_record = browser.records("start")[0]
    own_log = str(browser.log_path)
    fds = {int(fd): target for fd, target in start_record["fds"].items() if target != own_log}
    first = browser.received()[0]

    since = time.monotonic()
    rc, err, took = start_session(env, "invert-colors")
    assert rc == 0, err
    shown = wait_showed(browser, pages_of(3), INVERT, since)
    per_page = {page: sorted({r["method"] for r in browser.received(since=since, target=page)})
                for page in pages_of(3)}

    ended = time.monotonic()
    rc, _, err = env.busctl_call("EndSession")
    assert rc == 0, err
    let_go = browser.wait(lambda: [r for r in browser.received("Target.setAutoAttach", ended, browser_only=True)
                                   if r["params"].get("autoAttach") is False], 3)
    removed = {page: [r for r in browser.received("Page.removeScriptToEvaluateOnNewDocument", ended, page)]
               for page in pages_of(3)}
    cleared = {page: [r for r in browser.received("Runtime.evaluate", ended, page)
                      if "const css = null" in r["params"].get("expression", "")] for page in pages_of(3)}
    listening = listening_sockets([browser.process.pid, browser.fake_pid()])
    ids = [r["id"] for r in browser.received() if r["id"] < LAUNCHER_IDS]
    theirs = [r["id"] for r in browser.received() if r["id"] >= LAUNCHER_IDS]

    print(f"\n[launcher] attached {attach_took * 1000:.0f} ms after the launcher started ({line!r}); "
          f"the fake's argv {start_record['argv']}, fds {fds}; first command {first['method']} id {first['id']}; "
          f"service ids {min(ids)}..{max(ids)} ({len(ids)} commands), the launcher's {theirs}; StartSession "
          f"{took * 1000:.0f} ms, the look on the pages after "
          f"{ {p: round((t - since) * 1000) for p, t in (shown or {}).items()} } ms; commands per page {per_page}; "
          f"listening sockets of the launcher or browser: {listening}")
    problems = []
    if start_record["argv"][1:] != ["--remote-debugging-pipe", "--kiosk", "https://kiosk.example/"]:
        problems.append(f"the browser's arguments are {start_record['argv'][1:]}, not --remote-debugging-pipe "
                        "then its own")
    if (start_record["fd3"], start_record["fd4"]) != ("fifo", "fifo"):
        problems.append(f"fds 3 and 4 of the browser are {start_record['fd3']}, {start_record['fd4']}, not pipes")
    if set(fds) != {0, 1, 2, 3, 4} or any(target.startswith("socket:") for target in fds.values()):
        problems.append(f"the browser has descriptors beyond its pipe and stdio: {fds}")
    if after != {"Desktop": "none+browser", "SupportedFeatures": BROWSER_FEATURES}:
        problems.append(f"attached, the service says {after}")
    if not announced:
        problems.append(f"no PropertiesChanged for the browser attached: {rec.events}")
    if first["method"] != "Browser.getVersion" or not first["id"] < 2 ** 29:
        problems.append(f"the first command is {first['method']} id {first['id']}, not Browser.getVersion "
                        "with an id below 2^29")
    if max(ids) >= 2 ** 30 or theirs:
        problems.append(f"ids at or above 2^30 while attached: {theirs} (the service's up to {max(ids)})")
    if shown is None:
        problems.append("the session's look did not reach every page within 3 s")
    if any(set(methods) != PAGE_COMMANDS for methods in per_page.values()):
        problems.append(f"the pages got {per_page}, not {sorted(PAGE_COMMANDS)} each")
    if took >= CALL_LIMIT:
        problems.append(f"StartSession took {took:.2f} s")
    if not all(removed.values()) or not all(cleared.values()):
        problems.append(f"EndSession did not take the look away from each page: scripts removed "
                        f"{ {p: len(r) for p, r in removed.items()} }, styles cleared "
                        f"{ {p: len(r) for p, r in cleared.items()} }")
    if not let_go:
        problems.append("EndSession did not let go of the pages (no Target.setAutoAttach autoAttach:false)")
    if listening:
        problems.append(f"the launcher or the browser listens: {listening}")
    assert daemon.alive()
    assert not problems, "\n".join(problems)


def test_a_service_killed_mid_session_gets_the_same_browser_back_and_shows_the_look_again(env, launch):
    """kill -9 of the service during a session with invert-colors: the
    launcher says it let go, sends the browser Target.setAutoAttach
    {autoAttach: false, waitForDebuggerOnStart: false, flatten: true} with
    an id ≥ 2^30+1 (the pages the dead service attached are detached), and,
    once the service owns its name again, attaches the same browser (the
    same process, never restarted) and says "attached again". The restarted
    service resumes the session from its journal and shows its look in both
    pages within 1 s of owning its name, with commands only to sessions
    attached after the restart; `Desktop` is `none+browser` again. The two
    services' first ids differ (each starts at a random value below
    2^29)."""
    daemon = start(env)
    browser = launch(pages=2)
    browser.attached()
    pid = browser.fake_pid()
    rc, err, _ = start_session(env, "invert-colors")
    assert rc == 0, err
    assert wait_showed(browser, pages_of(2), INVERT), f"the look never reached the pages: {browser.said.all()}"

    killed = time.monotonic()
    daemon.kill9()
    let_go = browser.wait_said(LET_GO, 5, since=killed)
    detach = browser.wait(lambda: [r for r in browser.received("Target.setAutoAttach", killed, browser_only=True)
                                   if r["id"] >= LAUNCHER_IDS], 5)
    restarting = time.monotonic()
    daemon.start()
    owned = time.monotonic()  # Daemon.start() polls NameHasOwner every 10 ms
    again = browser.wait_said(ATTACHED_AGAIN, 5, since=killed)
    shown = wait_showed(browser, pages_of(2), INVERT, since=owned - 0.05, timeout=5)
    desktop = get(env, "Desktop")
    active = get(env, "SessionActive")
    versions = [r for r in browser.received("Browser.getVersion") if r["id"] < LAUNCHER_IDS]
    after = [r for r in browser.received(since=restarting) if r["id"] < LAUNCHER_IDS]
    stale = [r for r in after if r["sessionId"] is not None and r["target"] is None]
    delay = max(shown.values()) - owned if shown else None

    print(f"\n[kill -9] the launcher said it let go {((let_go[0] - killed) * 1000) if let_go else None} ms after the "
          f"kill; its command {[(r['id'], r['params']) for r in detach or []]}; the service owned its name "
          f"{(owned - restarting) * 1000:.0f} ms after being started; 'attached again' "
          f"{((again[0] - owned) * 1000) if again else None} ms after that; the look on every page "
          f"{delay * 1000 if delay is not None else None} ms after; Desktop {desktop!r}, SessionActive {active}; "
          f"first ids of the two services {[r['id'] for r in versions]}; commands to unknown sessions "
          f"{len(stale)}; the browser's pid {pid}, started {len(browser.records('start'))} time(s)")
    problems = []
    if let_go is None:
        problems.append(f"the launcher did not say it let go of the browser: {browser.said.all()}")
    if not detach:
        problems.append("the browser got no Target.setAutoAttach from the launcher between the kill and the restart")
    else:
        command = detach[0]
        if not command["id"] >= LAUNCHER_IDS + 1:
            problems.append(f"the launcher's command has id {command['id']}, not ≥ 2^30+1")
        if command["params"] != {"autoAttach": False, "waitForDebuggerOnStart": False, "flatten": True}:
            problems.append(f"the launcher sent Target.setAutoAttach {command['params']}")
        if command["t"] > restarting:
            problems.append("the launcher's Target.setAutoAttach came only after the service was started again")
    if again is None:
        problems.append(f"the launcher did not say 'attached again' within 5 s: {browser.said.all()}")
    if delay is None:
        problems.append("the session's look did not come back to both pages within 5 s of the restart")
    elif delay > 1.0:
        problems.append(f"the look came back {delay:.2f} s after the service owned its name (bound 1 s)")
    if (desktop, active) != ("none+browser", True):
        problems.append(f"after the restart: Desktop {desktop!r}, SessionActive {active}")
    if stale:
        problems.append(f"the restarted service sent {len(stale)} commands to sessions not attached to it: "
                        f"{[(r['method'], r['sessionId']) for r in stale[:4]]}")
    if len(versions) != 2 or versions[0]["id"] == versions[1]["id"] or any(r["id"] >= 2 ** 29 for r in versions):
        problems.append(f"the services' Browser.getVersion ids {[r['id'] for r in versions]}: not two random "
                        "values below 2^29")
    if len(browser.records("start")) != 1 or not browser.fake_alive() or browser.process.poll() is not None:
        problems.append(f"the browser did not stay the same process: started {len(browser.records('start'))} "
                        f"times, alive {browser.fake_alive()}, launcher exit {browser.process.poll()}")
    assert not problems, "\n".join(problems)

    ended = time.monotonic()
    rc, _, err = env.busctl_call("EndSession")
    assert rc == 0, err
    assert browser.wait(lambda: all(browser.received("Page.removeScriptToEvaluateOnNewDocument", ended, p)
                                    for p in pages_of(2)), 3), "EndSession after the restart left the look"


# ---------------------------------------------------------------- exit status and signals


def test_the_browser_exiting_ends_the_launcher_with_its_status_and_the_attachment(env, launch):
    """The browser exits with status 7 (on SIGUSR1, as it would on its
    own): the launcher exits 7 and the service drops the attachment
    (`Desktop` is `none` again, announced, the browser features gone)."""
    start(env)
    rec = Recorder(env)
    browser = launch(pages=1, FAKE_EXIT_ON="SIGUSR1", FAKE_EXIT_STATUS=7)
    browser.attached()
    assert get(env, "Desktop") == "none+browser"
    rec.clear()
    exited = time.monotonic()
    browser.signal_fake(signal.SIGUSR1)
    status = browser.exit_status(5)
    status_took = time.monotonic() - exited
    gone = SupportChanged("none", [])
    dropped = pump(lambda: gone in rec.events, 3)
    dropped_took = time.monotonic() - exited
    print(f"\n[exit 7] launcher exit status {status} after {status_took * 1000:.0f} ms; attachment dropped "
          f"(announced) {dropped} after {dropped_took * 1000:.0f} ms; fake's exit {browser.records('exit')}")
    assert status == 7, f"the launcher exited {status}, not the browser's 7; stderr {browser.said.all()}"
    assert dropped, f"the service did not announce the browser gone: {rec.events}"
    assert (get(env, "Desktop"), get(env, "SupportedFeatures")) == ("none", [])


@pytest.mark.parametrize("signum,on_term,expected", [
    (signal.SIGTERM, "43", 43), (signal.SIGINT, "43", 43), (signal.SIGHUP, "43", 43),
    (signal.SIGTERM, "die", 128 + signal.SIGTERM),
], ids=["SIGTERM", "SIGINT", "SIGHUP", "SIGTERM-dies"])
def test_a_signal_to_the_launcher_goes_to_the_browser_and_its_status_comes_back(env, launch, signum, on_term,
                                                                                  expected):
    """SIGTERM, SIGINT or SIGHUP to the launcher reaches the browser (which
    records it); the launcher exits with the browser's status: the 43 it
    exits with, or 128+15 when it dies of the SIGTERM itself."""
    start(env)
    browser = launch(pages=1, FAKE_ON_TERM=on_term)
    browser.attached()
    sent = time.monotonic()
    browser.process.send_signal(signum)
    status = browser.exit_status(5)
    took = time.monotonic() - sent
    received = browser.records("signal")
    print(f"\n[{signal.Signals(signum).name}, browser {on_term}] the browser received "
          f"{[r['name'] for r in received]}; launcher exit {status} after {took * 1000:.0f} ms")
    assert [r["signum"] for r in received] == [signum], f"the browser received {received}"
    assert status == expected, f"the launcher exited {status}, not {expected}; stderr {browser.said.all()}"


def test_a_browser_killed_by_sigkill_makes_the_launcher_exit_137(env, launch):
    """The browser killed by SIGKILL: the launcher exits 128+9 and the
    service lets go of the browser."""
    start(env)
    browser = launch(pages=1)
    browser.attached()
    browser.signal_fake(signal.SIGKILL)
    status = browser.exit_status(5)
    gone = wait_property(env, "Desktop", "none", 3)
    print(f"\n[SIGKILL] launcher exit {status}; Desktop 'none' after {gone}")
    assert status == 128 + signal.SIGKILL, f"the launcher exited {status}, not 137; stderr {browser.said.all()}"
    assert gone is not None, "the service kept the attachment of a dead browser"


def test_the_launcher_killed_by_sigkill_leaves_the_browser_its_pipe_end(env, launch):
    """The launcher killed by SIGKILL (it cannot pass anything on): the
    browser reads the end of its command pipe — nobody else holds its write
    end — and exits 0 as Chromium does, and the service drops the
    attachment."""
    start(env)
    browser = launch(pages=1)
    browser.attached()
    pid = browser.fake_pid()
    killed = time.monotonic()
    browser.process.kill()
    browser.process.wait(5)
    ended = browser.wait(lambda: browser.records("exit"), 3)
    gone = wait_property(env, "Desktop", "none", 3)
    print(f"\n[launcher SIGKILL] the browser {pid}: {ended and ended[0]} "
          f"({((ended[0]['t'] - killed) * 1000) if ended else None} ms after); Desktop 'none' after {gone}")
    assert ended and ended[0]["why"] == "eof" and ended[0]["status"] == 0, (
        f"the browser did not see its pipe end: {ended}; alive {browser.fake_alive()}")
    assert gone is not None, "the service kept the attachment of a launcher that is gone"


# ---------------------------------------------------------------- no service


def test_with_no_service_the_browser_runs_is_said_once_not_attached_and_attached_when_the_service_comes(env,
                                                                                                        launch):
    """No service on the bus: the browser runs all the same; the launcher
    says "not attached (ERRORNAME): …" once in 3.5 s of retrying (once per
    distinct reason, not once per retry), and attaches when the service
    starts (its retries are at most 5 s apart); a session then reaches the
    pages."""
    browser = launch(pages=2)
    pid = browser.fake_pid()
    time.sleep(3.5)
    said = browser.said.all()
    refusals = [line for line in said if line.startswith("guidedaccessctl browser: not attached")]
    alive = browser.fake_alive() and browser.process.poll() is None
    daemon = start(env)
    owned = time.monotonic()
    attached = browser.wait_said(ATTACHED, 7, since=owned - 0.1)
    desktop = get(env, "Desktop")
    rc, err, _ = start_session(env, "zoom")
    shown = wait_showed(browser, pages_of(2), ZOOM, since=owned)
    print(f"\n[no service] the browser {pid} runs: {alive}; stderr over 3.5 s: {said}; attached "
          f"{((attached[0] - owned) * 1000) if attached else None} ms after the service owned its name "
          f"({attached and attached[1]!r}); Desktop {desktop!r}; zoom on the pages {bool(shown)}")
    assert alive, "the browser does not run without a service"
    assert len(refusals) == 1 and NOT_ATTACHED.match(refusals[0]), (
        f"'not attached' said {len(refusals)} times in 3.5 s (once expected, in the documented form): {said}")
    assert attached is not None, f"not attached within 7 s of the service starting: {browser.said.all()}"
    assert desktop == "none+browser"
    assert rc == 0, err
    assert shown, "a session after the late attachment did not reach the pages"
    assert daemon.alive()


def test_with_no_bus_at_all_the_browser_runs(env, launch):
    """The bus address names nothing: the browser runs, the launcher says
    once in 3 s that it is not attached, and SIGTERM still ends both with
    the browser's status."""
    browser = launch(pages=1, address=f"unix:path={env.root}/no-bus-here", FAKE_ON_TERM=5)
    pid = browser.fake_pid()
    time.sleep(3.0)
    said = browser.said.all()
    refusals = [line for line in said if line.startswith("guidedaccessctl browser: not attached")]
    alive = browser.fake_alive() and browser.process.poll() is None
    browser.process.send_signal(signal.SIGTERM)
    status = browser.exit_status(5)
    print(f"\n[no bus] the browser {pid} runs: {alive}; stderr: {said}; exit on SIGTERM {status}")
    assert alive, "the browser does not run without a bus"
    assert len(refusals) == 1 and NOT_ATTACHED.match(refusals[0]), said
    assert status == 5


# ---------------------------------------------------------------- AttachBrowser, called directly


def connect(env):
    return env.connect(mainloop=False)


def attach_browser(connection, fd, timeout=10):
    """AttachBrowser(h) with `fd` (an int or an object with fileno());
    None, or the error's (name, message)."""
    import dbus

    try:
        connection.call_blocking(NAME, PATH, IFACE, "AttachBrowser", "h", (dbus.types.UnixFd(fd),), timeout=timeout)
        return None
    except dbus.exceptions.DBusException as error:
        return error.get_dbus_name(), error.get_dbus_message() or ""


class Attached:
    """A fake browser in this process on one end of a socketpair, the
    other end handed to the service."""

    def __init__(self, connection, pages=1, product="FakeChrome/1.0"):
        self.ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.browser = FakePipeBrowser(self.ours.fileno(), self.ours.fileno(), pages=pages, product=product).start()
        try:
            self.error = attach_browser(connection, theirs)
        finally:
            theirs.close()

    def let_go_of(self, timeout=2.0):
        """Whether the service closed its end (the fake read its end)."""
        return self.browser.wait(lambda: self.browser.ended is not None, timeout)

    def close(self):
        self.browser.close()
        try:
            self.ours.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self.browser._thread is not None:
            self.browser._thread.join(2)
        self.ours.close()


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_attach_browser_refuses_a_descriptor_that_is_not_a_unix_stream_socket(env):
    """A pipe (either end), a regular file, /dev/null, a datagram or
    seqpacket Unix socket, a TCP socket: each InvalidArgs at once (not
    after the 2 s wait for the browser), the message naming what is wrong;
    nothing attached."""
    daemon = start(env)
    connection = connect(env)
    cases = {}
    read_end, write_end = os.pipe()
    cases["pipe (read end)"] = read_end
    cases["pipe (write end)"] = write_end
    regular = open(env.root / "regular-file", "w+")
    cases["regular file"] = regular.fileno()
    null = open("/dev/null", "rb")
    cases["/dev/null"] = null.fileno()
    keep = []
    for kind, name in ((socket.SOCK_DGRAM, "Unix datagram socket"), (socket.SOCK_SEQPACKET, "Unix seqpacket socket")):
        a, b = socket.socketpair(socket.AF_UNIX, kind)
        keep += [a, b]
        cases[name] = a.fileno()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    tcp = socket.create_connection(listener.getsockname())
    keep += [listener, tcp]
    cases["TCP socket"] = tcp.fileno()
    results = {}
    try:
        for name, fd in cases.items():
            started = time.monotonic()
            results[name] = (attach_browser(connection, fd), time.monotonic() - started)
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        regular.close()
        null.close()
        for s in keep:
            s.close()
    print("\n[not a Unix stream socket] " + "; ".join(
        f"{name}: {error and error[0].rsplit('.', 1)[-1]} {error and error[1]!r} in {took * 1000:.0f} ms"
        for name, (error, took) in results.items()))
    wrong = {name: error for name, (error, _) in results.items()
             if error is None or error[0] != DBUS_ERROR + "InvalidArgs" or "socket" not in error[1].lower()}
    slow = {name: round(took, 2) for name, (_, took) in results.items() if took > 1.5}  # waiting would take 2 s
    assert not wrong, f"not InvalidArgs naming the socket wanted: {wrong}"
    assert not slow, f"refused only after waiting: {slow} s"
    assert get(env, "Desktop") == "none"
    assert daemon.alive()


def test_attach_browser_with_no_devtools_at_the_other_end_fails_in_2_s_and_blocks_no_one(env):
    """A socket whose other end never answers: the service sends it
    Browser.getVersion (id below 2^29) and the call fails after its 2 s
    timeout (within 3 s) with InvalidArgs "no DevTools at the other end of
    the socket: …", its end of the socket closed; meanwhile another
    client's Get of Version every 20 ms is each answered within 100 ms."""
    import dbus

    daemon = start(env)
    caller = env.connect(mainloop=True)
    other = connect(env)
    get_timed(other, "Version")  # the other client's first sight, not counted
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    outcome = []
    started = time.monotonic()
    caller.call_async(NAME, PATH, IFACE, "AttachBrowser", "h", (dbus.types.UnixFd(theirs),),
                      reply_handler=lambda: outcome.append(("reply", "", time.monotonic())),
                      error_handler=lambda e: outcome.append(
                          (e.get_dbus_name(), e.get_dbus_message() or "", time.monotonic())),
                      timeout=10)
    theirs.close()
    latencies = []
    while not outcome and time.monotonic() - started < 6:
        value, took = get_timed(other, "Version")
        latencies.append(took)
        pump(lambda: bool(outcome), 0.02)
    assert outcome, "AttachBrowser got no answer within 6 s"
    name, message, answered = outcome[0]
    took = answered - started
    ours.settimeout(2)
    data = b""
    try:
        while True:
            chunk = ours.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        closed = False
    else:
        closed = True
    ours.close()
    sent = [json.loads(m) for m in data.split(b"\0")[:-1]]
    tail = data.split(b"\0")[-1][:80]
    print(f"\n[no DevTools] {name} {message!r} after {took * 1000:.0f} ms; the service sent {sent} "
          f"(unterminated tail {tail!r}), then closed its end: {closed}; "
          f"the other client's Get: {len(latencies)} samples, max {max(latencies) * 1000:.1f} ms")
    assert name == DBUS_ERROR + "InvalidArgs" and message.startswith("no DevTools at the other end of the socket: "), (
        name, message)
    assert GETVERSION_TIMEOUT - 0.1 <= took <= 3.0, f"failed after {took:.2f} s, not after the 2 s timeout"
    assert [m.get("method") for m in sent] == ["Browser.getVersion"] and sent[0]["id"] < 2 ** 29, sent
    assert closed, "the service kept its end of the socket of a failed attachment"
    assert max(latencies) <= LATENCY_BOUND, (
        f"another client's Get took up to {max(latencies) * 1000:.0f} ms while AttachBrowser waited")
    assert get(env, "Desktop") == "none"
    assert daemon.alive()


def test_a_ninth_browser_is_refused_and_a_connection_attaching_again_replaces_its_own(env):
    """Eight connections each attach a browser: the ninth gets
    LimitExceeded (nothing of it attached). The first connection attaching
    again replaces its own attachment (the service closes the old socket)
    instead of counting a ninth. A browser that goes (its socket closed)
    frees its place: the ninth connection then attaches."""
    daemon = start(env)
    connections = [connect(env) for _ in range(LIMIT + 1)]
    attached = []
    try:
        for n, connection in enumerate(connections[:LIMIT]):
            attached.append(Attached(connection, product=f"FakeChrome/{n + 1}.0"))
        errors = [a.error for a in attached if a.error is not None]
        ninth = Attached(connections[LIMIT], product="FakeChrome/9.0")
        attached.append(ninth)
        desktop = get(env, "Desktop")

        again = Attached(connections[0], product="FakeChrome/1.1")
        attached.append(again)
        replaced = attached[0].let_go_of(3)
        others_kept = not any(a.browser.ended for a in attached[1:LIMIT])

        attached[1].close()
        freed = time.monotonic()
        retry = None
        while time.monotonic() - freed < 3:
            retry = Attached(connections[LIMIT], product="FakeChrome/9.1")
            attached.append(retry)
            if retry.error is None:
                break
            time.sleep(0.1)
        retry_took = time.monotonic() - freed
        print(f"\n[limit] errors of the first {LIMIT}: {errors}; the ninth: {ninth.error}; Desktop {desktop!r}; "
              f"attaching again on the first connection: {again.error or 'attached'}, the old socket closed "
              f"{replaced}, the others kept {others_kept}; the ninth after one went: "
              f"{retry.error or 'attached'} after {retry_took * 1000:.0f} ms")
        assert errors == [], errors
        assert ninth.error is not None and ninth.error[0] == GA_ERROR + "LimitExceeded", ninth.error
        assert not ninth.browser.received("Target.setAutoAttach"), "the refused browser is driven"
        assert desktop == "none+browser"
        assert again.error is None, f"attaching again on the same connection: {again.error}"
        assert replaced, "the earlier attachment of the same connection was not replaced (its socket stays open)"
        assert others_kept, "another connection's browser was let go of"
        assert retry.error is None, f"the ninth still refused after a browser went: {retry.error}"
    finally:
        for a in attached:
            a.close()
    assert daemon.alive()


ADMISSION_SCRIPT = r"""
import json, os, socket, sys, time
sys.path.insert(0, sys.argv[2])
import dbus, dbus.bus
from devtools_pipe_fake import FakePipeBrowser
bus = dbus.bus.BusConnection(sys.argv[1])
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
browser = FakePipeBrowser(ours.fileno(), ours.fileno(), pages=1).start()
try:
    bus.call_blocking(%(name)r, %(path)r, %(iface)r, "AttachBrowser", "h", (dbus.types.UnixFd(theirs),),
                      timeout=10)
    result, message = "attached", ""
except dbus.exceptions.DBusException as error:
    result, message = error.get_dbus_name(), error.get_dbus_message()
theirs.close()
time.sleep(0.3)
print(json.dumps({"uid": os.getuid(), "result": result, "message": message,
                  "received": [r["method"] for r in browser.received()]}), flush=True)
""" % {"name": NAME, "path": PATH, "iface": IFACE}


@needs_root
@pytest.mark.parametrize("clients,admitted", [
    (None, False), ("AllowUsers=root", False), ("AllowUsers=nobody", True),
], ids=["default-own-uid-only", "AllowUsers-root", "AllowUsers-nobody"])
def test_a_caller_not_admitted_as_a_client_cannot_attach_a_browser(env, clients, admitted):
    """A caller running as nobody, with a browser that answers: refused
    (NotAuthorized, the service never talks to its browser) where it could
    not start a session — user mode's default (only the service's own uid)
    and `[Clients] AllowUsers=root` — and attached where `[Clients]
    AllowUsers=nobody` admits it."""
    config = CONFIG + (f"[Clients]\n{clients}\n" if clients else "")
    daemon = start_guidedaccessd(env, config=env.write_config(config))
    script = env.root / "admission.py"
    script.write_text(ADMISSION_SCRIPT)
    os.chmod(script, 0o644)
    fake = readable(FAKE)
    code, out, err = env.run([SYSTEM_PYTHON, str(script), env.address, str(fake.parent)], prefix=NOBODY)
    assert code == 0 and out.strip(), f"the caller failed: {err[-2000:]}"
    result = json.loads(out.strip().splitlines()[-1])
    print(f"\n[admission {clients}] as uid {result['uid']}: {result['result']} {result['message']!r}; its browser "
          f"received {result['received']}")
    assert result["uid"] == 65534
    if admitted:
        assert result["result"] == "attached", result
        assert result["received"][:1] == ["Browser.getVersion"], result
    else:
        assert result["result"] == GA_ERROR + "NotAuthorized", result
        assert result["received"] == [], "the service talked to the browser of a caller it does not admit"
        assert get(env, "Desktop") == "none"
    assert daemon.alive()


def test_attach_browser_leaks_no_descriptors(env):
    """200 AttachBrowser calls with a pipe (each refused), then 50 browsers
    attached and their sockets closed, one after the other: the service's
    open descriptors (/proc/PID/fd) come back to their count before (± 2)
    once the last is dropped."""
    daemon = start(env)
    pid = daemon.process.pid
    connection = connect(env)
    get_timed(connection, "Version")
    time.sleep(0.3)
    before = fd_count(pid)
    refused = {}
    for _ in range(200):
        read_end, write_end = os.pipe()
        try:
            error = attach_browser(connection, read_end)
        finally:
            os.close(read_end)
            os.close(write_end)
        key = error[0] if error else "attached"
        refused[key] = refused.get(key, 0) + 1
    after_refused = fd_count(pid)
    attached = {}
    peak = after_refused
    for n in range(50):
        browser = Attached(connection, product=f"FakeChrome/{n}")
        key = browser.error[0] if browser.error else "attached"
        attached[key] = attached.get(key, 0) + 1
        peak = max(peak, fd_count(pid))
        browser.close()
    dropped = wait_property(env, "Desktop", "none", 5)
    time.sleep(0.5)
    after = fd_count(pid)
    print(f"\n[descriptors] before {before}; after 200 refused calls {after_refused} ({refused}); "
          f"50 attach/close cycles {attached}, peak {peak}; after {after} (Desktop 'none' after "
          f"{dropped and round(dropped * 1000)} ms)")
    assert refused == {DBUS_ERROR + "InvalidArgs": 200}, refused
    assert attached == {"attached": 50}, attached
    assert dropped is not None, "the last browser's attachment was not dropped"
    assert abs(after_refused - before) <= 2, f"{after_refused - before} descriptors more after 200 refused calls"
    assert abs(after - before) <= 2, f"{after - before} descriptors more after 50 attach/close cycles"
    assert daemon.alive()


def test_an_attachment_leaves_an_audit_record_with_the_browser_and_its_launcher(env):
    """AttachBrowser writes a `browserAttached` audit record naming the
    browser (Browser.getVersion's product) and the launcher (the caller's
    unique bus name)."""
    from test_ga_audit import Journal

    path = env.root / "journal.socket"
    journal = Journal(path)
    daemon = start(env, extra_env={"GUIDEDACCESS_JOURNAL_SOCKET": str(path)})
    connection = connect(env)
    browser = Attached(connection, product="FakeChrome/123.0.4567.8")
    try:
        assert browser.error is None, browser.error
        record = journal.until("browserAttached")
    finally:
        browser.close()
    print(f"\n[audit] {record}; the caller is {connection.get_unique_name()}")
    assert record.get("GUIDEDACCESS_BROWSER") == "FakeChrome/123.0.4567.8", record
    assert record.get("GUIDEDACCESS_LAUNCHER") == str(connection.get_unique_name()), record
    assert record.get("MESSAGE_ID") and record.get("SYSLOG_IDENTIFIER") == "guidedaccessd", record
    assert daemon.alive()


# ---------------------------------------------------------------- a message over the limit


def test_a_message_over_a_mebibyte_is_skipped_and_the_pipe_stays_in_step(env, launch):
    """One event of 3 MiB from the browser (over the service's 1 MiB
    limit) then a small one: the service skips the big one and keeps the
    browser (no loss said by the launcher, `Desktop` still `+browser`); a
    session then reaches both pages within a call's cap."""
    daemon = start(env)
    browser = launch(pages=2, FAKE_MODE="huge", FAKE_HUGE_COUNT=1)
    browser.attached()
    time.sleep(0.3)
    offset = log_size(daemon)
    sent_at = time.monotonic()
    browser.signal_fake(signal.SIGUSR1)
    sent = browser.wait(lambda: [r for r in browser.records("mode") if r.get("state") == "sent"], 10)
    time.sleep(0.5)
    rc, err, took = start_session(env, "zoom")
    shown = wait_showed(browser, pages_of(2), ZOOM, since=sent_at)
    lines = log_between(daemon, offset, log_size(daemon))
    lost = browser.said.matching(lambda line: line.startswith(LET_GO))
    print(f"\n[huge] sent {sent and sent[0]}; StartSession rc {rc} in {took * 1000:.0f} ms; look on both pages "
          f"{bool(shown)}; the launcher lost the service: {len(lost)}; the service's log meanwhile: "
          f"{[line[:160] for line in lines]}")
    assert sent, "the fake did not send its big message"
    assert rc == 0, err
    assert shown, "after the big message, the session's look did not reach the pages"
    assert took < CALL_LIMIT, f"StartSession took {took:.2f} s: the pipe is out of step after the big message"
    assert not lost and get(env, "Desktop") == "none+browser", "the big message cost the attachment"
    assert daemon.alive()


# ---------------------------------------------------------------- a hostile browser on the pipe

# test_ga_hostile_peers.py's prober, with a control: every Get of the
# service's SessionActive is followed by the bus's own GetId, so that a slow
# answer of the service can be told from a machine too busy to run anyone
# (the floods below keep cores busy: the fake browser, the launcher).
PROBER = r'''
import json, sys, time
import dbus, dbus.bus
address, seconds, interval = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
bus = dbus.bus.BusConnection(address)
def get():
    bus.call_blocking(%(name)r, %(path)r, "org.freedesktop.DBus.Properties", "Get", "ss",
                      (%(iface)r, "SessionActive"), timeout=5)
def control():
    bus.call_blocking("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetId", None, (),
                      timeout=5)
get()
control()
print("ready", flush=True)
sys.stdin.readline()
samples, controls, errors, times = [], [], [], []
start = next_at = time.monotonic()
while time.monotonic() - start < seconds:
    began = time.monotonic()
    times.append(began)
    try:
        get()
    except dbus.exceptions.DBusException as error:
        errors.append(error.get_dbus_name())
    samples.append(time.monotonic() - began)
    began = time.monotonic()
    control()
    controls.append(time.monotonic() - began)
    next_at += interval
    delay = next_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    else:
        next_at = time.monotonic()
print(json.dumps({"samples": samples, "controls": controls, "errors": errors, "times": times}), flush=True)
''' % {"name": NAME, "path": PATH, "iface": IFACE}


class ControlledProber(Prober):
    def __init__(self, env, seconds, interval=0.05):
        self.seconds = seconds
        self.process = spawn([SYSTEM_PYTHON, "-c", PROBER, env.address, str(seconds), str(interval)], env.env)
        ready, _, _ = select.select([self.process.stdout], [], [], 10)
        line = self.process.stdout.readline() if ready else ""
        assert line.strip() == "ready", f"the prober did not start: {line!r} {self.process.stderr.read()}"

    def result(self):
        """(max latency, samples, errors, control samples, the samples' start times)."""
        try:
            out, err = self.process.communicate(timeout=self.seconds + 20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError("the prober did not finish")
        data = json.loads(out.strip().splitlines()[-1])
        return max(data["samples"]), data["samples"], data["errors"], data["controls"], data["times"]


FLOOD_SECONDS = 5.0
SETTLE_SECONDS = 5.0
RSS_SLACK_KIB = 2 * 1024
RECOVERY_SECONDS = 10.0


class Toggler:
    """ConfigureForSession grayscale on, off, … through busctl every
    `interval` s on a thread (the service works with the pages during the
    flood); each call's (rc, seconds, stderr, when it started)."""

    def __init__(self, env, interval=1.0):
        self.env = env
        self.interval = interval
        self.calls = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        on = True
        while not self.stopping.wait(self.interval):
            started = time.monotonic()
            rc, _, err = self.env.busctl_call("ConfigureForSession", "asb", "1", "grayscale",
                                              "true" if on else "false")
            self.calls.append((rc, time.monotonic() - started, err.strip(), started))
            on = not on

    def stop(self):
        self.stopping.set()
        self.thread.join(20)
        return self.calls


@pytest.mark.parametrize("kind", ["events", "attach", "huge", "garbage", "frozen"])
def test_a_hostile_browser_on_the_pipe_neither_stalls_calls_nor_grows_memory_nor_floods_the_log(env, launch, kind):
    """The kiosk's browser on the pipe turned hostile for 8 s, during a
    session that wants it (invert-colors, and grayscale switched on and off
    every second meanwhile) — `events`: Runtime.consoleAPICalled as fast as
    it can; `attach`: endless Target.attachedToTarget for new pages;
    `huge`: 3 MiB messages, one after the other (over the 1 MiB limit);
    `garbage`: NUL-terminated messages that are no DevTools (not JSON, not
    UTF-8, JSON of the wrong shape) as fast as it can; `frozen`: it reads
    but answers nothing (then answers it all late). Meanwhile another
    client's Properties.Get every 50 ms is each answered within 100 ms, and
    each ConfigureForSession within 2 s (a call waits for pages 1.5 s at
    most); the service's RSS 5 s after the flood stopped is within 2 MiB of
    its RSS before; the browser layer's log lines during the flood are at
    most one a second and a burst of 3; the service lives, and (all but
    `frozen`, whose pages were let go of as hung) within 10 s of the flood's
    end the browser is attached and a feature turned on reaches its pages."""
    daemon = start(env)
    pid = daemon.process.pid
    browser = launch(pages=2, FAKE_MODE=kind)
    browser.attached()
    rc, err, _ = start_session(env, "invert-colors")
    assert rc == 0, err
    assert wait_showed(browser, pages_of(2), INVERT), "the look did not reach the pages before the flood"

    prober = ControlledProber(env, FLOOD_SECONDS)
    time.sleep(0.5)
    idle = status_kib(pid, "VmRSS")
    offset = log_size(daemon)
    flood_started = time.monotonic()
    browser.signal_fake(signal.SIGUSR1)
    prober.go()
    toggler = Toggler(env)
    peak = idle
    while time.monotonic() - flood_started < FLOOD_SECONDS and daemon.alive():
        peak = max(peak, status_kib(pid, "VmRSS"))
        time.sleep(0.1)
    browser.signal_fake(signal.SIGUSR2)
    stopped = time.monotonic()
    flood_seconds = stopped - flood_started
    calls = toggler.stop()
    flood_end = log_size(daemon)
    worst, samples, errors, controls, times = prober.result()
    alive_after_flood = daemon.alive()
    if alive_after_flood:
        time.sleep(max(0.0, stopped + SETTLE_SECONDS - time.monotonic()))
    after = status_kib(pid, "VmRSS") if daemon.alive() else None
    lines = log_between(daemon, offset, flood_end)
    layer = browser_layer_lines(lines)
    allowed = int(flood_seconds) + 3
    flooded = next((r for r in browser.records("mode") if r.get("state") == "stopped"), {})

    recovered = None
    if kind != "frozen" and daemon.alive():
        recovery_started = time.monotonic()
        if wait_property(env, "Desktop", "none+browser", RECOVERY_SECONDS) is not None:
            since = time.monotonic()
            rc, _, _ = env.busctl_call("ConfigureForSession", "asb", "1", "zoom", "true")
            if rc == 0 and wait_showed(browser, pages_of(2), ZOOM, since=since,
                                       timeout=max(0.5, recovery_started + RECOVERY_SECONDS - time.monotonic())):
                recovered = time.monotonic() - recovery_started
    said = browser.said.matching(lambda line: True)
    slow_calls = [(rc, round(took, 2), err) for rc, took, err, _ in calls if took > CALL_LIMIT]
    failed_calls = [err for rc, _, err, _ in calls if rc != 0]
    at = lambda t: round(t - flood_started, 2)  # noqa: E731
    slow_samples = [(at(t), round(s * 1000)) for t, s in zip(times, samples) if s > LATENCY_BOUND]

    print(f"\n[pipe {kind}] {flood_seconds:.1f} s; the fake sent {flooded.get('sent') or '-'}, flood pages' "
          f"commands {flooded.get('commands') or '-'}; Get samples {len(samples)}, max {worst * 1000:.1f} ms, "
          f"slowest {[round(s * 1000, 1) for s in sorted(samples)[-5:]]} ms, errors {len(errors)} (the bus's own "
          f"GetId meanwhile: max {max(controls) * 1000:.1f} ms); ConfigureForSession {len(calls)} calls, slowest "
          f"{max((c[1] for c in calls), default=0) * 1000:.0f} ms, failed {len(failed_calls)} "
          f"{sorted(set(e[:90] for e in failed_calls))}; RSS idle {idle} KiB, peak (sampled) {peak} KiB, "
          f"{SETTLE_SECONDS:.0f} s after {after} KiB; log lines in the flood: {len(layer)} of the browser layer "
          f"(allowed {allowed}), {len(lines)} in all; back and showing the look after "
          f"{recovered if recovered is None else round(recovered, 2)} s")
    print(f"  timeline (s after the flood began): Get over {LATENCY_BOUND * 1000:.0f} ms {slow_samples}; "
          f"ConfigureForSession calls {[(at(c[3]), c[0]) for c in calls]}; the launcher said "
          f"{[(at(t), line.split(': ', 1)[-1][:70]) for t, line in said if t >= flood_started]}")
    for line in layer[:allowed + 4]:
        print("  log: " + line[:200])
    assert alive_after_flood and daemon.alive(), "guidedaccessd died during the flood:\n" + daemon.log()[-3000:]
    problems = []
    if kind != "frozen" and not flooded.get("sent"):
        problems.append("the fake sent no flood")
    if errors or worst > LATENCY_BOUND:
        problems.append(f"Properties.Get took up to {worst * 1000:.0f} ms (bound {LATENCY_BOUND * 1000:.0f} ms; "
                        f"{len(slow_samples)} of {len(samples)} over, at {slow_samples[:8]}; errors {errors[:3]}; "
                        f"the bus's own GetId meanwhile: max {max(controls) * 1000:.1f} ms)")
    if slow_calls:
        problems.append(f"ConfigureForSession took over {CALL_LIMIT} s: {slow_calls[:4]}")
    if after - idle > RSS_SLACK_KIB:
        problems.append(f"RSS {after} KiB {SETTLE_SECONDS:.0f} s after the flood, {(after - idle) / 1024:.1f} MiB "
                        f"over its {idle} KiB before (bound {RSS_SLACK_KIB // 1024} MiB; peak sampled {peak} KiB)")
    if len(layer) > allowed:
        problems.append(f"{len(layer)} browser-layer log lines in {flood_seconds:.1f} s of flood (bound {allowed}), "
                        f"e.g. {layer[:4]}")
    if kind != "frozen" and recovered is None:
        problems.append(f"{RECOVERY_SECONDS:.0f} s after the flood the browser is not attached and showing a new "
                        f"feature (Desktop {get(env, 'Desktop')!r}; the launcher said {said[-4:]})")
    value, _ = get_timed(connect(env), "SessionActive", timeout=5)
    if value is not True and value != 1:
        problems.append(f"SessionActive after the flood: {value}")
    assert not problems, "\n".join(problems)


def test_attachments_that_fail_at_once_do_not_flood_the_log(env):
    """A client (admitted: the service's own uid) calls AttachBrowser 100
    times, each with a socket whose other end is already closed (a launcher
    whose browser is gone, or one that hammers the service): each call gets
    InvalidArgs at once, and the browser layer's log lines about them are
    limited like its others (a burst of 3, then one every 2 s; here: at
    most one a second and 3), not one or two per call."""
    daemon = start(env)
    connection = connect(env)
    get_timed(connection, "Version")
    offset = log_size(daemon)
    results = {}
    started = time.monotonic()
    for _ in range(100):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.close()
        try:
            error = attach_browser(connection, theirs)
        finally:
            theirs.close()
        key = error[0] if error else "attached"
        results[key] = results.get(key, 0) + 1
    took = time.monotonic() - started
    time.sleep(0.3)
    lines = log_between(daemon, offset, log_size(daemon))
    layer = browser_layer_lines(lines)
    allowed = 5 + int(took / 2)  # PeerLog: a burst of 5, then one line every 2 s
    print(f"\n[failed attachments] 100 calls in {took * 1000:.0f} ms: {results}; log lines: {len(layer)} of the "
          f"browser layer (allowed {allowed}), {len(lines)} in all, e.g. {[line[:150] for line in layer[:3]]}")
    assert results == {DBUS_ERROR + "InvalidArgs": 100}, results
    assert len(layer) <= allowed, (
        f"{len(layer)} browser-layer log lines for 100 failed AttachBrowser calls in {took:.2f} s (bound {allowed}): "
        f"{layer[:4]}")
    assert daemon.alive()
