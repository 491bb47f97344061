"""A fake Chromium DevTools endpoint for guidedaccessd's browser-layer fault
tests: what a misbehaving browser does, which real Chromium cannot be made
to do. Pure standard library (socket, threading), with a minimal WebSocket
server side of our own (RFC 6455): the HTTP upgrade and its
Sec-WebSocket-Accept, masked client frames in, unmasked frames out.

    fake = FakeDevTools(pages=3)      # listening on 127.0.0.1:fake.port
    ...
    fake.close()

What it serves:
- GET /json/version: {"Browser": ..., "webSocketDebuggerUrl":
  "ws://127.0.0.1:PORT/devtools/browser/<uuid>"} (Content-Length, then the
  connection is closed, as Chromium does).
- GET /devtools/browser/<uuid> with an Upgrade: the browser target.
  Target.setAutoAttach {autoAttach: true} first sends one
  Target.attachedToTarget event per page ({sessionId, targetInfo: {targetId,
  type, url, ...}, waitingForDebugger: false}; a new sessionId per attach),
  then the reply; {autoAttach: false} detaches them (Target.detachedFromTarget
  each), then the reply. Target.detachFromTarget detaches one. Every command
  to a page session gets {"id": .., "result": {}}
  (Page.addScriptToEvaluateOnNewDocument: {"identifier": "N"}).

What it records (under `fake.lock`; read them through the methods):
- `messages`: every WebSocket message received, as Message(conn, time,
  id, method, session, params, target) — `target` is the targetId of the
  session the command went to (None for the browser target);
- `connections`: every TCP connection accepted, as Connection(number, kind,
  opened, closed); kind is "version" (GET /json/version), "websocket"
  (upgraded), "silent", or "other";
- `client_errors`: anything the client sent that RFC 6455 forbids a client
  (an unmasked frame, reserved bits, a fragmented frame), or that is not a
  JSON command with an integer id and a method;
- `pongs`: the payloads of the pong frames received.

Behaviours, set as attributes (also while running; each connection reads
them when it needs them):
- `hung_targets`: targetIds whose sessions' commands never get a reply;
- `frozen`: no command gets a reply, nor sends an event (a browser that is
  stopped, or whose DevTools thread hangs, after the WebSocket opened);
- `silent`: accept TCP, read and discard, never answer (nor close);
- `silent_upgrade`: /json/version answers, the WebSocket upgrade never does;
- `version_answer`: raw bytes sent instead of the /json/version response
  (then the connection is closed);
- `ws_url`: the webSocketDebuggerUrl to announce instead of ours;
- `handshake_answer`: raw bytes sent instead of the 101 response;
- `after_handshake`: a list of raw byte strings; each new WebSocket
  connection takes the first (if any) and sends it right after the 101;
- `extra_targets`: more targets attached with the pages, as (targetId, type);
- `stall_after_attach`: seconds the connection stops reading after it
  answered a Target.setAutoAttach {autoAttach: true} (with `rcvbuf`, a small
  receive buffer, the service's writes then block).
- `flood`: a hostile browser (test_ga_hostile_peers.py), read by each
  new WebSocket connection (and, for "attach", by each
  Target.setAutoAttach {autoAttach: true} it answers):
  "events": right after the 101, small events
  ({"method": "Page.frameNavigated", "params": {}}) as fast as it can, while
  it still answers commands; "attach": after it answered auto-attach,
  endless Target.attachedToTarget events for new pages (sessionId
  FLOOD-S<n>, targetId FLOODPAGE<n>, type page), whose commands get replies
  (counted in `flood_commands`, not recorded in `messages`); "pings": right
  after the 101, ping frames as fast as it can, and it never reads its
  socket again (with `rcvbuf`, the service's pongs back up at once);
  "flap": the connection closed `flap_after` s (0.01) after the 101.
  `flooded` counts the frames the floods sent.
Actions: `inject(raw)` sends raw bytes on the live WebSocket connections;
`drop()` closes them (the browser going away mid-session, or restarting);
`close()` stops listening and closes everything.

Run as a program (`python3 devtools_fake.py --port P [--pages N] [--flood
KIND]`, e.g. as another user through setpriv), it serves until killed and
prints, one line each, flushed: `listening PORT`, then `accepted N` for
every TCP connection, `kind N KIND` once its kind is known (version,
websocket, silent, other), `message N METHOD` for every command received,
and `closed N`.
"""

import base64
import hashlib
import json
import socket
import struct
import sys
import threading
import time
import uuid
from collections import namedtuple

ACCEPT_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

Message = namedtuple("Message", "conn time id method session params target")


class Connection:
    def __init__(self, number, sock):
        self.number = number
        self.sock = sock
        self.kind = "other"
        self.opened = time.monotonic()
        self.closed = None
        self.send_lock = threading.Lock()
        # sessionId → targetId, attached on this connection.
        self.sessions = {}

    def send(self, data):
        with self.send_lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def __repr__(self):
        return f"Connection({self.number}, {self.kind}, open={self.closed is None})"


def accept_for(key):
    """The Sec-WebSocket-Accept for a Sec-WebSocket-Key."""
    return base64.b64encode(hashlib.sha1(key.encode() + ACCEPT_GUID).digest()).decode()


def frame(opcode, payload, fin=True, rsv=0, mask=None, length=None):
    """One server frame: unmasked unless `mask` (4 bytes) is given; `rsv`
    is or-ed into the first byte (0x40, 0x20, 0x10); `length` overrides the
    length field (the payload sent is `payload` all the same)."""
    if isinstance(payload, str):
        payload = payload.encode()
    out = bytearray([(0x80 if fin else 0) | rsv | opcode])
    n = len(payload) if length is None else length
    mask_bit = 0x80 if mask is not None else 0
    if n < 126:
        out.append(mask_bit | n)
    elif n < 65536:
        out.append(mask_bit | 126)
        out += struct.pack(">H", n)
    else:
        out.append(mask_bit | 127)
        out += struct.pack(">Q", n)
    if mask is not None:
        out += mask
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes(out) + payload


def text(obj):
    return frame(0x1, json.dumps(obj))


class FakeDevTools:
    def __init__(self, pages=2, browser="FakeChrome/1.0", listen=True, rcvbuf=None, port=0):
        self.browser = browser
        self.browser_id = str(uuid.uuid4())
        self.pages = [(f"PAGE{i + 1}", f"https://kiosk.example/{i + 1}") for i in range(pages)]
        self.extra_targets = []
        self.hung_targets = set()
        self.frozen = False
        self.silent = False
        self.silent_upgrade = False
        self.version_answer = None
        self.ws_url = None
        self.handshake_answer = None
        self.after_handshake = []
        self.stall_after_attach = 0
        self.flood = None
        self.flap_after = 0.01

        self.lock = threading.Condition()
        self.messages = []
        self.connections = []
        self.client_errors = []
        # Pong frames received (answers to pings the fake sent).
        self.pongs = []
        self._next_session = 0
        self._next_script = 0
        self._closing = False
        # Frames sent by the floods, by kind; commands to flood pages, by method.
        self.flooded = {}
        self.flood_commands = {}
        self._next_flood_page = 0
        # For the program: called (outside the lock) with one line per happening.
        self.on_happening = None

        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if rcvbuf is not None:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.listener.bind(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = None
        if listen:
            self.listen()

    def listen(self):
        """Starts accepting (a fake made with listen=False has its port
        bound but refuses connections until then)."""
        self.listener.listen(16)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="fake-devtools")
        self._thread.start()

    # ------------------------------------------------------------ for tests

    def config(self, service="[Service]\nDesktop=none\n"):
        """A guidedaccessd configuration naming this endpoint."""
        return f"{service}[Browser]\nDevToolsEndpoint={self.endpoint}\n"

    def received(self, method=None, conn=None, since=0.0, target=None, browser_only=False):
        """The messages received (optionally: of this method, on connection
        number `conn`, at or after monotonic time `since`, sent to the page
        `target`, or only those to the browser target)."""
        with self.lock:
            return [
                m for m in self.messages
                if (method is None or m.method == method) and (conn is None or m.conn == conn)
                and m.time >= since and (target is None or m.target == target)
                and (not browser_only or m.session is None)
            ]

    def websockets(self):
        with self.lock:
            return [c for c in self.connections if c.kind == "websocket"]

    def kinds(self):
        with self.lock:
            return [c.kind for c in self.connections]

    def live_websockets(self):
        with self.lock:
            return [c for c in self.connections if c.kind == "websocket" and c.closed is None]

    def wait(self, condition, timeout):
        """Waits until condition() (called under the lock) is true; returns it."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return condition()
                self.lock.wait(min(remaining, 0.05))
            return True

    def wait_for_message(self, method, timeout, **filters):
        """The first message of `method` (matching `filters`, see
        received()), waiting up to `timeout` s; None if none came."""
        found = []

        def condition():
            found[:] = self.received(method, **filters)
            return bool(found)

        self.wait(condition, timeout)
        return found[0] if found else None

    def inject(self, raw):
        """Sends raw bytes on every live WebSocket connection; how many."""
        live = self.live_websockets()
        for c in live:
            c.send(raw)
        return len(live)

    def drop(self):
        """Closes every live WebSocket connection (the browser going away)."""
        live = self.live_websockets()
        for c in live:
            self._close(c)
        return len(live)

    def close(self):
        self._closing = True
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            connections = list(self.connections)
        for c in connections:
            self._close(c)

    def summary(self, last=200):
        """For assertion messages: the connections, the last `last`
        messages received, the client's errors."""
        with self.lock:
            lines = [f"{c!r} opened {c.opened:.3f}" for c in self.connections]
            lines += [f"{m.conn} {m.time:.3f} {m.method} {m.target or ''} {json.dumps(m.params)[:120]}"
                      for m in self.messages[-last:]]
            lines += [f"client error: {e}" for e in self.client_errors]
        return "\n".join(lines)

    def logs(self):
        """For conftest's report hook, which attaches these on failure."""
        return [(f"fake DevTools endpoint {self.endpoint}", self.summary())]

    # ------------------------------------------------------------ inside

    def _close(self, c):
        try:
            c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            c.sock.close()
        except OSError:
            pass
        with self.lock:
            first = c.closed is None
            if c.closed is None:
                c.closed = time.monotonic()
            self.lock.notify_all()
        if first:
            self._happened(f"closed {c.number}")

    def _accept_loop(self):
        while not self._closing:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                c = Connection(len(self.connections) + 1, sock)
                self.connections.append(c)
                self.lock.notify_all()
            self._happened(f"accepted {c.number}")
            threading.Thread(target=self._serve, args=(c,), daemon=True, name=f"fake-devtools-{c.number}").start()

    def _serve(self, c):
        try:
            if self.silent:
                with self.lock:
                    c.kind = "silent"
                self._happened(f"kind {c.number} silent")
                while c.sock.recv(65536):
                    pass
                return
            head, rest = self._read_head(c.sock)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            request = lines[0].split(" ")
            fields = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    fields[name.strip().lower()] = value.strip()
            path = request[1] if len(request) >= 2 else ""
            if path == "/json/version" and request[0] == "GET":
                self._version(c, fields)
            elif path.startswith("/devtools/browser/") and fields.get("upgrade", "").lower() == "websocket":
                self._websocket(c, fields, rest)
            else:
                self._happened(f"kind {c.number} other")
                c.send(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass
        finally:
            self._close(c)

    @staticmethod
    def _read_head(sock):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return None, b""
            data += chunk
            if len(data) > 65536:
                return None, b""
        head, rest = data.split(b"\r\n\r\n", 1)
        return head, rest

    def _version(self, c, fields):
        with self.lock:
            c.kind = "version"
            self.lock.notify_all()
        self._happened(f"kind {c.number} version")
        if self.version_answer is not None:
            c.send(self.version_answer)
            return
        url = self.ws_url or f"ws://127.0.0.1:{self.port}/devtools/browser/{self.browser_id}"
        body = json.dumps({
            "Browser": self.browser, "Protocol-Version": "1.3", "User-Agent": "Mozilla/5.0 (fake)",
            "V8-Version": "0.0", "WebKit-Version": "537.36", "webSocketDebuggerUrl": url,
        }, indent=3).encode()
        c.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=UTF-8\r\n"
               + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def _websocket(self, c, fields, rest):
        with self.lock:
            c.kind = "websocket"
            garbage = self.after_handshake.pop(0) if self.after_handshake else None
            flood = self.flood
            self.lock.notify_all()
        self._happened(f"kind {c.number} websocket")
        if self.silent_upgrade:
            while c.sock.recv(65536):
                pass
            return
        if self.handshake_answer is not None:
            c.send(self.handshake_answer)
            return
        key = fields.get("sec-websocket-key", "")
        if fields.get("sec-websocket-version") != "13" or len(base64.b64decode(key + "==")[:16]) != 16:
            self._client_error(c, f"a bad handshake: {fields}")
        c.send(b"HTTP/1.1 101 WebSocket Protocol Handshake\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n"
               + f"Sec-WebSocket-Accept: {accept_for(key)}\r\n\r\n".encode())
        if garbage is not None:
            c.send(garbage)
        if flood == "flap":
            time.sleep(self.flap_after)
            return
        if flood == "pings":
            # Never reads again: the pongs the service owes back up.
            self._flood_thread(c, self._flood_pings)
            while c.closed is None and not self._closing:
                time.sleep(0.05)
            return
        if flood == "events":
            self._flood_thread(c, self._flood_events)
        buffer = bytearray(rest)
        message = bytearray()
        while True:
            parsed = self._parse_frame(c, buffer)
            if parsed is None:
                chunk = c.sock.recv(65536)
                if not chunk:
                    return
                buffer += chunk
                continue
            fin, opcode, payload = parsed
            if opcode == 0x8:
                c.send(frame(0x8, payload[:2]))
                return
            if opcode == 0x9:
                c.send(frame(0xA, payload))
                continue
            if opcode == 0xA:
                with self.lock:
                    self.pongs.append(payload)
                    self.lock.notify_all()
                continue
            if opcode not in (0x0, 0x1):
                self._client_error(c, f"opcode {opcode}")
                continue
            message += payload
            if not fin:
                self._client_error(c, "a fragmented message (allowed, but the service never needs one)")
                continue
            stall = self._command(c, bytes(message))
            message = bytearray()
            if stall:
                time.sleep(stall)

    def _parse_frame(self, c, buffer):
        """Takes one client frame off `buffer`: (fin, opcode, unmasked
        payload), or None until it is whole."""
        if len(buffer) < 2:
            return None
        b0, b1 = buffer[0], buffer[1]
        if b0 & 0x70:
            self._client_error(c, "reserved bits set")
        n = b1 & 0x7F
        header = 2
        if n == 126:
            if len(buffer) < 4:
                return None
            n = struct.unpack(">H", buffer[2:4])[0]
            header = 4
        elif n == 127:
            if len(buffer) < 10:
                return None
            n = struct.unpack(">Q", buffer[2:10])[0]
            header = 10
        masked = bool(b1 & 0x80)
        if not masked:
            self._client_error(c, "an unmasked client frame")
        if masked:
            header += 4
        if len(buffer) < header + n:
            return None
        mask = bytes(buffer[header - 4:header]) if masked else b"\0\0\0\0"
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(buffer[header:header + n]))
        del buffer[:header + n]
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def _client_error(self, c, what):
        with self.lock:
            self.client_errors.append(f"connection {c.number}: {what}")
            self.lock.notify_all()

    def _command(self, c, data):
        try:
            command = json.loads(data)
            id_ = command["id"]
            method = command["method"]
            assert isinstance(id_, int) and isinstance(method, str)
        except Exception as error:  # noqa: BLE001 — anything else is the client's fault
            self._client_error(c, f"not a command: {data[:200]!r} ({error!r})")
            return
        params = command.get("params", {})
        session = command.get("sessionId")
        if isinstance(session, str) and session.startswith("FLOOD-S"):
            self._flood_command(c, id_, method, session)
            return
        if method == "Target.detachFromTarget" and str(params.get("sessionId", "")).startswith("FLOOD-S"):
            self._flood_command(c, id_, method, None, detach=params["sessionId"])
            return
        self._happened(f"message {c.number} {method}")
        with self.lock:
            target = c.sessions.get(session) if session is not None else None
            self.messages.append(Message(c.number, time.monotonic(), id_, method, session, params, target))
            self.lock.notify_all()
            hung = session is not None and target in self.hung_targets
            frozen = self.frozen
        if frozen:
            return
        if session is not None:
            if target is None:
                c.send(text({"id": id_, "sessionId": session,
                             "error": {"code": -32001, "message": "Session with given id not found."}}))
            elif not hung:
                c.send(text({"id": id_, "sessionId": session, "result": self._page_result(method)}))
            return
        if method == "Target.setAutoAttach":
            if params.get("autoAttach"):
                for target_id, kind, url in self._targets():
                    with self.lock:
                        if target_id in c.sessions.values():
                            continue
                        self._next_session += 1
                        session_id = f"{target_id}-S{self._next_session}"
                        c.sessions[session_id] = target_id
                    c.send(text({"method": "Target.attachedToTarget", "params": {
                        "sessionId": session_id,
                        "targetInfo": {"targetId": target_id, "type": kind, "title": target_id, "url": url,
                                       "attached": True, "canAccessOpener": False, "browserContextId": "CTX"},
                        "waitingForDebugger": False}}))
            else:
                with self.lock:
                    attached = list(c.sessions.items())
                    c.sessions.clear()
                for session_id, target_id in attached:
                    c.send(text({"method": "Target.detachedFromTarget",
                                 "params": {"sessionId": session_id, "targetId": target_id}}))
            c.send(text({"id": id_, "result": {}}))
            if params.get("autoAttach"):
                if self.flood == "attach":
                    self._flood_thread(c, self._flood_attach)
                return self.stall_after_attach
        elif method == "Target.detachFromTarget":
            with self.lock:
                target_id = c.sessions.pop(params.get("sessionId"), None)
            if target_id is None:
                c.send(text({"id": id_, "error": {"code": -32602, "message": "No session with given id"}}))
                return
            c.send(text({"method": "Target.detachedFromTarget",
                         "params": {"sessionId": params["sessionId"], "targetId": target_id}}))
            c.send(text({"id": id_, "result": {}}))
        else:
            c.send(text({"id": id_, "result": {}}))

    # ------------------------------------------------------------ floods

    def _happened(self, line):
        report = self.on_happening
        if report is not None:
            report(line)

    def _count(self, kind, n):
        with self.lock:
            self.flooded[kind] = self.flooded.get(kind, 0) + n

    def _flood_thread(self, c, body):
        threading.Thread(target=body, args=(c,), daemon=True, name=f"fake-devtools-flood-{c.number}").start()

    def _flooding(self, c, kind):
        return c.closed is None and not self._closing and self.flood == kind

    def _flood_events(self, c):
        batch = text({"method": "Page.frameNavigated", "params": {}}) * 256
        while self._flooding(c, "events"):
            if not c.send(batch):
                return
            self._count("events", 256)

    def _flood_pings(self, c):
        batch = frame(0x9, b"ping") * 256
        while self._flooding(c, "pings"):
            if not c.send(batch):
                return
            self._count("pings", 256)

    def _flood_attach(self, c):
        while self._flooding(c, "attach"):
            with self.lock:
                first = self._next_flood_page + 1
                self._next_flood_page += 64
            batch = b"".join(
                text({"method": "Target.attachedToTarget", "params": {
                    "sessionId": f"FLOOD-S{n}",
                    "targetInfo": {"targetId": f"FLOODPAGE{n}", "type": "page", "title": f"flood {n}",
                                   "url": f"https://kiosk.example/flood/{n}", "attached": True,
                                   "canAccessOpener": False, "browserContextId": "CTX"},
                    "waitingForDebugger": False}})
                for n in range(first, first + 64))
            if not c.send(batch):
                return
            self._count("attach", 64)

    def _flood_command(self, c, id_, method, session, detach=None):
        with self.lock:
            self.flood_commands[method] = self.flood_commands.get(method, 0) + 1
        if self.frozen:
            return
        if detach is not None:
            c.send(text({"method": "Target.detachedFromTarget",
                         "params": {"sessionId": detach, "targetId": "FLOODPAGE" + detach[len("FLOOD-S"):]}}))
            c.send(text({"id": id_, "result": {}}))
            return
        c.send(text({"id": id_, "sessionId": session, "result": self._page_result(method)}))

    def _targets(self):
        return [(t, "page", url) for t, url in self.pages] + [
            (t, kind, "https://kiosk.example/" + t) for t, kind in self.extra_targets]

    def _page_result(self, method):
        if method == "Page.addScriptToEvaluateOnNewDocument":
            with self.lock:
                self._next_script += 1
                return {"identifier": str(self._next_script)}
        if method == "Runtime.evaluate":
            return {"result": {"type": "undefined"}}
        return {}


def main(argv=None):
    """The fake as a program of its own (another user's, through setpriv):
    see the module's docstring."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="A fake Chromium DevTools endpoint on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0, help="the port (0: any free one; printed)")
    parser.add_argument("--pages", type=int, default=2)
    parser.add_argument("--flood", choices=["events", "attach", "pings", "flap"], default=None)
    parser.add_argument("--rcvbuf", type=int, default=None)
    options = parser.parse_args(argv)

    out_lock = threading.Lock()

    def say(line):
        with out_lock:
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                pass

    fake = FakeDevTools(pages=options.pages, listen=False, rcvbuf=options.rcvbuf, port=options.port)
    fake.flood = options.flood
    fake.on_happening = say
    fake.listen()
    say(f"listening {fake.port}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    fake.close()


if __name__ == "__main__":
    main()
