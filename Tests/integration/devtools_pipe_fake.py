#!/usr/bin/python3
"""A fake Chromium with `--remote-debugging-pipe`, for `guidedaccessctl
browser` and AttachBrowser (test_ga_browser_pipe.py): what a browser on
the DevTools pipe does, and what a hostile one does, which real Chromium
cannot be made to do. Pure standard library.

The pipe (Chromium's): each DevTools message is its JSON text followed by
one NUL byte, no WebSocket; the browser reads commands from one descriptor
and writes replies and events to another.

Two ways to use it:

- As the launcher's COMMAND (`guidedaccessctl browser -- devtools_pipe_fake.py`;
  it is its own argv[0], `#!/usr/bin/python3`, so that the launcher's
  `--remote-debugging-pipe`, inserted right after argv[0], reaches it as
  sys.argv[1]): reads fd 3, writes fd 4, as Chromium does; configured by
  environment variables (below); records everything in a JSON-lines log.
- In the test's own process (`FakePipeBrowser(sock.fileno(), sock.fileno())`
  on one end of a socketpair whose other end a test hands to AttachBrowser
  with dbus-python): the same browser, its records in memory too.

What it models: N pages (PAGE1..PAGEN). Browser.getVersion answers
{"product": PRODUCT, ...}. Target.setAutoAttach {autoAttach: true} first
sends one Target.attachedToTarget per page not attached yet (a new sessionId
each time: PAGEk-S<n>), then the reply; {autoAttach: false} sends
Target.detachedFromTarget for each attached page, then the reply.
Target.detachFromTarget detaches one. Every command to a page session is
answered {} (Page.addScriptToEvaluateOnNewDocument: {"identifier": "N"},
Runtime.evaluate: {"result": {"type": "undefined"}}); a command to a session
it does not know gets Chromium's error -32001. Any other browser command: {}.
It exits 0 when fd 3 reaches its end (as Chromium does when its launcher
goes).

The log (FAKE_LOG, or `log=` in-process): one JSON object a line, flushed,
each with "t" (time.monotonic(), CLOCK_MONOTONIC: comparable with the
test's own) and "kind":
- "start": pid, argv, pipe (whether argv[1] is --remote-debugging-pipe),
  fds ({fd: readlink of /proc/self/fd/fd}), fd3/fd4 (their file types);
- "recv": a command received: id, method, sessionId, params, target (the
  targetId of the page the session is attached to; None: the browser);
- "bad": something received that is not a JSON command with an integer id
  and a string method (a launcher that cut a message, or glued two);
- "signal": a signal received (signum, name);
- "mode": a hostile mode's progress (mode, state): "started"; "stopped"
  (sent: what the flood sent, commands: commands to flood pages by
  method); "sent" (huge: its FAKE_HUGE_COUNT messages are out, with
  messages, bytes); "thawed" (frozen: answered, the commands it held);
- "exit": status, why.
Commands to the attach flood's pages are counted ("mode" records), not
logged one by one.

Environment (program):
  FAKE_LOG            the log's path (default: none)
  FAKE_PAGES          pages (default 2)
  FAKE_PRODUCT        Browser.getVersion's product (default FakeChrome/1.0)
  FAKE_EXIT_ON        a method (e.g. Runtime.evaluate) or a signal name
                      (SIGUSR1) on which it exits with FAKE_EXIT_STATUS
  FAKE_EXIT_STATUS    that status (default 0)
  FAKE_ON_TERM        what SIGTERM, SIGINT and SIGHUP do, after the
                      "signal" record: a number, exit with it (default 0,
                      as a browser closing cleanly); "die": die of the
                      signal itself (default action, re-raised)
  FAKE_MODE           a hostile mode:
                        events  Runtime.consoleAPICalled events as fast as
                                it can (or FAKE_RATE a second), on a page's
                                session, while it still answers commands;
                        attach  endless Target.attachedToTarget for new
                                pages (FLOOD-S<n>, FLOODPAGE<n>), whose
                                commands get replies;
                        huge    messages of FAKE_HUGE_BYTES (default 3 MiB,
                                over the service's 1 MiB limit),
                                FAKE_HUGE_COUNT of them (default 0: until
                                stopped), then one small event;
                        garbage NUL-terminated messages that are not
                                DevTools (not JSON, not UTF-8, JSON that is
                                no message) as fast as it can;
                        frozen  reads and records, but answers nothing and
                                sends nothing (a hung DevTools thread);
                                once stopped, it answers what it held,
                                in order, late.
  FAKE_MODE_START     when the mode starts: "signal" (SIGUSR1; default),
                      "now", or "attach" (right after it answered its first
                      Target.setAutoAttach {autoAttach: true}).
  SIGUSR2 stops the mode (the flood stops; a frozen fake answers the
  commands it held, then every new one).
"""

import json
import os
import signal
import stat
import sys
import threading
import time

LAUNCHER_IDS = 2 ** 30  # the launcher's own commands have ids above this

GARBAGE = [
    b"this is not JSON",
    b"\xff\xfe\xfd not UTF-8",
    b"[1, 2, 3]",
    b'{"id": "7", "result": {}}',
    b'{"result": {}}',
    b"{",
    b"",
]


def file_type(fd):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return "closed"
    for test, name in ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISREG, "file"),
                       (stat.S_ISCHR, "chardev"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "other"


def open_fds():
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return fds


class FakePipeBrowser:
    def __init__(self, read_fd, write_fd, pages=2, product="FakeChrome/1.0", log=None, mode=None,
                 mode_start="signal", exit_on=None, exit_status=0, huge_bytes=3 * 1024 * 1024, huge_count=0,
                 rate=0, exit_process=False):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.product = product
        self.pages = [(f"PAGE{i + 1}", f"https://kiosk.example/{i + 1}") for i in range(pages)]
        self.mode = mode
        self.mode_start = mode_start
        self.exit_on = exit_on
        self.exit_status = exit_status
        self.huge_bytes = huge_bytes
        self.huge_count = huge_count
        self.rate = rate  # events a second of the events flood (0: as fast as it can)
        self.exit_process = exit_process  # the program: os._exit; in-process: the reader ends

        self.lock = threading.Condition()
        self.write_lock = threading.Lock()
        self.records = []
        self.sessions = {}  # sessionId → targetId, attached now
        self.flood_sessions = 0
        self.flood_commands = {}
        self.sent = {}
        self.active = None  # the hostile mode running now
        self.ended = None  # why the reader stopped
        self._next_session = 0
        self._next_script = 0
        self._attach_seen = False
        self.held = []  # commands received while frozen, answered when it thaws
        self._log = open(log, "a", buffering=1) if log else None
        self._thread = None

    # ------------------------------------------------------------ records

    def record(self, kind, **fields):
        entry = {"t": time.monotonic(), "kind": kind, **fields}
        with self.lock:
            self.records.append(entry)
            self.lock.notify_all()
        if self._log is not None:
            try:
                self._log.write(json.dumps(entry) + "\n")
            except (OSError, ValueError):
                pass

    def received(self, method=None, since=0.0, target=None, browser_only=False):
        with self.lock:
            return [r for r in self.records if r["kind"] == "recv"
                    and (method is None or r["method"] == method) and r["t"] >= since
                    and (target is None or r["target"] == target)
                    and (not browser_only or r["sessionId"] is None)]

    def wait(self, condition, timeout):
        deadline = time.monotonic() + timeout
        with self.lock:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return condition()
                self.lock.wait(min(remaining, 0.05))
            return True

    # ------------------------------------------------------------ running

    def start(self):
        """In-process: reads on a thread of its own."""
        self._thread = threading.Thread(target=self.run, daemon=True, name="fake-pipe-browser")
        self._thread.start()
        return self

    def run(self):
        if self.mode is not None and self.mode_start == "now":
            self.start_mode()
        buffer = bytearray()
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError as error:
                self.finish(0, f"read: {error}")
                return
            if not chunk:
                self.finish(0, "eof")
                return
            buffer += chunk
            while True:
                end = buffer.find(b"\0")
                if end < 0:
                    break
                message = bytes(buffer[:end])
                del buffer[:end + 1]
                self.command(message)
                if self.ended is not None:
                    return

    def finish(self, status, why):
        with self.lock:
            self.active = None
            self.ended = why
            self.lock.notify_all()
        self.record("exit", status=status, why=why)
        if self.exit_process:
            os._exit(status)

    def close(self):
        """In-process: stops the modes (the owner closes the socket)."""
        with self.lock:
            self.active = None
            self.lock.notify_all()

    def send(self, obj_or_bytes):
        data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
        return self.send_raw(data + b"\0")

    def send_raw(self, data):
        with self.write_lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self.write_fd, view)
                except InterruptedError:
                    continue
                except OSError:
                    return False
                view = view[n:]
        return True

    # ------------------------------------------------------------ commands

    def command(self, data):
        try:
            message = json.loads(data)
            id_, method = message["id"], message["method"]
            if not isinstance(id_, int) or isinstance(id_, bool) or not isinstance(method, str):
                raise ValueError("id or method of the wrong type")
        except Exception as error:  # noqa: BLE001 — whatever it is, the sender's fault
            self.record("bad", data=data[:300].decode("latin-1"), length=len(data), error=repr(error))
            return
        params = message.get("params", {}) or {}
        session = message.get("sessionId")
        if isinstance(session, str) and session.startswith("FLOOD-S"):
            with self.lock:
                self.flood_commands[method] = self.flood_commands.get(method, 0) + 1
                frozen = self.active == "frozen"
            if not frozen:
                self.send({"id": id_, "sessionId": session, "result": self.page_result(method)})
            return
        with self.lock:
            target = self.sessions.get(session) if session is not None else None
            frozen = self.active == "frozen"
        self.record("recv", id=id_, method=method, sessionId=session, params=params, target=target)
        if self.exit_on == method:
            self.finish(self.exit_status, f"on {method}")
            return
        if frozen:
            with self.lock:
                self.held.append((id_, method, session, params))
            return
        self.respond(id_, method, session, params)

    def respond(self, id_, method, session, params):
        with self.lock:
            target = self.sessions.get(session) if session is not None else None
        if session is not None:
            if target is None:
                self.send({"id": id_, "sessionId": session,
                           "error": {"code": -32001, "message": "Session with given id not found."}})
            else:
                self.send({"id": id_, "sessionId": session, "result": self.page_result(method)})
            return
        if method == "Browser.getVersion":
            self.send({"id": id_, "result": {"protocolVersion": "1.3", "product": self.product,
                                             "revision": "@fake", "userAgent": "Mozilla/5.0 (fake)",
                                             "jsVersion": "0.0"}})
        elif method == "Target.setAutoAttach":
            if params.get("autoAttach"):
                for target_id, url in self.pages:
                    with self.lock:
                        if target_id in self.sessions.values():
                            continue
                        self._next_session += 1
                        session_id = f"{target_id}-S{self._next_session}"
                        self.sessions[session_id] = target_id
                    self.send({"method": "Target.attachedToTarget", "params": {
                        "sessionId": session_id,
                        "targetInfo": {"targetId": target_id, "type": "page", "title": target_id, "url": url,
                                       "attached": True, "canAccessOpener": False, "browserContextId": "CTX"},
                        "waitingForDebugger": False}})
            else:
                with self.lock:
                    attached = list(self.sessions.items())
                    self.sessions.clear()
                for session_id, target_id in attached:
                    self.send({"method": "Target.detachedFromTarget",
                               "params": {"sessionId": session_id, "targetId": target_id}})
            self.send({"id": id_, "result": {}})
            if params.get("autoAttach") and not self._attach_seen:
                self._attach_seen = True
                if self.mode is not None and self.mode_start == "attach":
                    self.start_mode()
        elif method == "Target.detachFromTarget":
            detach = params.get("sessionId", "")
            if str(detach).startswith("FLOOD-S"):
                self.send({"method": "Target.detachedFromTarget",
                           "params": {"sessionId": detach, "targetId": "FLOODPAGE" + detach[len("FLOOD-S"):]}})
                self.send({"id": id_, "result": {}})
                return
            with self.lock:
                target_id = self.sessions.pop(detach, None)
            if target_id is None:
                self.send({"id": id_, "error": {"code": -32602, "message": "No session with given id"}})
                return
            self.send({"method": "Target.detachedFromTarget", "params": {"sessionId": detach, "targetId": target_id}})
            self.send({"id": id_, "result": {}})
        elif method == "Target.getTargets":
            self.send({"id": id_, "result": {"targetInfos": [
                {"targetId": t, "type": "page", "title": t, "url": u, "attached": t in self.sessions.values(),
                 "canAccessOpener": False, "browserContextId": "CTX"} for t, u in self.pages]}})
        else:
            self.send({"id": id_, "result": {}})

    def page_result(self, method):
        if method == "Page.addScriptToEvaluateOnNewDocument":
            with self.lock:
                self._next_script += 1
                return {"identifier": str(self._next_script)}
        if method == "Runtime.evaluate":
            return {"result": {"type": "undefined"}}
        return {}

    # ------------------------------------------------------------ hostile modes

    def start_mode(self):
        with self.lock:
            if self.active is not None or self.mode is None:
                return
            self.active = self.mode
            self.lock.notify_all()
        self.record("mode", mode=self.mode, state="started")
        body = {"events": self.flood_events, "attach": self.flood_attach, "huge": self.flood_huge,
                "garbage": self.flood_garbage}.get(self.mode)
        if body is not None:
            threading.Thread(target=body, daemon=True, name=f"fake-pipe-{self.mode}").start()

    def stop_mode(self):
        with self.lock:
            was = self.active
            self.active = None
            self.lock.notify_all()
            sent, commands = dict(self.sent), dict(self.flood_commands)
        if was is not None:
            self.record("mode", mode=was, state="stopped", sent=sent, commands=commands)
        if was == "frozen":
            threading.Thread(target=self.thaw, daemon=True, name="fake-pipe-thaw").start()

    def thaw(self):
        with self.lock:
            held, self.held = self.held, []
        for command in held:
            self.respond(*command)
        self.record("mode", mode="frozen", state="thawed", answered=len(held))

    def flooding(self, mode):
        with self.lock:
            return self.active == mode and self.ended is None

    def count(self, what, n):
        with self.lock:
            self.sent[what] = self.sent.get(what, 0) + n

    def flood_events(self):
        with self.lock:
            session = next(iter(self.sessions), None)
        event = {"method": "Runtime.consoleAPICalled", "params": {
            "type": "log", "args": [{"type": "string", "value": "flood"}], "executionContextId": 1,
            "timestamp": 1.0}}
        if session is not None:
            event["sessionId"] = session
        batch = (json.dumps(event).encode() + b"\0") * 256
        started, sent = time.monotonic(), 0
        while self.flooding("events"):
            if self.rate:
                ahead = sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            if not self.send_raw(batch):
                return
            sent += 256
            self.count("events", 256)

    def flood_attach(self):
        while self.flooding("attach"):
            with self.lock:
                first = self.flood_sessions + 1
                self.flood_sessions += 64
            batch = b"".join(
                json.dumps({"method": "Target.attachedToTarget", "params": {
                    "sessionId": f"FLOOD-S{n}",
                    "targetInfo": {"targetId": f"FLOODPAGE{n}", "type": "page", "title": f"flood {n}",
                                   "url": f"https://kiosk.example/flood/{n}", "attached": True,
                                   "canAccessOpener": False, "browserContextId": "CTX"},
                    "waitingForDebugger": False}}).encode() + b"\0"
                for n in range(first, first + 64))
            if not self.send_raw(batch):
                return
            self.count("attach", 64)

    def flood_huge(self):
        prefix = b'{"method": "Page.frameNavigated", "params": {"url": "data:,'
        suffix = b'"}}\0'
        body = prefix + b"y" * (self.huge_bytes - len(prefix) - len(suffix) + 1) + suffix
        n = 0
        while self.flooding("huge") and (self.huge_count == 0 or n < self.huge_count):
            # In pieces, as a pipe delivers it.
            for offset in range(0, len(body), 65536):
                if not self.send_raw(body[offset:offset + 65536]):
                    return
            n += 1
            self.count("huge", 1)
        self.send({"method": "Page.loadEventFired", "params": {"timestamp": 1.0}})
        self.record("mode", mode="huge", state="sent", messages=n, bytes=len(body) - 1)

    def flood_garbage(self):
        batch = b"".join(g + b"\0" for g in GARBAGE) * 64
        while self.flooding("garbage"):
            if not self.send_raw(batch):
                return
            self.count("garbage", 64 * len(GARBAGE))


def main():
    env = os.environ
    log = env.get("FAKE_LOG")
    exit_on = env.get("FAKE_EXIT_ON") or None
    browser = FakePipeBrowser(
        3, 4, pages=int(env.get("FAKE_PAGES", "2")), product=env.get("FAKE_PRODUCT", "FakeChrome/1.0"), log=log,
        mode=env.get("FAKE_MODE") or None, mode_start=env.get("FAKE_MODE_START", "signal"),
        exit_on=exit_on, exit_status=int(env.get("FAKE_EXIT_STATUS", "0")),
        huge_bytes=int(env.get("FAKE_HUGE_BYTES", str(3 * 1024 * 1024))),
        huge_count=int(env.get("FAKE_HUGE_COUNT", "0")), rate=float(env.get("FAKE_RATE", "0")),
        exit_process=True)
    browser.record("start", pid=os.getpid(), argv=sys.argv,
                   pipe=len(sys.argv) > 1 and sys.argv[1] == "--remote-debugging-pipe",
                   fds={str(k): v for k, v in open_fds().items()}, fd3=file_type(3), fd4=file_type(4))

    on_term = env.get("FAKE_ON_TERM", "0")

    def terminated(signum, frame):
        browser.record("signal", signum=signum, name=signal.Signals(signum).name)
        if on_term == "die":
            browser.record("exit", status=-signum, why=f"dies of {signal.Signals(signum).name}")
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            time.sleep(5)
        browser.record("exit", status=int(on_term), why=signal.Signals(signum).name)
        os._exit(int(on_term))

    def usr1(signum, frame):
        browser.record("signal", signum=signum, name="SIGUSR1")
        if exit_on == "SIGUSR1":
            browser.finish(browser.exit_status, "on SIGUSR1")
        browser.start_mode()

    def usr2(signum, frame):
        browser.record("signal", signum=signum, name="SIGUSR2")
        if exit_on == "SIGUSR2":
            browser.finish(browser.exit_status, "on SIGUSR2")
        browser.stop_mode()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, terminated)
    signal.signal(signal.SIGUSR1, usr1)
    signal.signal(signal.SIGUSR2, usr2)
    if file_type(3) == "closed" or file_type(4) == "closed":
        browser.record("exit", status=2, why="no DevTools pipe on fds 3 and 4")
        sys.stderr.write("devtools_pipe_fake: no DevTools pipe on fds 3 and 4\n")
        os._exit(2)
    # The reader on a thread of its own: signal handlers run in the main
    # thread, which only waits (a handler never interrupts a write halfway).
    reader = threading.Thread(target=browser.run, daemon=True, name="reader")
    reader.start()
    while reader.is_alive():
        reader.join(0.2)
    os._exit(0)


if __name__ == "__main__":
    main()
