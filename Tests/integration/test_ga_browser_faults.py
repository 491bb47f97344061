"""guidedaccessd's browser layer against a browser that misbehaves, which
real Chromium cannot be made to do (its acceptance tests are in
Tests/browser/): devtools_fake.py stands for the kiosk browser's DevTools
endpoint. Contract: docs/dbus-api.md, "Browser layer"; the limits
the layer states (2 s to open, 3 s per command, 1.5 s for which a D-Bus call
waits for pages, reconnecting 0.1 s doubling to 5 s while a session needs the
browser, and no timer while none does).

Every test runs on a bare bus (Desktop=none), so whatever is in
SupportedFeatures beyond nothing is the browser layer's; the client is
busctl."""

import glob
import json
import re
import shlex
import subprocess
import time
import uuid

import pytest

from conftest import start_guidedaccessd
from devtools_fake import frame, text
from gadaemon import GA_ERROR, IFACE, NAME, PATH, Recorder, SupportChanged, busctl_options, pump

BROWSER_FEATURES = ["grayscale", "high-contrast", "invert-colors", "large-text", "reduce-motion", "zoom"]
PAGE_COMMANDS = {"Page.enable", "Emulation.setEmulatedMedia", "Emulation.setEmulatedVisionDeficiency",
                 "Page.addScriptToEvaluateOnNewDocument", "Runtime.evaluate"}
CAP = 1.5  # how long a D-Bus call waits for pages
CALL_LIMIT = 2.0  # the cap, and room for busctl and the rest of the call


# ---------------------------------------------------------------- helpers


@pytest.fixture
def env(ga_env):
    ga_env.stand_for_no_desktop()
    return ga_env


def start(env, endpoint):
    return start_guidedaccessd(env, config=env.write_config(endpoint.config()))


def get(env, name):
    """A property through busctl, as a Python value (s → str, b → bool,
    as → list)."""
    rc, out, err = env.busctl("get-property", NAME, PATH, IFACE, name)
    assert rc == 0, f"busctl get-property {name}: {err.strip()}"
    words = shlex.split(out)
    if words[0] == "b":
        return words[1] == "true"
    return words[1] if words[0] == "s" else words[2:]


def timed(function, *args, **kwargs):
    started = time.monotonic()
    result = function(*args, **kwargs)
    return result, time.monotonic() - started


def start_session(env, *features):
    """StartSession through busctl: (rc, stderr, seconds it took)."""
    (rc, _, err), took = timed(env.busctl_call, "StartSession", *busctl_options(features=list(features)))
    return rc, err.strip(), took


def busctl_in_background(env, member, *args):
    return subprocess.Popen(
        ["busctl", f"--address={env.address}", "--", "call", NAME, PATH, IFACE, member, *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env.env)


def version_promptly(env):
    """Properties.Get of Version answers within 1.5 s (a busctl started for
    it, on a machine that may be loaded; what it catches waits 2 s or more)."""
    value, took = timed(get, env, "Version")
    assert value, "no Version"
    assert took < 1.5, f"Get Version took {took:.2f} s"


def auto_attach(endpoint, value, since=0.0, timeout=5.0):
    """Waits for Target.setAutoAttach {autoAttach: value} to the browser
    target, at or after `since`; the message, or None."""
    found = []

    def seen():
        found[:] = [m for m in endpoint.received("Target.setAutoAttach", since=since, browser_only=True)
                    if m.params.get("autoAttach") is value]
        return bool(found)

    endpoint.wait(seen, timeout)
    return found[0] if found else None


def cleaned_up(endpoint, daemon):
    """The start-up clean-up of pages (a service before may have left its
    style there) is over: auto-attach was turned off again."""
    if not auto_attach(endpoint, False):
        layer = "\n".join(line for line in daemon.log().splitlines() if "[BrowserLayer]" in line)
        raise AssertionError(f"no start-up clean-up of the pages:\n{endpoint.summary()}\nthe service's log:\n{layer}")


def log_line(daemon, pattern, timeout):
    """The first line of the daemon's log matching `pattern` (a regex),
    waiting up to `timeout` s; None if none."""
    deadline = time.monotonic() + timeout
    while True:
        for line in daemon.log().splitlines():
            if re.search(pattern, line):
                return line
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def showed(endpoint, target, css, conn=None, since=0.0):
    """Whether page `target` got the look (its style sheet in a document
    script and in the current document)."""
    scripts = endpoint.received("Page.addScriptToEvaluateOnNewDocument", target=target, conn=conn, since=since)
    now = endpoint.received("Runtime.evaluate", target=target, conn=conn, since=since)
    return (any(css in m.params.get("source", "") for m in scripts)
            and any(css in m.params.get("expression", "") for m in now))


def wait_showed(endpoint, targets, css, conn=None, since=0.0, timeout=3.0):
    return endpoint.wait(lambda: all(showed(endpoint, t, css, conn, since) for t in targets), timeout)


def wakeups(pid):
    """Context switches of every thread of `pid`, by thread."""
    counts = {}
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as status:
                counts[path] = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        except OSError:
            pass
    return counts


def crash(daemon):
    """What a crashed daemon's log says of it: the fatal error and the
    frames in our sources."""
    lines = daemon.log().splitlines()
    return "\n".join(line for line in lines
                     if re.search(r"Fatal error|crashed|\[BrowserLayer\]|Sources/BrowserLayer/", line))


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def tcp_peers(address_hex_port):
    """Lines of /proc/net/tcp whose remote address is this (e.g. 10.0.0.1:9222
    is '0100000A:2406')."""
    with open("/proc/net/tcp") as table:
        return [line for line in table if line.split()[2:3] == [address_hex_port]]


# ---------------------------------------------------------------- (b) a page that never answers


def test_a_page_that_never_answers_holds_the_call_no_longer_than_the_cap_and_is_left_out(env, fake):
    browser = fake(pages=3)
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    browser.hung_targets.add("PAGE2")
    since = time.monotonic()
    call = busctl_in_background(env, "StartSession", *busctl_options(features=["invert-colors"]))
    time.sleep(0.3)
    version_promptly(env)  # while StartSession waits for the pages
    _, err = call.communicate(timeout=15)
    took = time.monotonic() - since
    assert call.returncode == 0, err

    # The others got the look; the hung page got its commands once each
    # (sent back to back, one round trip per change), none again.
    assert wait_showed(browser, ["PAGE1", "PAGE3"], "filter: invert(1)", since=since), browser.summary()
    for page in ("PAGE1", "PAGE3"):
        assert {m.method for m in browser.received(target=page, since=since)} == PAGE_COMMANDS, page
    hung = [m.method for m in browser.received(target="PAGE2", since=since)]
    assert hung[0] == "Page.enable" and set(hung) <= PAGE_COMMANDS and len(hung) == len(set(hung)), hung
    hung_session = browser.received(target="PAGE2", since=since)[0].session

    # Left out after the 3 s command timeout, named in the log, and let go.
    line = log_line(daemon, r"page PAGE2 left out", 4.0)
    assert line is not None, f"the hung page is not logged as left out:\n{daemon.log()[-3000:]}"
    assert "Page.enable got no answer within 3" in line, line
    assert time.monotonic() - since >= 2.9, "left out before its command's 3 s timeout"
    detach = browser.wait_for_message("Target.detachFromTarget", 1.0, since=since)
    assert detach is not None and detach.params == {"sessionId": hung_session}, browser.summary()
    assert daemon.alive()
    assert get(env, "Desktop") == "none+browser", "one page that hangs is not the browser gone"
    assert get(env, "SessionActive") is True

    # The session's end reaches the pages that answer, promptly.
    ended = time.monotonic()
    (rc, _, err), end_took = timed(env.busctl_call, "EndSession")
    assert rc == 0, err
    assert end_took < 2.0, f"EndSession took {end_took:.2f} s (the hung page's command timeout is 3 s)"
    for page in ("PAGE1", "PAGE3"):
        assert browser.wait_for_message("Page.removeScriptToEvaluateOnNewDocument", 2.0, target=page, since=ended)
    assert browser.received(target="PAGE2", since=ended) == []

    assert took < CALL_LIMIT, (
        f"StartSession took {took:.2f} s with one page that never answers: a call waits for pages at most "
        f"{CAP} s (the 3 s command timeout held it instead)")


def test_a_browser_found_by_the_call_holds_it_no_longer_than_the_cap(env, fake):
    """The browser comes up after the service (nothing listened at start);
    StartSession finds it, and one of its pages never answers."""
    browser = fake(pages=2, listen=False)
    browser.hung_targets.add("PAGE2")
    daemon = start(env, browser)
    assert log_line(daemon, r"no browser at .*Connection refused", 3.0), daemon.log()[-2000:]
    browser.listen()
    rc, err, took = start_session(env, "invert-colors")
    assert rc == 0, err
    assert wait_showed(browser, ["PAGE1"], "filter: invert(1)"), browser.summary()
    assert daemon.alive()
    assert took < CALL_LIMIT, (
        f"StartSession took {took:.2f} s: it waited for the pages twice, once for the clean-up of "
        f"what an earlier service may have left (on connecting) and once for the session's look")


def test_a_browser_that_stops_answering_holds_the_call_no_longer_than_the_cap(env, fake):
    """Connected, then the browser answers nothing more (stopped, or its
    DevTools thread hung): the browser target's own commands time out."""
    browser = fake(pages=2)
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    browser.frozen = True
    since = time.monotonic()
    call = busctl_in_background(env, "StartSession", *busctl_options(features=["invert-colors"]))
    time.sleep(0.3)
    version_promptly(env)
    _, err = call.communicate(timeout=15)
    took = time.monotonic() - since
    assert call.returncode == 0, err
    assert daemon.alive()
    assert auto_attach(browser, True, since=since, timeout=0), browser.summary()
    assert took < CALL_LIMIT, (
        f"StartSession took {took:.2f} s with a browser that stopped answering: Target.setAutoAttach's 3 s "
        f"timeout held the call, beyond the {CAP} s a call waits for the browser's pages")


# ---------------------------------------------------------------- (c) garbage after the handshake

GARBAGE = {
    "binary-frame": (frame(0x2, b"\x00\x01\x02"), "a binary message"),
    "invalid-json": (frame(0x1, b'{"id": 1, "result": '), "invalid JSON"),
    "masked-frame": (frame(0x1, b'{"method": "Page.loadEventFired"}', mask=b"\x11\x22\x33\x44"), "a masked frame"),
    "reserved-bits": (frame(0x1, b'{"method": "Page.loadEventFired"}', rsv=0x40), "reserved bits"),
    "huge-length": (frame(0x1, b"", length=(1 << 63) + 5), "a frame length of 9223372036854775813"),
    "unknown-opcode": (frame(0x3, b"x"), "unknown opcode 3"),
    "long-control-frame": (frame(0x9, b"p" * 126), "control frame"),
    "continuation-first": (frame(0x0, b"{}"), "a continuation frame with no message begun"),
    "not-an-object": (frame(0x1, b"[1, 2, 3]"), "not a JSON object"),
    "id-not-an-integer": (frame(0x1, b'{"id": "7", "result": {}}'), "an id that is not an integer"),
    "neither-id-nor-method": (frame(0x1, b'{"result": {}}'), "neither an id nor a method"),
}


@pytest.mark.parametrize("kind", GARBAGE)
def test_garbage_after_the_handshake_disconnects_and_a_session_reconnects(env, fake, kind):
    raw, named = GARBAGE[kind]
    browser = fake(pages=2)
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    rec = Recorder(env)
    rec.clear()
    assert get(env, "Desktop") == "none+browser"

    # No session: logged, the connection closed, the browser no longer claimed.
    browser.inject(raw)
    gone = SupportChanged("none", [])
    assert pump(lambda: gone in rec.events, 3), f"no PropertiesChanged for the browser gone: {rec.events}"
    line = log_line(daemon, "lost the browser at " + re.escape(browser.endpoint), 1.0)
    assert line is not None and named in line, f"{named!r} not in the log line {line!r}"
    assert browser.wait(lambda: not browser.live_websockets(), 2), "the service kept the connection open"
    assert get(env, "SupportedFeatures") == []
    version_promptly(env)
    assert daemon.alive()

    # A session finds the browser again; garbage mid-session: it reconnects by itself.
    rc, err, _ = start_session(env, "invert-colors")
    assert rc == 0, err
    second = browser.websockets()[-1].number
    assert second > 1
    assert wait_showed(browser, ["PAGE1", "PAGE2"], "invert(1)", conn=second), browser.summary()
    browser.inject(raw)
    assert browser.wait(lambda: browser.websockets()[-1].number > second, 3), (
        f"no reconnect after garbage mid-session:\n{browser.summary()}")
    third = browser.websockets()[-1].number
    assert wait_showed(browser, ["PAGE1", "PAGE2"], "invert(1)", conn=third), (
        f"the look was not shown again after reconnecting:\n{browser.summary()}")
    back = SupportChanged("none+browser", BROWSER_FEATURES)
    assert pump(lambda: rec.events.count(back) >= 2, 2), rec.events
    assert daemon.alive()


def test_a_message_over_the_limit_is_skipped_and_the_stream_stays_in_step(env, fake):
    browser = fake(pages=1)
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    big = json.dumps({"method": "Page.frameNavigated", "params": {"url": "data:," + "y" * 3_000_000}}).encode()
    whole = frame(0x1, big)
    for offset in range(0, len(whole), 333_333):  # in odd pieces
        browser.inject(whole[offset:offset + 333_333])
        time.sleep(0.005)
    # Fragmented, with a ping between two fragments, and a small event after.
    parts = [big[i:i + 700_000] for i in range(0, len(big), 700_000)]
    fragmented = b"".join(
        frame(0x1 if i == 0 else 0x0, part, fin=i == len(parts) - 1) + (frame(0x9, b"hi") if i == 1 else b"")
        for i, part in enumerate(parts))
    browser.inject(fragmented + text({"method": "Page.loadEventFired", "params": {"timestamp": 1}}))
    assert browser.wait(lambda: browser.pongs == [b"hi"], 3), f"pongs: {browser.pongs}"
    skipped = lambda: [line for line in daemon.log().splitlines()  # noqa: E731
                       if f"skipped a DevTools message of {len(big)} bytes (limit 1048576)" in line]
    deadline = time.monotonic() + 3
    while len(skipped()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(skipped()) == 2, daemon.log()[-2000:]
    rc, err, _ = start_session(env, "zoom")
    assert rc == 0, err
    assert wait_showed(browser, ["PAGE1"], "zoom: 2", conn=2), browser.summary()
    assert [c.kind for c in browser.websockets()] == ["websocket"], "the connection was lost"
    assert daemon.alive()


def test_a_long_mixed_stream_in_random_pieces_stays_in_step(env, fake):
    """Events small and large, messages over the limit (one fragmented, a
    ping between its fragments), pings, all cut at random places: pings are
    answered (the latest one each time the service writes: RFC 6455 5.5.3
    lets an endpoint answer only the latest, and one pending pong is all the
    service keeps), every message over the limit is skipped whole (its log
    lines rate-limited), and the connection stays."""
    import random

    rng = random.Random(6455)
    browser = fake(pages=1)
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    stream, pings, big = [], [], []
    for i in range(300):
        roll = rng.random()
        if roll < 0.6:
            stream.append(text({"method": "Page.lifecycleEvent", "params": {"n": i, "x": "s" * rng.randint(0, 2000)}}))
        elif roll < 0.8:
            stream.append(text({"method": "Page.frameNavigated", "params": {"x": "m" * rng.randint(30_000, 70_000)}}))
        elif roll < 0.98:
            pings.append(f"ping {i}".encode())
            stream.append(frame(0x9, pings[-1]))
        else:
            size = rng.randint(1_100_000, 2_000_000)
            body = json.dumps({"method": "Page.frameNavigated", "params": {"x": "L" * size}})
            big.append(len(body))
            if len(big) % 2:
                stream.append(frame(0x1, body))
            else:
                cut = rng.randint(10, len(body) - 10)
                pings.append(f"between {i}".encode())
                stream += [frame(0x1, body[:cut], fin=False), frame(0x9, pings[-1]), frame(0x0, body[cut:])]
    data = b"".join(stream)
    offset = 0
    while offset < len(data):
        size = rng.choice([1, 2, 7, 125, 4096, 16_383, 16_385, 65_537, 100_000])
        browser.inject(data[offset:offset + size])
        offset += size
        if rng.random() < 0.05:
            time.sleep(0.001)
    browser.inject(frame(0x9, b"end"))
    assert browser.wait(lambda: b"end" in browser.pongs, 20), f"{len(browser.pongs)} pongs of {len(pings) + 1}"
    # In order, none made up, none twice; the last is the last ping's.
    answered = browser.pongs
    assert answered[-1] == b"end" and len(set(answered)) == len(answered), answered
    order = {p: i for i, p in enumerate(pings + [b"end"])}
    assert all(p in order for p in answered) and [order[p] for p in answered] == sorted(order[p] for p in answered)
    skipped = re.findall(r"skipped a DevTools message of (\d+) bytes", daemon.log())
    assert skipped and set(map(int, skipped)) <= set(big), (skipped, big)
    assert len(browser.websockets()) == 1 and browser.live_websockets(), "the connection was lost"
    rc, err, _ = start_session(env, "zoom")
    assert rc == 0, err
    assert wait_showed(browser, ["PAGE1"], "zoom: 2", conn=2), browser.summary()


def test_a_stream_of_events_does_not_grow_the_service_memory(env, fake):
    """20 MB of events (a busy page) in frames whose ends rarely meet the
    end of a read: what the decoder has consumed must not pile up."""
    browser = fake(pages=1)
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    before = peak_rss_kib(daemon.process.pid)
    event = text({"method": "Page.lifecycleEvent", "params": {"name": "x" * (50_001 - 80)}})
    burst = event * (20_000_000 // len(event))
    browser.inject(burst + frame(0x9, b"done"))
    assert browser.wait(lambda: browser.pongs == [b"done"], 15), "the service did not get through the events"
    grown = (peak_rss_kib(daemon.process.pid) - before) // 1024
    assert daemon.alive()
    assert get(env, "Desktop") == "none+browser"
    assert grown < 12, (
        f"the service's peak memory grew by {grown} MiB while it read {len(burst) // 2**20} MiB of events of "
        f"{len(event)} bytes each (the decoder keeps what it has consumed until a read ends at a frame's end)")


# ---------------------------------------------------------------- (d) garbage instead of HTTP


def _version(body, status="200 OK", length=None):
    body = body if isinstance(body, bytes) else body.encode()
    length = len(body) if length is None else length
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode() + body


def _version_faults(port):
    good = json.dumps({"Browser": "FakeChrome/1.0",
                       "webSocketDebuggerUrl": f"ws://127.0.0.1:{port}/devtools/browser/{uuid.uuid4()}"})
    bad_accept = (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
    return {
        # /json/version: (attribute, value), what the log line must say (a regex)
        "not-json": (("version_answer", _version("not json!")), "/json/version: invalid JSON"),
        "not-http": (("version_answer", b"SSH-2.0-OpenSSH_9.2p1\r\n\r\n"), "/json/version: not an HTTP response"),
        "status-404": (("version_answer", _version("", "404 Not Found")), "/json/version: HTTP status 404"),
        "no-websocket-url": (("version_answer", _version('{"Browser": "x"}')), "no webSocketDebuggerUrl"),
        "over-64-kib": (("version_answer", b"HTTP/1.1 200 OK\r\n\r\n" + (" " * 70_000 + good).encode()),
                        "over 64 KiB"),
        "content-length-over-64-kib": (("version_answer", _version(" " * 70_000 + good)),
                                       "Content-Length|over 64 KiB"),
        "content-length-negative": (("version_answer", _version(good, length=-1)), "Content-Length"),
        "content-length-overflow": (("version_answer", _version(good, length=2**63 - 1)), "Content-Length"),
        "foreign-host": (("ws_url", "ws://10.0.0.1:9222/devtools/browser/x"),
                         "the browser's WebSocket 'ws://10.0.0.1:9222/devtools/browser/x' is not "
                         f"ws://127.0.0.1:{port}/devtools/browser/ID"),
        "other-port": (("ws_url", f"ws://127.0.0.1:{port + 1}/devtools/browser/{uuid.uuid4()}"), "is not ws://"),
        "other-path": (("ws_url", f"ws://127.0.0.1:{port}/devtools/browser/../../json/new?evil"), "is not ws://"),
        "secure-websocket": (("ws_url", f"wss://127.0.0.1:{port}/devtools/browser/{uuid.uuid4()}"), "is not ws://"),
        # the WebSocket handshake
        "handshake-wrong-accept": (("handshake_answer", bad_accept), "a wrong Sec-WebSocket-Accept"),
        "handshake-not-101": (("handshake_answer", _version(good)), "the WebSocket handshake: HTTP status 200"),
    }


@pytest.mark.parametrize("kind", list(_version_faults(1)))
def test_garbage_instead_of_http_is_not_connected_and_named(env, fake, kind):
    browser = fake(pages=2)
    (attribute, value), named = _version_faults(browser.port)[kind]
    setattr(browser, attribute, value)
    daemon = start(env, browser)
    line = log_line(daemon, "no browser at " + re.escape(browser.endpoint), 3.0)
    assert daemon.alive(), "guidedaccessd died:\n" + crash(daemon)
    assert line is not None, f"no log line naming the problem:\n{daemon.log()[-2000:]}"
    assert re.search(named, line), f"{named!r} not in {line!r}"
    version_promptly(env)
    assert get(env, "SupportedFeatures") == []
    assert get(env, "Desktop") == "none"
    assert browser.received() == [], "commands reached a browser that was not accepted"
    if attribute != "handshake_answer":
        assert "websocket" not in browser.kinds(), browser.kinds()
    assert browser.wait(lambda: all(c.closed is not None for c in browser.connections), 2), (
        f"the service left a connection open: {browser.connections}")
    if kind == "foreign-host":
        assert tcp_peers("0100000A:2406") == [], "a connection to 10.0.0.1:9222"


# ---------------------------------------------------------------- (e) accepts, never answers


@pytest.mark.parametrize("silent", ["silent", "silent_upgrade"])
def test_a_browser_that_accepts_but_never_answers_stalls_neither_start_up_nor_calls(
        env, fake, errmon_factory, silent):
    browser = fake(pages=2)
    setattr(browser, silent, True)
    daemon, startup = timed(start, env, browser)
    assert startup < 1.9, f"start-up took {startup:.2f} s: it waited for the browser (2 s)"
    version_promptly(env)
    monitor = errmon_factory()
    (name, message), took = timed(
        monitor.busctl_error, daemon, "StartSession", *busctl_options(features=["invert-colors"]))
    assert name == GA_ERROR + "UnsupportedFeature"
    assert message == (
        f"invert-colors: the desktop 'none' does not act on it (gnome-shell and x11 do), and no browser is attached (guidedaccessctl browser) or connected at {browser.endpoint}")
    assert took < 3.5, f"StartSession took {took:.2f} s; the open timeout is 2 s"
    what = "no answer" if silent == "silent" else "no WebSocket"
    assert log_line(daemon, f"{what} from {re.escape(browser.endpoint)} within 2", 1.0), daemon.log()[-2000:]
    assert browser.wait(lambda: all(c.closed is not None for c in browser.connections), 1.0), (
        f"the service left a connection open after its timeout: {browser.connections}")
    assert get(env, "SessionActive") is False
    assert daemon.alive()


# ---------------------------------------------------------------- idle


def test_idle_there_is_no_devtools_traffic_and_the_end_lets_go_of_the_pages(env, fake):
    browser = fake(pages=2)
    browser.extra_targets = [("WORKER1", "service_worker")]
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    time.sleep(0.2)
    received, connections = len(browser.received()), len(browser.connections)
    before = wakeups(daemon.process.pid)
    time.sleep(3.0)
    after = wakeups(daemon.process.pid)
    assert browser.received()[received:] == [], "DevTools traffic from an idle service"
    assert len(browser.connections) == connections and browser.live_websockets(), browser.connections

    since = time.monotonic()
    rc, err, _ = start_session(env, "zoom")
    assert rc == 0, err
    assert wait_showed(browser, ["PAGE1", "PAGE2"], "zoom: 2", since=since), browser.summary()
    # A worker is not a page: let go of, nothing of the look sent there.
    worker = [m for m in browser.received("Target.detachFromTarget", since=since)
              if m.params["sessionId"].startswith("WORKER1-")]
    assert worker, f"the service worker was not let go of:\n{browser.summary()}"
    assert browser.received(target="WORKER1") == []

    ended = time.monotonic()
    rc, _, err = env.busctl_call("EndSession")
    assert rc == 0, err
    let_go = auto_attach(browser, False, since=ended, timeout=3.0)
    assert let_go is not None, f"auto-attach not turned off after EndSession:\n{browser.summary()}"
    for page in ("PAGE1", "PAGE2"):
        removed = browser.received("Page.removeScriptToEvaluateOnNewDocument", target=page, since=ended)
        assert removed and removed[0].time < let_go.time, f"{page}: its script not removed before letting go"
    time.sleep(1.5)
    assert browser.received(since=let_go.time + 1e-6) == [], "DevTools traffic after letting go of the pages"

    woken = sum(count - before.get(thread, 0) for thread, count in after.items())
    assert woken <= 1, (
        f"the idle service's threads were switched to {woken} times in 3 s ({len(after)} threads; "
        f"without a browser layer: 1 thread, none): something wakes it while no session needs the browser")


# ---------------------------------------------------------------- (f) the connection closed


def test_a_connection_closed_mid_session_reconnects_with_back_off_and_shows_the_look_again(env, fake):
    browser = fake(pages=2)
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    rc, err, _ = start_session(env, "invert-colors")
    assert rc == 0, err

    # Closed: back after the first back-off, 0.1 s, and the look again.
    count = len(browser.connections)
    dropped = time.monotonic()
    browser.drop()
    assert browser.wait(lambda: len(browser.websockets()) >= 2, 2), browser.summary()
    delay = browser.connections[count].opened - dropped
    assert 0.08 <= delay <= 0.4, f"the first reconnect came {delay:.3f} s after the close, not ≈0.1 s"
    assert wait_showed(browser, ["PAGE1", "PAGE2"], "invert(1)", conn=browser.websockets()[-1].number), (
        browser.summary())
    assert log_line(daemon, r"lost the browser at .*: the browser closed the connection", 0)

    # Closed again after holding less than 10 s, and then refused (HTTP 500)
    # a while: the back-off did not start again (a peer that flaps is
    # retried ever more slowly), it goes on doubling from 0.2 s.
    browser.version_answer = _version("", "500 Internal Server Error")
    count = len(browser.connections)
    dropped = time.monotonic()
    browser.drop()
    assert browser.wait(lambda: len(browser.connections) >= count + 4, 4), browser.summary()
    browser.version_answer = None
    attempts = [c.opened - dropped for c in browser.connections[count:count + 4]]
    gaps = [b - a for a, b in zip([0.0] + attempts, attempts)]
    for gap, expected in zip(gaps, [0.2, 0.4, 0.8, 1.6]):
        assert expected * 0.8 <= gap <= expected + 0.25, f"retries {gaps}: not 0.2 s doubling"
    # The fifth, 3.2 s after the fourth, finds the browser again.
    assert browser.wait(lambda: len(browser.websockets()) >= 3, 4.5), browser.summary()
    assert wait_showed(browser, ["PAGE1", "PAGE2"], "invert(1)", conn=browser.websockets()[-1].number)
    refused = [line for line in daemon.log().splitlines() if "HTTP status 500" in line]
    assert len(refused) == 1, f"each retry logged again: {refused}"

    # Once the session is over, a close is not followed by any attempt.
    rc, _, err = env.busctl_call("EndSession")
    assert rc == 0, err
    assert auto_attach(browser, False, since=dropped)
    count = len(browser.connections)
    browser.drop()
    time.sleep(0.6)
    assert len(browser.connections) == count, "reconnected with no session"
    assert daemon.alive()


def test_with_no_session_a_lost_browser_is_looked_for_only_when_a_client_asks(env, fake):
    browser = fake(pages=2)
    daemon = start(env, browser)
    cleaned_up(browser, daemon)
    time.sleep(1.0)  # past the one look a second, counted from the start-up's
    rec = Recorder(env)
    rec.clear()
    count = len(browser.connections)
    browser.drop()
    assert log_line(daemon, "lost the browser", 2.0)
    time.sleep(2.0)
    assert len(browser.connections) == count, (
        f"the service looked for the browser by itself, with no session and no client asking:\n{browser.summary()}")

    assert get(env, "SupportedFeatures") == []  # answered at once; looks for the browser
    assert browser.wait(lambda: len(browser.websockets()) >= 2, 1.0), (
        "reading SupportedFeatures did not make the service look for the browser again")
    back = SupportChanged("none+browser", BROWSER_FEATURES)
    assert pump(lambda: back in rec.events, 2), rec.events
    # Found again: what the lost connection may have left is cleaned up.
    assert auto_attach(browser, False, since=browser.websockets()[-1].opened)
    assert daemon.alive()


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("value", [
    "http://10.0.0.1:9222", "https://127.0.0.1:9222", "ws://127.0.0.1:9222", "http://127.0.0.1",
    "http://127.0.0.1:0", "http://127.0.0.1:99999", "http://127.0.0.1:9222/json", "http://user@127.0.0.1:9222",
    "http://example.com:9222", "http://127.1:9222", "http://[::ffff:10.0.0.1]:9222", "http://0.0.0.0:9222",
])
def test_a_devtools_endpoint_not_loopback_or_malformed_fails_start_up_naming_it(env, value):
    config = env.write_config(f"[Service]\nDesktop=none\n[Browser]\nDevToolsEndpoint={value}\n", name="browser.conf")
    code, log = env.daemon(config=config).expect_start_failure()
    assert code != 0
    line = next((line for line in log.splitlines() if "DevToolsEndpoint" in line), "")
    for word in (str(config), "[Browser]", "DevToolsEndpoint", value):
        assert word in line, f"{word!r} not named in the log:\n{log}"


def test_an_empty_devtools_endpoint_is_no_browser_layer(env, fake):
    config = env.write_config("[Service]\nDesktop=none\n[Browser]\nDevToolsEndpoint=\n")
    daemon = start_guidedaccessd(env, config=config)
    assert get(env, "Desktop") == "none"
    assert get(env, "SupportedFeatures") == []
    assert "BrowserLayer" not in daemon.log()
    assert "no browser is connected" not in daemon.log()


def test_localhost_is_taken_as_127_0_0_1(env, fake):
    browser = fake(pages=1)
    config = env.write_config(
        f"[Service]\nDesktop=none\n[Browser]\nDevToolsEndpoint=http://localhost:{browser.port}/\n")
    daemon = start_guidedaccessd(env, config=config)
    assert log_line(daemon, f"connected to FakeChrome/1.0 at http://127.0.0.1:{browser.port}", 3.0), (
        daemon.log()[-2000:])
    assert get(env, "Desktop") == "none+browser"


def test_on_gnome_shell_the_shell_keeps_its_features_and_the_pages_get_nothing(env, fake):
    """gnome-shell draws zoom and the colour filters over the whole screen:
    the browser layer, connected all the same, leaves them to it — nothing
    goes to the pages during a session that has them."""
    endpoint = fake(pages=2)
    daemon = start_guidedaccessd(
        env, config=env.write_config(endpoint.config(service="[Service]\nDesktop=gnome-shell\n")))
    cleaned_up(endpoint, daemon)
    assert get(env, "Desktop") == "gnome-shell+browser"
    since = time.monotonic()
    rc, err, _ = start_session(env, "invert-colors", "zoom", "large-text")
    assert rc == 0, err
    time.sleep(0.5)
    assert endpoint.received(since=since) == [], endpoint.summary()
    assert env.busctl_call("EndSession")[0] == 0
