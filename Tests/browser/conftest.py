"""Fixtures of the browser suite: a headless Chromium showing the kiosk page
(chromium.py), a private bus with guidedaccessd on it (the integration
suite's gadaemon.py), and the logs of both attached to a failed test's
report. Skipped where Chromium, ImageMagick or websocket-client is missing
(scripts/install-deps installs them).

The launcher's tests (test_launcher.py) have fixtures of their own
(xdisplay.py): an Xvfb display, the kiosk page served over HTTP on
127.0.0.1, and non-headless Chromiums started through `guidedaccessctl
browser` on that display; skipped where Xvfb, xdotool, ImageMagick or
Chromium is missing (not websocket-client: no DevTools client of the
tests' own there)."""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# gadaemon.py: GAEnv, Daemon, Recorder, busctl arguments (shared, not copied).
sys.path.append(str(HERE.parent / "integration"))

import chromium  # noqa: E402
import images  # noqa: E402
import xdisplay  # noqa: E402

PAGE = HERE / "pages" / "kiosk.html"
PAGE_URL = PAGE.as_uri()


def _missing():
    return chromium.missing() + images.missing()


@pytest.fixture
def make_browser(request, tmp_path):
    """Starts headless Chromiums showing the kiosk page (or `url`), each
    with a port and profile of its own; all are killed after the test, and
    none may leave a process behind."""
    missing = _missing()
    if missing:
        pytest.skip(f"cannot run the browser tests here: {', '.join(missing)} missing")
    browsers = []
    request.node._browsers = browsers

    def make(url=PAGE_URL, start=True, **kwargs):
        browser = chromium.Chromium(tmp_path / f"chromium-{len(browsers)}", url, **kwargs)
        browsers.append(browser)
        if start:
            browser.start()
        return browser

    yield make
    left = {browser.endpoint: browser.stop() for browser in browsers}
    assert not any(left.values()), f"Chromium processes still running after the test: {left}"


@pytest.fixture
def browser(make_browser):
    """One headless Chromium showing the kiosk page."""
    return make_browser()


def _private_bus(request, missing):
    import gadaemon

    if missing:
        pytest.skip(f"cannot run the browser tests here: {', '.join(missing)} missing")
    env = gadaemon.GAEnv()
    env.stand_for_no_desktop()
    request.node._ga_env = env
    return env


@pytest.fixture
def ga_env(request):
    """A private session bus (real dconf behind it) with nothing on it that
    stands for a desktop: the service is told its desktop in its config."""
    env = _private_bus(request, _missing())
    yield env
    env.stop()


# ---------------------------------------------------------------- the launcher on an X display


def _display_missing():
    chromium_here = os.access(chromium.CHROMIUM, os.X_OK)
    return ([] if chromium_here else [f"{chromium.CHROMIUM} (apt-get install chromium)"]) + xdisplay.missing() \
        + images.missing()


@pytest.fixture
def launcher_env(request):
    """ga_env for the launcher's tests: skipped only where the display tests
    cannot run (Xvfb, xdotool, ImageMagick, Chromium)."""
    env = _private_bus(request, _display_missing())
    yield env
    env.stop()


@pytest.fixture
def x_display(request, tmp_path):
    """Xvfb on a free display number (Xvfb's pick), 1280x800x24, no TCP."""
    missing = _display_missing()
    if missing:
        pytest.skip(f"cannot run the display tests here: {', '.join(missing)} missing")
    display = xdisplay.Display(tmp_path / "xvfb").start()
    request.node._x_display = display
    yield display
    display.stop()


@pytest.fixture
def page_server():
    """The kiosk page (and the rest of pages/) over HTTP on 127.0.0.1, a free port."""
    server = xdisplay.PageServer(PAGE.parent)
    yield server
    server.stop()


@pytest.fixture
def make_launched_browser(request, tmp_path, x_display, page_server):
    """Starts `guidedaccessctl --address BUS browser -- chromium ... URL`
    on the test's display (default URL: the kiosk page over HTTP), and
    waits until the page covers the screen. Every process of each (the
    launcher, Chromium's, the crash handlers) is killed after the test, and
    none may be left."""
    if not xdisplay.CTL_BINARY.exists():
        pytest.fail(f"{xdisplay.CTL_BINARY} does not exist: build it with 'swift build --product guidedaccessctl' "
                    "or set GUIDEDACCESSCTL", pytrace=False)
    launched = []
    request.node._launched = launched

    def make(env, url=None, start=True, **kwargs):
        browser = xdisplay.LaunchedBrowser(
            tmp_path / f"launcher-{len(launched)}", xdisplay.CTL_BINARY, env.address, x_display,
            url or page_server.url(PAGE.name), env.env, chromium=chromium.CHROMIUM, **kwargs)
        launched.append(browser)
        if start:
            browser.start()
        return browser

    yield make
    left = {browser.pid if browser.process else None: browser.stop() for browser in launched}
    assert not any(left.values()), f"processes of the launcher still running after the test: {left}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    try:
        for browser in getattr(item, "_browsers", []):
            report.sections.append((f"chromium {browser.endpoint} (all runs)", browser.log()[-6000:] or "(empty)"))
        for browser in getattr(item, "_launched", []):
            report.sections.append((f"guidedaccessctl browser and its Chromium ({browser.log_path})",
                                    browser.log()[-6000:] or "(empty)"))
        display = getattr(item, "_x_display", None)
        if display is not None and display.log_path.exists():
            report.sections.append((f"Xvfb {display.name}", display.log_path.read_text(errors="replace")[-3000:]
                                    or "(empty)"))
        env = getattr(item, "_ga_env", None)
        if env is not None:
            for title, text in env.logs():
                report.sections.append((title, text[-8000:] or "(empty)"))
    except Exception as error:  # a courtesy; never mask the failure
        report.sections.append(("logs", f"cannot read the logs: {error}"))
