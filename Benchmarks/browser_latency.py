"""The browser layer, measured against real Chromium (Debian's, headless):

- ConfigureForSession(['invert-colors'], on/off) reply → the change visible
  in a page screenshot taken through a DevTools connection of the
  benchmark's own (a 4×4 clip of a white area, polled back to back), and
  the call itself (it returns once the pages have the change);
- the reference, in the same run and page: the benchmark's own DevTools
  connection putting the same style sheet on the page itself → visible
  (what rendering and a screenshot cost, with no service in between);
- idle: with the layer connected and no session, context switches of every
  guidedaccessd thread and its read/write system calls (/proc/PID/io) over
  IDLE seconds, and the bytes on its DevTools connection (`ss -ti`);
- memory: VmRSS and RssAnon of guidedaccessd with the layer connected
  (after a session that used it) against a guidedaccessd without
  `[Browser]` (after a session with no feature), side by side on their own
  buses.

    .venv/bin/python Benchmarks/browser_latency.py [ROUNDS] [IDLE]   (30, 10)

The targets (issue 14): reply → visible p50 ≤ 100 ms; 0 wake-ups and no
DevTools traffic while idle; RSS ≤ +2 MiB. Reported, not asserted."""

import base64
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "Tests" / "integration"))
sys.path.insert(0, str(ROOT / "Tests" / "browser"))

import dbus  # noqa: E402
from gadaemon import GAEnv, IFACE, NAME, PATH  # noqa: E402
from chromium import Chromium  # noqa: E402

PAGE = """<!doctype html><html><body style="margin:0;background:#fff">
<div style="width:100%;height:300px;background:#fff"></div><p>Kiosk</p></body></html>"""
CLIP = {"x": 600, "y": 100, "width": 4, "height": 4, "scale": 1}
STYLE = "(() => { const s = new CSSStyleSheet(); s.replaceSync('html { filter: invert(1) }'); " \
        "document.adoptedStyleSheets = [s]; })()"
UNSTYLE = "document.adoptedStyleSheets = []"


def first_pixel(png):
    """The red value of a PNG's first pixel (8-bit RGB or RGBA, as
    Chromium writes them)."""
    pos, idat, channels = 8, b"", 3
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            channels = {2: 3, 6: 4}[body[9]]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    row = zlib.decompress(idat)
    # Byte 0 is the first row's filter type. Whatever the filter, the first
    # pixel of the first row has no neighbours to be predicted from, so its
    # bytes are the values themselves.
    assert channels in (3, 4)
    return row[1]


def dark(page):
    """Whether the clip is dark (inverted): a screenshot of it."""
    data = page.call("Page.captureScreenshot", format="png", clip=CLIP)["data"]
    return first_pixel(base64.b64decode(data)) < 128


def wait_visible(page, want_dark, timeout=5.0):
    """Screenshots back to back until the clip is as wanted; the time the
    first such screenshot was in hand."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if dark(page) == want_dark:
            return time.perf_counter()
    raise TimeoutError("the change did not show within %.0f s" % timeout)


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def thread_switches(pid):
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        total += sum(int(m) for m in re.findall(r"ctxt_switches:\s+(\d+)", status))
    return total


def io_calls(pid):
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["syscr"]) + int(fields["syscw"])


def devtools_bytes(pid, port):
    """bytes_sent + bytes_received of pid's connections to the DevTools port."""
    out = subprocess.run(["ss", "-tinpH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True).stdout
    total, lines = 0, out.splitlines()
    for i, line in enumerate(lines):
        if f"pid={pid}," in line and i + 1 < len(lines):
            total += sum(int(n) for n in re.findall(r"bytes_(?:sent|received):(\d+)", lines[i + 1]))
    return total


def memory(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    get = lambda key: int(re.search(rf"{key}:\s+(\d+)", status).group(1))  # noqa: E731
    return get("VmRSS"), get("RssAnon"), get("Threads")


def daemon(env, config):
    env.stand_for_no_desktop()
    d = env.start_daemon(config=env.write_config(config))
    bus = dbus.bus.BusConnection(env.address)
    return d, dbus.Interface(bus.get_object(NAME, PATH), IFACE)


def timed(call, *args):
    call(*args)
    return time.perf_counter()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    idle = float(sys.argv[2]) if len(sys.argv) > 2 else 10
    root = Path(tempfile.mkdtemp(prefix="ga-bench-browser-"))
    (root / "page.html").write_text(PAGE)
    browser = Chromium(root, (root / "page.html").as_uri())
    browser.start()
    envs = []
    try:
        page = browser.page()
        page.call("Page.bringToFront")
        assert not dark(page), "the page's clip is not white"

        # The reference: the benchmark's own DevTools connection.
        reference = []
        for _ in range(rounds):
            for script, want_dark in ((STYLE, True), (UNSTYLE, False)):
                start = time.perf_counter()
                page.evaluate(script)
                reference.append(wait_visible(page, want_dark) - start)

        with_env, without_env = GAEnv(), GAEnv()
        envs = [with_env, without_env]
        with_d, ga = daemon(with_env, f"[Service]\nDesktop=none\n[Browser]\nDevToolsEndpoint={browser.endpoint}\n")
        without_d, plain = daemon(without_env, "[Service]\nDesktop=none\n")

        ga.StartSession(dbus.Dictionary({}, signature="sv"))
        service, calls = [], []
        for _ in range(rounds):
            for enabled in (True, False):
                called = time.perf_counter()
                replied = timed(ga.ConfigureForSession, ["invert-colors"], enabled)
                calls.append(replied - called)
                service.append(wait_visible(page, enabled) - replied)
        ga.ConfigureForSession(["invert-colors"], True)
        ga.EndSession()
        plain.StartSession(dbus.Dictionary({}, signature="sv"))
        plain.EndSession()
        assert not dark(page), "EndSession left the page inverted"

        time.sleep(1)
        pid = with_d.process.pid
        before = (thread_switches(pid), io_calls(pid), devtools_bytes(pid, browser.port))
        time.sleep(idle)
        after = (thread_switches(pid), io_calls(pid), devtools_bytes(pid, browser.port))

        rss_with, anon_with, threads_with = memory(pid)
        rss_without, anon_without, threads_without = memory(without_d.process.pid)

        p50, p90 = statistics.median(service), percentile(service, 90)
        r50 = statistics.median(reference)
        print(f"rounds {rounds} (each on and off): reply → visible p50 {p50 * 1000:.1f} ms, "
              f"p90 {p90 * 1000:.1f} ms, max {max(service) * 1000:.1f} ms")
        print(f"the call itself (it returns once the pages have the change): p50 "
              f"{statistics.median(calls) * 1000:.1f} ms, p90 {percentile(calls, 90) * 1000:.1f} ms")
        print(f"reference (own DevTools connection → visible): p50 {r50 * 1000:.1f} ms, "
              f"p90 {percentile(reference, 90) * 1000:.1f} ms; ratio of p50s {p50 / r50:.2f}")
        print(f"idle {idle:.0f} s, connected, no session: context switches {after[0] - before[0]}, "
              f"read/write calls {after[1] - before[1]}, DevTools bytes {after[2] - before[2]} "
              f"(connection's total {after[2]})")
        print(f"VmRSS with the layer {rss_with} kB, without {rss_without} kB: "
              f"+{(rss_with - rss_without) / 1024:.2f} MiB; RssAnon {anon_with} vs {anon_without} kB "
              f"(+{(anon_with - anon_without) / 1024:.2f} MiB); threads {threads_with} vs {threads_without}")
        print("targets: p50 ≤ 100 ms: %s; idle 0 wake-ups: %s; RSS ≤ +2 MiB: %s" % (
            "met" if p50 <= 0.1 else "MISSED",
            "met" if after[0] == before[0] and after[2] == before[2] else "MISSED",
            "met" if rss_with - rss_without <= 2048 else "MISSED"))
    finally:
        for env in envs:
            env.stop()
        browser.stop()


if __name__ == "__main__":
    main()
