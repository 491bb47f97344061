"""Fixtures of the browser suite: a headless Chromium showing the kiosk page
(chromium.py), a private bus with guidedaccessd on it (the integration
suite's gadaemon.py), and the logs of both attached to a failed test's
report. Skipped where Chromium, ImageMagick or websocket-client is missing
(scripts/install-deps installs them)."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# gadaemon.py: GAEnv, Daemon, Recorder, busctl arguments (shared, not copied).
sys.path.append(str(HERE.parent / "integration"))

import chromium  # noqa: E402
import images  # noqa: E402

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


@pytest.fixture
def ga_env(request):
    """A private session bus (real dconf behind it) with nothing on it that
    stands for a desktop: the service is told its desktop in its config."""
    import gadaemon

    if _missing():
        pytest.skip(f"cannot run the browser tests here: {', '.join(_missing())} missing")
    env = gadaemon.GAEnv()
    env.stand_for_no_desktop()
    request.node._ga_env = env
    yield env
    env.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    try:
        for browser in getattr(item, "_browsers", []):
            report.sections.append((f"chromium {browser.endpoint} (all runs)", browser.log()[-6000:] or "(empty)"))
        env = getattr(item, "_ga_env", None)
        if env is not None:
            for title, text in env.logs():
                report.sections.append((title, text[-8000:] or "(empty)"))
    except Exception as error:  # a courtesy; never mask the failure
        report.sections.append(("logs", f"cannot read the logs: {error}"))
