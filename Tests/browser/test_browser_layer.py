"""guidedaccessd's browser layer against a real headless Chromium: what a
kiosk client turns on through D-Bus must show in every page of the kiosk
browser, and every page must look as before once it is off or the session
ends — also across a restart of the browser, a kill -9 of the service, and a
time limit that passed while the service was down.

guidedaccessd --user runs on a private bus (the integration suite's
gadaemon.py) with `[Service] Desktop=none` (or `cage`: a desktop that draws
no filter or magnifier over the whole screen) and `[Browser]
DevToolsEndpoint=` naming Chromium's --remote-debugging-port. The kiosk's
calls are made with busctl, a client we did not write. The pages are
measured through a DevTools session of the test's own (chromium.py):
screenshots (ImageMagick, images.py), matchMedia and computed sizes; never
by reading back what the service set.

What each feature must do to the kiosk page (pages/kiosk.html), and what
"as before" is, are looks.py's; test_harness.py checks those measurements
against the same changes made by a DevTools session of the test's own.

The README's picture (before / inverted / grayscale / zoomed / after) is
written to docs/browser-layer.png when GA_WRITE_PICTURE=1, else into the
test's temporary directory.

Contract: docs/dbus-api.md ("Browser layer", StartSession's
options, SupportedFeatures, Desktop, [Browser] DevToolsEndpoint=)."""

import json
import os
import time
from pathlib import Path

import pytest

import images
from chromium import free_port
from conftest import PAGE_URL
from gadaemon import (
    DAEMON_BINARY, GA_ERROR, IFACE, NAME, PATH, ErrorMonitor, Recorder, SupportChanged, busctl_features, busctl_options,
    pump, pump_for,
)
from looks import (
    SHOW_TIMEOUT, TEXT_SCALE, ZOOM, measure_before, shows, wait_for_look, wait_until_as_before, wait_until_shows,
)

BROWSER_FEATURES = ["grayscale", "high-contrast", "invert-colors", "large-text", "reduce-motion", "zoom"]
# Every feature whose measurement does not hide another's: what the
# restart and page-lifecycle tests turn on (high-contrast's forced colours
# would paint over the box that zoom is measured on).
TOGETHER = ["grayscale", "invert-colors", "large-text", "reduce-motion", "zoom"]

RECONNECT_TIMEOUT = 10.0  # a restarted browser or service, found again with back-off
PICTURE = Path(__file__).resolve().parents[2] / "docs" / "browser-layer.png"


# ---------------------------------------------------------------- the service and the kiosk's calls


def start_service(env, endpoint, desktop="none"):
    if not DAEMON_BINARY.exists():
        pytest.fail(f"{DAEMON_BINARY} does not exist: build it with 'swift build --product guidedaccessd' "
                    "or set GUIDEDACCESSD", pytrace=False)
    config = env.write_config(f"[Service]\nDesktop={desktop}\n[Browser]\nDevToolsEndpoint={endpoint}\n")
    return env.start_daemon(config=config)


def busctl(env, member, *args):
    rc, out, err = env.busctl_call(member, *args)
    assert rc == 0, f"busctl call {member} {' '.join(args)}: {err.strip()}"
    return out


def prop(env, name):
    """A property, read with busctl (which is also what makes the service
    look for a browser it is not connected to)."""
    rc, out, err = env.busctl("get-property", NAME, PATH, IFACE, name, options=["--json=short"])
    assert rc == 0, f"busctl get-property {name}: {err.strip()}"
    return json.loads(out)["data"]


def start_session(env, features=(), **options):
    busctl(env, "StartSession", *busctl_options(
        features=list(features), zoom_factor=("d", ZOOM), text_scale=("d", TEXT_SCALE), **options))


def configure(env, features, enabled):
    busctl(env, "ConfigureForSession", *busctl_features(list(features), enabled))


def end_session(env):
    busctl(env, "EndSession")


def wait_for_browser(env, desktop="none", timeout=RECONNECT_TIMEOUT):
    """Reads SupportedFeatures every 0.3 s until the browser's features are
    in it; returns the seconds that took."""
    begun = time.monotonic()
    while True:
        supported = prop(env, "SupportedFeatures")
        if set(BROWSER_FEATURES) <= set(supported):
            assert prop(env, "Desktop") == f"{desktop}+browser"
            return time.monotonic() - begun
        assert time.monotonic() - begun < timeout, (
            f"the browser's features are not in SupportedFeatures after {timeout} s of reading it: {supported}; "
            f"Desktop is {prop(env, 'Desktop')!r}")
        time.sleep(0.3)


class Kiosk:
    """A browser with two tabs of the kiosk page, measured before the
    service starts; start() starts the service on it."""

    def __init__(self, env, browser, directory):
        self.env = env
        self.browser = browser
        self.directory = directory
        self.pages = [browser.page(), browser.new_tab(PAGE_URL + "?second")]
        self.before = [measure_before(page, directory / f"before-{i}.png") for i, page in enumerate(self.pages)]
        self.daemon = None

    def start(self, desktop="none"):
        self.daemon = start_service(self.env, self.browser.endpoint, desktop)
        wait_for_browser(self.env, desktop)
        return self.daemon

    def shows(self, features, step, timeout=SHOW_TIMEOUT):
        """Every page shows `features`; returns how many screenshots each
        page took before it did."""
        return [wait_until_shows(page, before, features, self.directory / f"{step}-{i}.png", timeout, f"tab {i}")[1]
                for i, (page, before) in enumerate(zip(self.pages, self.before))]

    def as_before(self, step, timeout=SHOW_TIMEOUT):
        return [wait_until_as_before(page, before, self.directory / f"{step}-{i}.png", timeout, f"tab {i}")[1]
                for i, (page, before) in enumerate(zip(self.pages, self.before))]


@pytest.fixture
def kiosk(ga_env, make_browser, tmp_path):
    return Kiosk(ga_env, make_browser(), tmp_path)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("value", [
    "https://127.0.0.1:9222", "ws://127.0.0.1:9222", "http://10.0.0.1:9222", "http://example.com:9222",
    "http://127.0.0.1", "http://127.0.0.1:9222/json", "http://127.0.0.1:0", "http://127.0.0.1:65536",
    "127.0.0.1:9222", "garbage",
], ids=["https", "ws", "not-loopback", "a-name", "no-port", "a-path", "port-0", "port-too-big", "no-scheme",
        "garbage"])
def test_an_endpoint_that_is_not_a_loopback_http_address_is_a_start_up_error_naming_it(ga_env, value):
    if not DAEMON_BINARY.exists():
        pytest.fail(f"{DAEMON_BINARY} does not exist", pytrace=False)
    config = ga_env.write_config(f"[Service]\nDesktop=none\n[Browser]\nDevToolsEndpoint={value}\n", name="bad.conf")
    code, log = ga_env.daemon(config=config).expect_start_failure()
    assert code != 0
    for word in [str(config), "[Browser]", "DevToolsEndpoint", value]:
        assert word in log, f"{word!r} not named in the log:\n{log}"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "[::1]"])
def test_a_loopback_endpoint_with_no_browser_listening_starts_without_the_browser_features(ga_env, host):
    start_service(ga_env, f"http://{host}:{free_port()}")
    assert prop(ga_env, "Desktop") == "none"
    assert not set(BROWSER_FEATURES) & set(prop(ga_env, "SupportedFeatures"))


def test_with_no_browser_listening_the_browser_features_are_unsupported(ga_env):
    daemon = start_service(ga_env, f"http://127.0.0.1:{free_port()}")
    errors = ErrorMonitor(ga_env)
    name, message = errors.busctl_error(daemon, "StartSession", *busctl_options(features=["invert-colors"]))
    assert name == GA_ERROR + "UnsupportedFeature", message
    assert "invert-colors" in message
    assert prop(ga_env, "SessionActive") is False


# ---------------------------------------------------------------- finding the browser


def test_a_browser_listening_when_the_service_starts_is_connected(ga_env, browser):
    start_service(ga_env, browser.endpoint)
    seconds = wait_for_browser(ga_env, timeout=5)
    print(f"\nconnected {seconds:.2f} s after the service took its name")
    assert prop(ga_env, "Desktop") == "none+browser"
    assert set(BROWSER_FEATURES) <= set(prop(ga_env, "SupportedFeatures"))


def test_a_browser_started_after_the_service_is_found_when_a_client_reads_supported_features(
        ga_env, make_browser):
    browser = make_browser(start=False)
    start_service(ga_env, browser.endpoint)
    recorder = Recorder(ga_env)
    assert prop(ga_env, "Desktop") == "none"
    browser.start()
    seconds = wait_for_browser(ga_env)
    print(f"\nfound {seconds:.2f} s after Chromium's endpoint answered, reading SupportedFeatures every 0.3 s")

    def announced():
        return [changed for kind, changed, *_ in recorder.signals(("PropertiesChanged",))
                if changed.get("Desktop") == "none+browser"
                and set(BROWSER_FEATURES) <= set(changed.get("SupportedFeatures", []))]

    assert pump(announced, 5), f"no PropertiesChanged with the browser's features: {recorder.events}"


def test_while_idle_the_service_does_not_look_for_a_browser_until_a_client_reads(ga_env, make_browser):
    browser = make_browser(start=False)
    start_service(ga_env, browser.endpoint)
    recorder = Recorder(ga_env)
    assert prop(ga_env, "Desktop") == "none"
    time.sleep(1.1)  # past the one look a second that the read above allowed
    browser.start()
    pump_for(3)
    assert recorder.signals() == [], "the service found the browser although no client asked (a timer polls)"
    wait_for_browser(ga_env, timeout=5)


def test_a_browser_that_goes_away_takes_its_features_out_of_supported_features(ga_env, browser):
    start_service(ga_env, browser.endpoint)
    wait_for_browser(ga_env, timeout=5)
    recorder = Recorder(ga_env)
    browser.kill9()
    gone = SupportChanged("none", [])
    assert pump(lambda: gone in recorder.events, 5), f"no PropertiesChanged for the browser leaving: {recorder.events}"
    assert prop(ga_env, "Desktop") == "none"
    assert not set(BROWSER_FEATURES) & set(prop(ga_env, "SupportedFeatures"))


# ---------------------------------------------------------------- features in pages


@pytest.mark.parametrize("feature", BROWSER_FEATURES)
def test_a_feature_turned_on_shows_in_every_open_page_and_turned_off_leaves_them_as_before(kiosk, feature):
    kiosk.start()
    start_session(kiosk.env)
    kiosk.as_before("session-started")
    configure(kiosk.env, [feature], True)
    tries = kiosk.shows([feature], "on")
    print(f"\n{feature}: shown in both tabs; screenshots before it showed: {tries} (0 = at once after the reply)")
    configure(kiosk.env, [feature], False)
    kiosk.as_before("off")
    end_session(kiosk.env)
    kiosk.as_before("ended")


def test_the_sessions_zoom_factor_and_text_scale_are_what_the_pages_show(kiosk, tmp_path):
    kiosk.start()
    busctl(kiosk.env, "StartSession", *busctl_options(
        features=["zoom", "large-text"], zoom_factor=("d", 1.5), text_scale=("d", 1.25)))
    page, before = kiosk.pages[0], kiosk.before[0]
    for feature in ("zoom", "large-text"):
        def check(shot, feature=feature):
            return shows(feature, page, shot, before, alone=False, zoom=1.5, text_scale=1.25)

        wait_for_look(page, tmp_path / f"{feature}.png", check, f"{feature} at zoom 1.5, text 1.25", SHOW_TIMEOUT)
    end_session(kiosk.env)
    kiosk.as_before("ended")


@pytest.mark.parametrize("desktop", ["none", "cage"])
def test_features_started_with_the_session_show_in_every_page_and_end_session_gives_them_back(kiosk, desktop):
    kiosk.start(desktop)
    start_session(kiosk.env, TOGETHER)
    kiosk.shows(TOGETHER, "on")
    end_session(kiosk.env)
    kiosk.as_before("ended")
    assert prop(kiosk.env, "EnabledFeatures") == []


def test_a_page_opened_during_the_session_shows_the_features_and_is_as_before_after_it(kiosk, tmp_path):
    kiosk.start()
    start_session(kiosk.env, TOGETHER)
    kiosk.shows(TOGETHER, "on")
    tab = kiosk.browser.new_tab(PAGE_URL + "?opened-during-the-session")
    wait_until_shows(tab, kiosk.before[0], TOGETHER, tmp_path / "new-tab.png", RECONNECT_TIMEOUT / 2, "new tab")
    end_session(kiosk.env)
    kiosk.as_before("ended")
    wait_until_as_before(tab, kiosk.before[0], tmp_path / "new-tab-ended.png", label="new tab")


def test_a_page_navigated_during_the_session_keeps_the_features_and_is_as_before_after_it(kiosk, tmp_path):
    kiosk.start()
    start_session(kiosk.env, TOGETHER)
    kiosk.shows(TOGETHER, "on")
    page = kiosk.pages[0]
    page.navigate(PAGE_URL + "?navigated")
    wait_until_shows(page, kiosk.before[0], TOGETHER, tmp_path / "navigated.png", label="navigated tab")
    page.call("Page.reload")
    page.wait_loaded(PAGE_URL + "?navigated")
    wait_until_shows(page, kiosk.before[0], TOGETHER, tmp_path / "reloaded.png", label="reloaded tab")
    end_session(kiosk.env)
    kiosk.as_before("ended")


# ---------------------------------------------------------------- restarts


def test_a_browser_killed_and_started_again_during_the_session_gets_the_features_back(kiosk, tmp_path):
    kiosk.start()
    start_session(kiosk.env, TOGETHER)
    kiosk.shows(TOGETHER, "on")
    kiosk.browser.restart()  # kill -9 of every Chromium process; the same port and profile
    page = kiosk.browser.page()
    begun = time.monotonic()
    wait_until_shows(page, kiosk.before[0], TOGETHER, tmp_path / "restarted.png", RECONNECT_TIMEOUT,
                     "the restarted browser's page")
    print(f"\nthe features were back {time.monotonic() - begun:.2f} s after Chromium's endpoint answered again")
    end_session(kiosk.env)
    wait_until_as_before(page, kiosk.before[0], tmp_path / "ended.png", label="the restarted browser's page")


def test_the_service_killed_mid_session_puts_the_features_back_when_it_restarts_and_end_session_restores(
        kiosk, tmp_path):
    daemon = kiosk.start()
    start_session(kiosk.env, TOGETHER)
    kiosk.shows(TOGETHER, "on")
    daemon.kill9()
    page = kiosk.pages[0]
    left = page.screenshot(tmp_path / "killed.png")
    kept = {f: shows(f, page, left, kiosk.before[0], alone=False)[0] for f in TOGETHER}
    print(f"\nwhat the page shows after kill -9 of the service: {kept}")
    daemon.start()
    begun = time.monotonic()
    kiosk.shows(TOGETHER, "restarted", timeout=RECONNECT_TIMEOUT)
    print(f"features back {time.monotonic() - begun:.2f} s after the restarted service took its name")
    assert prop(kiosk.env, "SessionActive") is True
    end_session(kiosk.env)
    kiosk.as_before("ended")


def test_a_time_limit_passed_while_the_service_was_down_ends_the_session_at_start_and_gives_the_pages_back(
        kiosk, tmp_path):
    daemon = kiosk.start()
    start_session(kiosk.env, TOGETHER, time_limit=("t", 4))
    deadline = prop(kiosk.env, "SessionDeadline") / 1e6
    kiosk.shows(TOGETHER, "on")
    daemon.kill9()
    # What Chromium keeps of a session whose service is gone: the style
    # sheet (zoom, invert, text size) is the page's DOM. The service must
    # take it off when it ends the session at start-up.
    page = kiosk.pages[0]
    kept = page.screenshot(tmp_path / "killed.png")
    for feature in ("invert-colors", "zoom", "large-text"):
        ok, what = shows(feature, page, kept, kiosk.before[0], alone=False)
        assert ok, f"after kill -9 of the service the page no longer shows {feature} ({what}): nothing to restore"
    assert time.time() < deadline, "the session's time limit passed before the service was killed; make it longer"
    time.sleep(max(0.0, deadline - time.time()) + 0.5)
    daemon.start()
    assert prop(kiosk.env, "SessionActive") is False
    kiosk.as_before("ended-at-start", timeout=RECONNECT_TIMEOUT / 2)


# ---------------------------------------------------------------- the README's picture


def test_the_readme_picture_shows_each_step_measured(kiosk, tmp_path):
    """before / inverted / grayscale / zoomed / after, each step measured as
    above; docs/browser-layer.png with GA_WRITE_PICTURE=1."""
    kiosk.start()
    page, before = kiosk.pages[0], kiosk.before[0]
    start_session(kiosk.env)
    steps = [("before", before.shot)]
    for feature, label in (("invert-colors", "invert-colors"), ("grayscale", "grayscale"), ("zoom", "zoom x2")):
        configure(kiosk.env, [feature], True)
        shot, _ = wait_until_shows(page, before, [feature], tmp_path / f"picture-{feature}.png")
        steps.append((label, shot))
        configure(kiosk.env, [feature], False)
        wait_until_as_before(page, before, tmp_path / f"picture-{feature}-off.png")
    end_session(kiosk.env)
    after, _ = wait_until_as_before(page, before, tmp_path / "picture-after.png")
    steps.append(("after EndSession", after))
    out = PICTURE if os.environ.get("GA_WRITE_PICTURE") == "1" else tmp_path / "browser-layer.png"
    images.write_picture(steps, out)
    print(f"\npicture: {out} {images.size(out)}")
