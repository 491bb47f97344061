"""`guidedaccessctl browser` with a real, non-headless Chromium: the kiosk
browser's DevTools on a pipe the launcher keeps and relays to the service
(AttachBrowser), no TCP port, and the session's features shown in the page
as a customer sees it.

There is no DevTools port to take screenshots through, so Chromium runs
on an X display of the test's own (Xvfb, 1280x800x24) and the screen is
taken with ImageMagick (`import -window root`): xdisplay.py. The page is
pages/kiosk.html served over HTTP on 127.0.0.1 (python's http.server in a
thread), as a real kiosk's is. What each feature looks like and how it is
measured are looks.py's and images.py's (as in test_browser_layer.py),
applied to the screen.

guidedaccessd --user runs on a private bus (gadaemon.py) with `[Service]
Desktop=none` and no `[Browser] DevToolsEndpoint=`: the browser it shows
features in can only be the one the launcher attached. Figures are
printed (`pytest -s`).

Contract: docs/dbus-api.md ("Web kiosks: the browser over a pipe",
AttachBrowser, Desktop)."""

import fcntl
import json
import os
import signal
import statistics
import subprocess
import threading
import time

import pytest

import images
import xdisplay
from chromium import CHROMIUM, _setup, processes_of
from gadaemon import DAEMON_BINARY, IFACE, NAME, PATH, busctl_options
from gnomeshell import kill_all
from looks import TEXT_SCALE, WHITE_POINT, ZOOM, Before, shows

SHOW_TIMEOUT = 3.0  # the reply, then a frame of a software-rendered X window on a busy machine
ATTACH_TIMEOUT = 10.0
PAGE_FEATURES = ["grayscale", "high-contrast", "invert-colors", "large-text", "reduce-motion", "zoom"]


# ---------------------------------------------------------------- the service and the kiosk's calls


def busctl(env, member, *args):
    rc, out, err = env.busctl_call(member, *args)
    assert rc == 0, f"busctl call {NAME} {PATH} {IFACE} {member} {' '.join(args)}: {err.strip()}"
    return out


def prop(env, name):
    rc, out, err = env.busctl("get-property", NAME, PATH, IFACE, name, options=["--json=short"])
    assert rc == 0, f"busctl get-property {name}: {err.strip()}"
    return json.loads(out)["data"]


def wait_for_prop(env, name, wanted, timeout):
    """Reads a property until it is `wanted`; returns the seconds that took."""
    begun = time.monotonic()
    while True:
        value = prop(env, name)
        if value == wanted:
            return time.monotonic() - begun
        assert time.monotonic() - begun < timeout, f"{name} is {value!r}, not {wanted!r}, after {timeout} s"
        time.sleep(0.05)


class Screen:
    """The display, measured: screenshots numbered in the test's directory."""

    def __init__(self, display, directory):
        self.display = display
        self.directory = directory
        self.n = 0

    def shot(self, label):
        self.n += 1
        return self.display.screenshot(self.directory / f"{self.n:03d}-{label}.png")

    def wait_for(self, check, what, timeout=SHOW_TIMEOUT, label="shot", quick=None):
        """Screenshots until check(shot) gives (True, _); returns (shot, the
        seconds from the call to the start of the look that showed it, the
        number of looks before it). With `quick` (a colour), each look is
        first one pixel of the screen, the page's white point, which must
        show that colour before a whole screenshot is taken and measured: a
        finer timing. Fails naming the last measurement."""
        begun = time.monotonic()
        tries = 0
        measured = "(the white point never showed the colour looked for)"
        while True:
            taken = time.monotonic()
            if quick is None or self.display.colour_at(*WHITE_POINT) == quick:
                shot = self.shot(label)
                ok, measured = check(shot)
                if ok:
                    return shot, taken - begun, tries
            tries += 1
            if time.monotonic() - begun > timeout:
                raise AssertionError(f"{what}: not after {timeout} s ({tries} looks): {measured}")
            time.sleep(0.02)


BLACK, WHITE = "#000000", "#ffffff"  # the page's white point (looks.WHITE_POINT) inverted, or not


def as_before(before):
    def check(shot):
        changed = images.changed_pixels(before.shot, shot)
        return changed == 0, f"{changed} pixels differ from before (compare -metric AE, the animated strip left out)"

    return check


def showing(feature, before, zoom=ZOOM):
    def check(shot):
        return shows(feature, None, shot, before, alone=True, zoom=zoom)

    return check


class Kiosk:
    """guidedaccessd (Desktop=none, no DevToolsEndpoint) and the kiosk
    browser started through the launcher, attached; the screen measured
    before any session."""

    def __init__(self, env, make_launched_browser, display, directory):
        if not DAEMON_BINARY.exists():
            pytest.fail(f"{DAEMON_BINARY} does not exist: build it with 'swift build --product guidedaccessd' "
                        "or set GUIDEDACCESSD", pytrace=False)
        self.env = env
        self.daemon = env.start_daemon(config=env.write_config("[Service]\nDesktop=none\n"))
        assert prop(env, "Desktop") == "none"
        begun = time.monotonic()
        self.browser = make_launched_browser(env)
        self.page_seconds = time.monotonic() - begun
        self.attach_seconds = self.wait_attached()
        self.screen = Screen(display, directory)
        shot = self.screen.shot("before")
        assert xdisplay.page_on_screen(shot), "the screen does not show the kiosk page"
        self.before = Before(shot, images.lightness(shot), images.saturation(shot), images.ink_box(shot))

    def wait_attached(self, prefix=xdisplay.LaunchedBrowser.ATTACHED, count=1, timeout=ATTACH_TIMEOUT):
        begun = time.monotonic()
        while self.browser.count(prefix) < count:
            assert self.browser.process.poll() is None, (
                f"the launcher exited with {self.browser.process.returncode}: {self.browser.launcher_lines()}")
            assert time.monotonic() - begun < timeout, (
                f"the launcher did not print {prefix!r} within {timeout} s: {self.browser.launcher_lines()}")
            time.sleep(0.02)
        return time.monotonic() - begun


@pytest.fixture
def kiosk(launcher_env, make_launched_browser, x_display, tmp_path):
    kiosk = Kiosk(launcher_env, make_launched_browser, x_display, tmp_path)
    wait_for_prop(launcher_env, "Desktop", "none+browser", 5)
    print(f"\n[kiosk] display {x_display.name}; the page on the screen {kiosk.page_seconds:.2f} s after the "
          f"launcher started; 'attached' printed; Desktop none+browser; mean lightness "
          f"{kiosk.before.lightness:.3f}, saturation {kiosk.before.saturation:.3f}")
    return kiosk


# ---------------------------------------------------------------- 1. no TCP


def test_the_browser_run_through_the_launcher_listens_on_no_tcp_port_and_is_attached(kiosk):
    browser = kiosk.browser
    chromium_pid = browser.chromium_pid()
    assert chromium_pid is not None, f"no Chromium child of the launcher: {browser.processes()}"
    argv = xdisplay.cmdline(chromium_pid)
    assert "--remote-debugging-pipe" in argv, argv
    assert not [arg for arg in argv if arg.startswith("--remote-debugging-port")], argv
    ours = set(browser.processes())  # the launcher, Chromium's processes, the crash handlers
    listening = xdisplay.listening_tcp()
    theirs = [line for _, pids, line in listening if pids & ours]
    print(f"\n{len(ours)} processes (launcher {browser.pid}, Chromium {chromium_pid}); `ss -ltnpH` lists "
          f"{len(listening)} listening TCP sockets on the machine, {len(theirs)} of them theirs")
    for _, _, line in listening:
        print(f"  {line}")
    assert theirs == [], f"listening TCP sockets of the launcher or Chromium: {theirs}"
    assert prop(kiosk.env, "Desktop") == "none+browser"
    supported = prop(kiosk.env, "SupportedFeatures")
    assert set(PAGE_FEATURES) <= set(supported), supported
    assert browser.launcher_lines()[:1] == [
        "guidedaccessctl browser: attached: the service shows the session's features in the browser's pages"]


# ---------------------------------------------------------------- 2. features on the screen


def test_invert_colors_and_zoom_show_on_the_screen_and_end_session_gives_it_back_pixel_for_pixel(kiosk):
    env, screen, before = kiosk.env, kiosk.screen, kiosk.before
    # busctl, a client we did not write: a{sv} 1 features as 1 invert-colors
    busctl(env, "StartSession", *busctl_options(features=["invert-colors"]))
    shot, seconds, tries = screen.wait_for(showing("invert-colors", before), "the screen is not inverted",
                                           label="inverted", quick=BLACK)
    _, measured = showing("invert-colors", before)(shot)
    print(f"\ninvert-colors: {measured}; seen {seconds:.2f} s after busctl returned ({tries} looks before)")
    busctl(env, "EndSession")
    shot, seconds, tries = screen.wait_for(as_before(before), "the screen is not as before after EndSession",
                                           label="ended-1", quick=WHITE)
    print(f"EndSession: 0 pixels differ from before, {seconds:.2f} s after busctl returned")

    busctl(env, "StartSession", *busctl_options(features=["zoom"], zoom_factor=("d", ZOOM)))
    shot, seconds, tries = screen.wait_for(showing("zoom", before), "the screen is not zoomed", label="zoomed")
    _, measured = showing("zoom", before)(shot)
    print(f"zoom: {measured}; seen {seconds:.2f} s after busctl returned")
    busctl(env, "EndSession")
    shot, seconds, tries = screen.wait_for(as_before(before), "the screen is not as before after EndSession",
                                           label="ended-2", quick=WHITE)
    print(f"EndSession: 0 pixels differ from before, {seconds:.2f} s after busctl returned")
    assert prop(env, "SessionActive") is False


def on_screen(feature, before):
    """What the screen alone tells of the features measured through
    DevTools elsewhere (looks.py): large-text by the ink of the text (1.5x
    as wide), high-contrast by forced colours (no saturation, the magenta
    box gone); grayscale as in looks.py."""
    def check(shot):
        if feature == "large-text":
            ink = images.ink_box(shot)
            ratio = ink[2] / before.ink[2] if ink else 0
            return abs(ratio - TEXT_SCALE) < 0.1, f"the text's ink {before.ink} -> {ink} (x{ratio:.2f} wide)"
        if feature == "high-contrast":
            saturation, box = images.saturation(shot), images.colour_box(shot)
            return saturation < 0.02 and box is None, (
                f"mean saturation {before.saturation:.3f} -> {saturation:.3f}, the magenta box at {box}")
        return shows(feature, None, shot, before, alone=True)

    return check


@pytest.mark.parametrize("feature", ["grayscale", "large-text", "high-contrast"])
def test_the_other_visual_features_show_on_the_screen_and_end_session_gives_it_back(kiosk, feature):
    """(reduce-motion changes nothing on this page's screen: its animation
    does not ask for the media query.)"""
    env, screen, before = kiosk.env, kiosk.screen, kiosk.before
    busctl(env, "StartSession", *busctl_options(features=[feature], text_scale=("d", TEXT_SCALE)))
    shot, seconds, _ = screen.wait_for(on_screen(feature, before), f"the screen does not show {feature}", label=feature)
    print(f"\n{feature}: {on_screen(feature, before)(shot)[1]}; seen {seconds:.2f} s after busctl returned")
    busctl(env, "EndSession")
    _, seconds, _ = screen.wait_for(as_before(before), "the screen is not as before after EndSession", label="ended")
    print(f"EndSession: 0 pixels differ from before, {seconds:.2f} s after busctl returned")


# ---------------------------------------------------------------- 3. the service killed mid-session


def page_loads(server):
    return sum('"GET /kiosk.html ' in request for request in server.requests)


@pytest.mark.parametrize("reload_while_down", [False, True], ids=["page-kept", "page-reloaded-while-down"])
def test_the_service_killed_mid_session_comes_back_the_launcher_attaches_again_and_end_session_restores(
        kiosk, page_server, reload_while_down):
    """kill -9 of the service with invert-colors on, then the service again
    (its session recovered from its journal). page-kept: the page keeps
    the style sheet the old service added (it is the page's DOM), so it
    stays inverted throughout; what shows the new service has the page is
    that it stays inverted, and that EndSession gives it back. page-reloaded-
    while-down: F5 on the kiosk's keyboard (xdotool) while the service is
    down reloads the page without the style (as any navigation would), so
    the inversion on the screen again is the new service's doing."""
    env, screen, before, browser = kiosk.env, kiosk.screen, kiosk.before, kiosk.browser
    chromium_pid = browser.chromium_pid()
    busctl(env, "StartSession", *busctl_options(features=["invert-colors"]))
    screen.wait_for(showing("invert-colors", before), "the screen is not inverted", label="inverted", quick=BLACK)

    # The service's down time decides the launcher's next retry (after 0.1 s,
    # then doubling): kept short, the screen's full measurements come after.
    killed = time.monotonic()
    kiosk.daemon.kill9()
    down = None
    if reload_while_down:
        loads = page_loads(page_server)
        rc, _, err = screen.display.xdotool("key", "F5")
        assert rc == 0, f"xdotool key F5: {err}"
        begun = time.monotonic()
        while page_loads(page_server) == loads or screen.display.colour_at(*WHITE_POINT) != WHITE:
            assert time.monotonic() - begun < 5, (
                f"after F5 with the service down: {page_loads(page_server) - loads} loads of the page, the white "
                f"point {screen.display.colour_at(*WHITE_POINT)}")
            time.sleep(0.02)
        down = time.monotonic() - begun
    else:
        down_colour = screen.display.colour_at(*WHITE_POINT)
    kiosk.daemon.start()  # returns once the service owns its name again
    owned = time.monotonic()
    seen = []
    watcher = threading.Thread(target=lambda: seen.append(browser.wait_line(xdisplay.LaunchedBrowser.ATTACHED_AGAIN)))
    watcher.start()
    print(f"\nthe service was down {owned - killed:.2f} s (kill -9 to its name owned again)")
    if reload_while_down:
        print(f"F5 while it was down: the page reloaded, its white point white (not inverted) {down:.2f} s after F5")
    else:
        print(f"meanwhile the page's white point showed {down_colour} (the style sheet stays in the page's DOM)")

    # Every ~0.1 s a look at the page's white point (one pixel of the
    # screen); the first black one after 'attached again', and the last,
    # measured whole.
    first = None  # seconds after the name was owned
    samples = []  # (seconds after the name was owned, 'attached again' printed before it, white point)
    while time.monotonic() - owned < 5.0:
        taken = time.monotonic()
        attached_again = bool(seen) and seen[0] is not None and seen[0] <= taken
        white = screen.display.colour_at(*WHITE_POINT)
        samples.append((round(taken - owned, 2), attached_again, white))
        if attached_again and first is None and white == BLACK:
            first = taken - owned
        if first is not None and taken - owned - first >= 1.5:
            break
        time.sleep(0.03)
    watcher.join()
    line = f"{seen[0] - owned:.2f} s" if seen and seen[0] is not None else "never"
    print(f"'attached again' printed {line} after the name was owned; looks at the white point (s after the name "
          f"was owned, 'attached again' printed before it, colour): {samples}")
    assert seen and seen[0] is not None, f"the launcher did not print 'attached again': {browser.launcher_lines()}"
    assert browser.count(xdisplay.LaunchedBrowser.ATTACHED_AGAIN) == 1, browser.launcher_lines()
    assert first is not None, f"the screen was never inverted after 'attached again': {samples}"
    print(f"inverted again {first:.2f} s after the service owned its name (the first look taken after "
          f"'attached again' with the white point black)")
    after_first = [sample for sample in samples if sample[0] >= first]
    assert all(white == BLACK for _, _, white in after_first), (
        f"the page stopped being inverted after the service attached again: {samples}")
    shot = screen.shot("inverted-again")
    inverted, measured = showing("invert-colors", before)(shot)
    assert inverted, f"1.5 s after the white point was black again, the screen is not inverted: {measured}"
    print(f"1.5 s later, the whole screen: {measured}")
    assert first <= 1.0, f"inverted again only {first:.2f} s after the service owned its name"
    assert browser.chromium_pid() == chromium_pid, "Chromium's main process changed: the browser was restarted"
    assert prop(env, "SessionActive") is True
    assert prop(env, "Desktop") == "none+browser"

    busctl(env, "EndSession")
    _, seconds, _ = screen.wait_for(as_before(before), "the screen is not as before after EndSession", label="ended",
                                    quick=WHITE)
    print(f"EndSession: 0 pixels differ from the first screenshot, {seconds:.2f} s after busctl returned")
    print(f"launcher: {browser.launcher_lines()}")


# ---------------------------------------------------------------- 4. the browser's end, the launcher's end


def test_the_browser_killed_ends_the_launcher_with_137_and_the_service_lets_go_of_it(kiosk):
    env, browser = kiosk.env, kiosk.browser
    chromium_pid = browser.chromium_pid()
    assert chromium_pid is not None
    os.kill(chromium_pid, signal.SIGKILL)
    killed = time.monotonic()
    status = browser.wait_exit(timeout=2.0)
    exited = time.monotonic() - killed
    assert status is not None, "the launcher still runs 2 s after its browser was killed with SIGKILL"
    print(f"\nthe launcher exited with {status} {exited:.2f} s after kill -9 of Chromium ({chromium_pid})")
    assert status == 128 + signal.SIGKILL
    seconds = wait_for_prop(env, "Desktop", "none", 5)
    print(f"Desktop back to 'none' {time.monotonic() - killed:.2f} s after the kill")
    assert not set(PAGE_FEATURES) & set(prop(env, "SupportedFeatures"))
    assert seconds <= 2.0
    deadline = time.monotonic() + 5
    while browser.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"Chromium processes left {time.monotonic() - killed:.2f} s after the kill: {browser.processes()}")


def chromium_own_status_on_sigterm(display, url, directory, timeout=30.0):
    """Chromium's exit status on SIGTERM when it is the test's own child
    (with a pipe of the test's own on fds 3 and 4, the same flags): what
    the launcher must pass on."""
    commands_read, commands_write = os.pipe()
    replies_read, replies_write = os.pipe()

    def fds():
        # Above 4 first, so that neither lands on the other's place; dup2
        # leaves 3 and 4 open across exec.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (commands_read, replies_write)]
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)
        _setup()

    mark = f"GA_BROWSER_TEST={directory}"
    argv = [CHROMIUM, "--remote-debugging-pipe", *xdisplay.CHROMIUM_FLAGS, f"--user-data-dir={directory}", url]
    with open(directory.parent / "reference-chromium.log", "ab") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(3, 4), preexec_fn=fds,
            env={**os.environ, **display.env(), "LANG": "C.UTF-8", "GA_BROWSER_TEST": str(directory)})
    os.close(commands_read)
    os.close(replies_write)
    try:
        begun = time.monotonic()
        while not display.visible_windows():
            assert process.poll() is None, f"the reference Chromium exited with {process.returncode}"
            assert time.monotonic() - begun < timeout, "the reference Chromium showed no window"
            time.sleep(0.1)
        time.sleep(2.0)  # the page loaded
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=15)
    finally:
        kill_all(lambda: processes_of({process.pid}, mark.encode()), [process])
        os.close(commands_write)
        os.close(replies_read)


def test_sigterm_to_the_launcher_ends_chromium_and_the_launcher_exits_with_chromiums_status(
        kiosk, x_display, page_server, tmp_path):
    env, browser = kiosk.env, kiosk.browser
    chromium_pid = browser.chromium_pid()
    assert chromium_pid is not None
    os.kill(browser.pid, signal.SIGTERM)
    signalled = time.monotonic()
    status = browser.wait_exit(timeout=10.0)
    assert status is not None, "the launcher still runs 10 s after SIGTERM"
    print(f"\nthe launcher exited with {status} {time.monotonic() - signalled:.2f} s after SIGTERM")
    assert not os.path.exists(f"/proc/{chromium_pid}"), f"Chromium ({chromium_pid}) still exists"
    deadline = time.monotonic() + 2
    while browser.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = browser.processes()
    assert left == [], f"processes of Chromium left after the launcher exited: {left}"
    wait_for_prop(env, "Desktop", "none", 5)

    # Chromium's own status on SIGTERM, measured with Chromium as the test's child.
    (tmp_path / "reference").mkdir()
    own = chromium_own_status_on_sigterm(x_display, page_server.url("kiosk.html"), tmp_path / "reference")
    print(f"Chromium's own exit status on SIGTERM (as the test's child): {own}")
    assert status == (own if own >= 0 else 128 - own), f"the launcher exited with {status}, Chromium with {own}"


# ---------------------------------------------------------------- 5. figures


def test_figures_reply_to_screen_and_idle_cost(kiosk):
    """Printed figures: reply → change on the screen, p50 over 10 rounds;
    the service's wake-ups while attached and idle (asserted loosely: a
    timer that polls would show)."""
    env, screen, before, browser = kiosk.env, kiosk.screen, kiosk.before, kiosk.browser
    pid = kiosk.daemon.process.pid

    def idle(seconds=10.0):
        service, launcher = xdisplay.wakeups(pid), xdisplay.wakeups(browser.pid)
        time.sleep(seconds)
        return (xdisplay.woken(service, xdisplay.wakeups(pid)),
                xdisplay.woken(launcher, xdisplay.wakeups(browser.pid)), len(service))

    time.sleep(0.5)
    idle_before = idle()
    print(f"\nidle, attached, no session yet, 10 s: the service's threads switched to {idle_before[0]} times "
          f"({idle_before[2]} threads); the launcher's {idle_before[1]} times")

    bus = env.connect(mainloop=False)

    def call(member, signature=None, args=()):
        bus.call_blocking(NAME, PATH, IFACE, member, signature, args, timeout=15)
        return time.monotonic()

    import dbus

    figures = {"StartSession": [], "ConfigureForSession off": [], "ConfigureForSession on": [], "EndSession": []}
    resolution = []
    inverted, restored = (showing("invert-colors", before), BLACK), (as_before(before), WHITE)
    probe = []
    looks_before = []
    for _ in range(10):
        for member, signature, args, (check, quick) in (
                ("StartSession", "a{sv}", ({"features": dbus.Array(["invert-colors"], signature="s")},), inverted),
                ("ConfigureForSession off", "asb", (["invert-colors"], False), restored),
                ("ConfigureForSession on", "asb", (["invert-colors"], True), inverted),
                ("EndSession", None, (), restored)):
            call(member.split()[0], signature, args)
            taken = time.monotonic()
            _, seconds, tries = screen.wait_for(check, f"{member}: the screen did not change", label=member[:9],
                                                quick=quick)
            figures[member].append(seconds)
            looks_before.append(tries)
            resolution.append(time.monotonic() - taken - seconds)
    for _ in range(10):
        begun = time.monotonic()
        screen.display.colour_at(*WHITE_POINT)
        probe.append(time.monotonic() - begun)
    print(f"reply → the first look at the screen showing the change (when that look began), p50 / max over 10 "
          f"rounds; a look (one pixel of the screen, `import -crop`) takes {statistics.median(probe) * 1000:.0f} ms, "
          f"a whole screenshot and its measurement {statistics.median(resolution) * 1000:.0f} ms:")
    for member, values in figures.items():
        print(f"  {member:24} p50 {statistics.median(values) * 1000:6.0f} ms   max {max(values) * 1000:6.0f} ms")
    counts = {n: looks_before.count(n) for n in sorted(set(looks_before))}
    print(f"  looks that did not show it yet, per change: {{count: times}} = {counts} (the first look begins at the "
          f"reply)")

    time.sleep(1.0)
    idle_after = idle()
    print(f"idle, attached, after the sessions, 10 s: the service's threads switched to {idle_after[0]} times "
          f"({idle_after[2]} threads); the launcher's {idle_after[1]} times")
    assert idle_before[0] <= 10 and idle_after[0] <= 10, (
        f"the idle service was woken {idle_before[0]} / {idle_after[0]} times in 10 s: something polls")
