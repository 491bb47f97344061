"""Debian 12's Chromium, headless, for the browser tests, and a DevTools
client of the tests' own (websocket-client from PyPI, not the service's).

    browser = Chromium(root, url)      # root: a directory of the test's own
    browser.start()                    # waits for the DevTools endpoint and a page
    page = browser.page()              # a DevTools session on the first page target
    page.screenshot(path); page.match_media("(prefers-contrast: more)")
    browser.new_tab(url); browser.restart()   # kill -9, then the same port and profile
    browser.stop()

Chromium runs as `chromium --headless=new --no-sandbox --kiosk
--screen-info={1280x800} --remote-debugging-port=PORT --user-data-dir=DIR
URL` (../shared/notes/real-systems.md, section 5): `--no-sandbox` because
the tests run as root, `--kiosk --screen-info=` for a 1280x800 viewport in
every tab. Chromium forks a dozen processes (zygotes, renderers, GPU and
network services); each start is the leader of a session of its own
(setsid). Its two crash handlers (chrome_crashpad_handler) leave that
session and the process tree (setsid, reparented to init), so every
process also carries GA_BROWSER_TEST=<root> in its environment: kill9() and
stop() kill every process in the sessions it ever led or with that mark,
so nothing outlives a test (also at interpreter exit; the leader dies with
its parent, PR_SET_PDEATHSIG).

What this session of the test's own sets on a page (emulation) is cleared
when it closes; a style sheet it adds stays (it is the DOM). The
measurements use only reads (screenshots, matchMedia, sizes), except in the
harness's self-check."""

import atexit
import base64
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "desktop"))
from gnomeshell import kill_all, session_and_state  # noqa: E402

CHROMIUM = os.environ.get("GA_CHROMIUM", "/usr/bin/chromium")
WIDTH, HEIGHT = 1280, 800
START_TIMEOUT = 30.0
CALL_TIMEOUT = 15.0

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIVE = []  # every Chromium not stopped yet


def missing():
    """What the browser tests need that is not here, as words for a skip."""
    what = []
    if not os.access(CHROMIUM, os.X_OK):
        what.append(f"{CHROMIUM} (apt-get install chromium)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        what.append("websocket-client (scripts/install-deps puts it in .venv)")
    return what


def free_port():
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup():
    os.setsid()
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _marked(pid, mark):
    try:
        return mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def processes_of(sessions, mark):
    """Live (not zombie) pids whose session id is one of `sessions` or
    whose environment holds `mark` (b"NAME=VALUE")."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = session_and_state(int(entry))
            if info and info[1] != "Z" and (info[0] in sessions or _marked(entry, mark)):
                found.append(int(entry))
    return found


class DevToolsError(RuntimeError):
    pass


class Chromium:
    """One headless Chromium with a DevTools endpoint on 127.0.0.1:port and
    a profile in root/profile; restartable on the same port and profile."""

    def __init__(self, root, url, port=None, extra_args=()):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.profile = self.root / "profile"
        self.url = url
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.log_path = self.root / "chromium.log"
        self._log = open(self.log_path, "ab")
        self.process = None
        self.sessions = set()  # session ids this object's starts led
        self.mark = f"GA_BROWSER_TEST={self.root}"
        self._children = []
        self._pages = []
        self.runs = 0
        _LIVE.append(self)

    @property
    def endpoint(self):
        """What the service's [Browser] DevToolsEndpoint= names."""
        return f"http://127.0.0.1:{self.port}"

    def argv(self):
        return [CHROMIUM, "--headless=new", "--no-sandbox", "--kiosk", f"--screen-info={{{WIDTH}x{HEIGHT}}}",
                f"--remote-debugging-port={self.port}", f"--user-data-dir={self.profile}",
                *self.extra_args, self.url]

    def start(self, timeout=START_TIMEOUT):
        """Starts Chromium and waits until its endpoint lists a page whose
        document has loaded."""
        self.runs += 1
        self._log.write(f"\n===== run {self.runs}: {' '.join(self.argv())}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            self.argv(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            env={**os.environ, "LANG": "C.UTF-8", "GA_BROWSER_TEST": str(self.root)}, preexec_fn=_setup)
        self.sessions.add(self.process.pid)  # the leader of a new session: its sid is its pid
        self._children.append(self.process)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}\n{self.log()[-3000:]}")
            try:
                pages = self.pages()
                if pages:
                    page = self.page(pages[0])
                    try:
                        page.wait_loaded()
                    finally:
                        page.close()
                    return
            except (OSError, DevToolsError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium's DevTools endpoint {self.endpoint} did not list a loaded page "
                                   f"within {timeout} s\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def kill9(self):
        """SIGKILL to every process of this browser (a crash, as the kiosk
        sees it); returns when the endpoint no longer answers."""
        self._close_pages()
        kill_all(lambda: processes_of(self.sessions, self.mark.encode()), self._children)
        deadline = time.monotonic() + 5
        while self._answers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.endpoint} still answers after kill -9")
            time.sleep(0.02)

    def restart(self, timeout=START_TIMEOUT):
        """kill -9, then start again on the same port and profile (what a
        kiosk's supervisor does); returns the seconds until the endpoint
        listed a loaded page again."""
        self.kill9()
        begun = time.monotonic()
        self.start(timeout)
        return time.monotonic() - begun

    def processes(self):
        """Every live process of this browser, of all its runs."""
        return processes_of(self.sessions, self.mark.encode())

    def stop(self):
        """Kills every process this browser ever started; returns the pids
        still alive afterwards (none)."""
        if self in _LIVE:
            _LIVE.remove(self)
        self._close_pages()
        kill_all(lambda: processes_of(self.sessions, self.mark.encode()), self._children)
        self._log.close()
        return self.processes()

    def log(self):
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    # -- the HTTP side of the endpoint

    def http(self, path, method="GET", timeout=5.0):
        request = urllib.request.Request(self.endpoint + path, method=method)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read().decode())

    def _answers(self):
        try:
            self.http("/json/version", timeout=1)
            return True
        except (OSError, ValueError):
            return False

    def targets(self):
        return self.http("/json/list")

    def pages(self):
        """The page targets (the browser's own UI, such as the omnibox
        popup, is listed too, with another type)."""
        return [t for t in self.targets() if t.get("type") == "page"]

    def new_tab(self, url):
        """Opens a tab (`PUT /json/new?URL`), waits until its document has
        loaded, and returns a DevTools session on it."""
        target = self.http("/json/new?" + urllib.parse.quote(url, safe=":/?=&#%"), method="PUT")
        page = self.page(target)
        page.wait_loaded(url)
        return page

    def page(self, target=None):
        """A DevTools session on a page target (default: the first page the
        endpoint lists), closed with the browser at the latest."""
        if target is None:
            pages = self.pages()
            if not pages:
                raise DevToolsError(f"{self.endpoint} lists no page")
            target = pages[0]
        page = Page(target["webSocketDebuggerUrl"], target["id"])
        self._pages.append(page)
        return page

    def _close_pages(self):
        for page in self._pages:
            page.close()
        self._pages.clear()


class Page:
    """A DevTools session of the test's own on one page target: commands in
    order, one at a time; events are read and dropped."""

    def __init__(self, ws_url, target_id=None):
        import websocket

        self.target_id = target_id
        self.ws_url = ws_url
        # No Origin header: Chromium refuses WebSocket origins it was not
        # told to allow (--remote-allow-origins), and a client without one.
        self.ws = websocket.create_connection(ws_url, timeout=CALL_TIMEOUT, suppress_origin=True,
                                              enable_multithread=False)
        self._next_id = 0

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass

    def call(self, method, timeout=CALL_TIMEOUT, **params):
        import websocket

        self._next_id += 1
        ident = self._next_id
        try:
            self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        except (websocket.WebSocketException, OSError) as error:
            raise DevToolsError(f"{method}: cannot send: {error}") from None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DevToolsError(f"{method}: no answer within {timeout} s")
            self.ws.settimeout(remaining)
            try:
                message = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                raise DevToolsError(f"{method}: no answer within {timeout} s") from None
            except websocket.WebSocketConnectionClosedException:
                raise DevToolsError(f"{method}: the browser closed the connection") from None
            if message.get("id") != ident:
                continue  # an event
            if "error" in message:
                raise DevToolsError(f"{method}: {message['error']}")
            return message.get("result", {})

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (JSON-able)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def match_media(self, query):
        return self.evaluate(f"matchMedia({json.dumps(query)}).matches")

    def media(self):
        """The media features the browser layer emulates, as the page sees them."""
        return {query: self.match_media(query) for query in MEDIA_QUERIES}

    def rect(self, selector):
        """getBoundingClientRect() of an element, in CSS px as the page reports them."""
        return self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect(); "
            "return {x: r.x, y: r.y, width: r.width, height: r.height}; })()")

    def font_size(self, selector):
        """The computed font size of an element, in px."""
        value = self.evaluate(f"getComputedStyle(document.querySelector({json.dumps(selector)})).fontSize")
        return float(value.removesuffix("px"))

    def location(self):
        return self.evaluate("location.href")

    def wait_loaded(self, url=None, timeout=10.0):
        """Until the document (at `url`, if given) has loaded."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                state = self.evaluate("[document.readyState, location.href]")
                if state[0] == "complete" and (url is None or state[1] == url):
                    return
            except DevToolsError:
                state = None  # between documents
            if time.monotonic() > deadline:
                raise TimeoutError(f"page not loaded within {timeout} s (readyState, href = {state})")
            time.sleep(0.05)

    def navigate(self, url):
        self.call("Page.navigate", url=url)
        self.wait_loaded(url)

    def screenshot(self, path):
        """The page's viewport as a PNG file (Page.captureScreenshot waits
        for a fresh frame). The tab is brought to the front first: a
        background tab's capture, after a navigation in it while another
        client had Page.enable and a new-document script on it, sometimes
        never answers (Chromium 156 headless, seen one time in two); in
        front it always does."""
        self.call("Page.bringToFront")
        data = self.call("Page.captureScreenshot", format="png", fromSurface=True)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)


MEDIA_QUERIES = ("(prefers-contrast: more)", "(forced-colors: active)", "(prefers-reduced-motion: reduce)")


@atexit.register
def _stop_all():
    for browser in list(_LIVE):
        browser.stop()
