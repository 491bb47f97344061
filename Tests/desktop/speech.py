"""What a screen reader says in one private user environment, heard two ways.

A test that claims "the screen reader spoke" must not trust the screen
reader's own word for it, and a machine without a sound card has nothing to
listen with. Speech gives one environment (a dict with HOME,
XDG_CONFIG_HOME, XDG_RUNTIME_DIR and DBUS_SESSION_BUS_ADDRESS) both ears:

- speech-dispatcher's log: $XDG_CONFIG_HOME/speech-dispatcher/speechd.conf
  sets LogLevel 5, so $XDG_RUNTIME_DIR/speech-dispatcher/log/
  speech-dispatcher.log gets a line `MSG before index marking: |TEXT|` for
  every message it sends to its output module (espeak-ng), stamped with the
  wall-clock time to the microsecond (SpeechLog);
- the sound itself: PipeWire, WirePlumber and pipewire-pulse with a null
  sink `speech` as the default sink, whose monitor parec records to a WAV
  (Recording). speechd.conf sends audio to "pulse", that is to this sink.

speech-dispatcher itself is not started here: the screen reader starts it
(`speech-dispatcher --spawn`, which daemonizes) as it would on a real
desktop, so that its start-up counts in the time to the first speech. It
reads the configuration written here because XDG_CONFIG_HOME points here.

Every time here is a time.time() value, the clock of speech-dispatcher's log.

The processes are started through a `spawn(name, argv, stdout=None)`
callable returning a subprocess.Popen: by default as children of this
process with `env`, their output in DIRECTORY/NAME.log; a harness that
runs its desktop as another user or in another mount namespace passes its
own (gnomeshell.Desktop.spawn is one), which must give them the same
environment. Nothing here knows which desktop it serves.

The recipe: ../shared/notes/real-systems.md, section 3."""

import array
import ctypes
import html
import math
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

TOOLS = {name: f"/usr/bin/{name}" for name in (
    "pipewire", "wireplumber", "pipewire-pulse", "pactl", "parec", "speech-dispatcher")}
MODULES_DIR = "/usr/lib/speech-dispatcher-modules"
SINK = "speech"
RATE = 22050  # espeak-ng's own rate: the recording is not resampled twice

# The stock /etc/speech-dispatcher/speechd.conf (Debian 12) with the log
# turned up to 5 (the only level that logs the text), audio forced to
# PulseAudio (pipewire-pulse here) and espeak-ng as the only module.
SPEECHD_CONF = """\
LogLevel 5
LogDir "default"
DefaultVolume 100
AudioOutputMethod "pulse"
AddModule "espeak-ng" "sd_espeak-ng" "espeak-ng.conf"
DefaultModule espeak-ng
SymbolsPreproc "char"
SymbolsPreprocFile "gender-neutral.dic"
SymbolsPreprocFile "font-variants.dic"
SymbolsPreprocFile "symbols.dic"
SymbolsPreprocFile "emojis.dic"
SymbolsPreprocFile "orca.dic"
SymbolsPreprocFile "orca-chars.dic"
Include "/etc/speech-dispatcher/clients/*.conf"
"""

# A 10 ms block is sound when its peak reaches 0.3 % of full scale: the null
# sink's silence is exact zeros (±1 after resampling), espeak-ng's speech
# peaks at 3 % or more even at the soft start of a word.
BLOCK = 0.01
SOUND_PEAK = 0.003


def missing_tools():
    """The programs this needs that are not installed."""
    missing = [path for path in TOOLS.values() if not os.access(path, os.X_OK)]
    if not os.access(f"{MODULES_DIR}/sd_espeak-ng", os.X_OK):
        missing.append(f"{MODULES_DIR}/sd_espeak-ng")
    return missing


class Utterance(NamedTuple):
    text: str  # without the SSML markup Orca wraps it in
    time: float  # when speech-dispatcher handed it to its output module


class Level(NamedTuple):
    peak: float  # fractions of full scale, 0…1
    rms: float


# ---------------------------------------------------------------- the log

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}) : (\d+)\] ")
_BEFORE = "MSG before index marking: |"
_END = re.compile(r"\|(, ssml_mode=\d+)?$")
_TAG = re.compile(r"<[^>]*>")


def _stamp_time(line):
    match = _STAMP.match(line)
    if not match:
        return None
    return time.mktime(time.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")) + int(match.group(2)) / 1e6


class SpeechLog:
    """speech-dispatcher's log, read as it grows: the messages it spoke.

    Orca sends SSML (`<speak><mark name="0:5"/>Order <mark …/>now …`);
    the text kept is what is spoken, "Order now push button.". A message's text may span lines (it ends at `|, ssml_mode=N`); lines
    are read only once they are complete, so a line being written is never
    half-parsed."""

    def __init__(self, path):
        self.path = Path(path)
        self._offset = 0
        self._pending = None  # (time, text so far) of a message spanning lines
        self._heard = []

    def utterances(self):
        """Every message spoken so far, in order."""
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                chunk = log.read()
        except FileNotFoundError:
            return list(self._heard)
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            self._take(line)
        return list(self._heard)

    def _take(self, line):
        if self._pending is not None:
            stamp, text = self._pending
            text += "\n" + line
        elif _BEFORE in line:
            stamp, text = _stamp_time(line), line.split(_BEFORE, 1)[1]
        else:
            return
        end = _END.search(text)
        if end:
            self._pending = None
            self._heard.append(Utterance(html.unescape(_TAG.sub("", text[:end.start()])), stamp))
        else:
            self._pending = (stamp, text)

    def wait_for(self, text, after=0.0, timeout=10.0):
        """The first utterance containing `text` spoken at or after `after`;
        TimeoutError (naming what was said) if none comes within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            heard = [u for u in self.utterances() if u.time >= after]
            for utterance in heard:
                if text in utterance.text:
                    return utterance
            if time.monotonic() > deadline:
                raise TimeoutError(f"{text!r} was not spoken within {timeout} s; spoken since: "
                                   f"{[u.text for u in heard]}")
            time.sleep(0.02)


# ---------------------------------------------------------------- the sound


class Recording:
    """The WAV parec is writing (16-bit mono PCM), read as it grows.

    parec writes the header first, with a data length of 0 that it fixes
    only when it stops, so the data runs to the end of the file whatever the
    header says. The file has no time stamps: sample i was captured at
    start + i / RATE, where start is the earliest of `t - n / RATE` over
    every read (t: when a read returned, n: samples in the file by then).
    The monitor delivers a continuous stream (silence is zeros, not a gap)
    in 20 ms fragments, so that bound is within a fragment or two of the
    truth and the times are late by that much at most."""

    def __init__(self, path, rate=RATE):
        self.path = Path(path)
        self.rate = rate
        self._data_offset = None
        self._samples = array.array("h")
        self.start = math.inf

    def _read(self):
        try:
            with open(self.path, "rb") as wav:
                if self._data_offset is None:
                    self._data_offset = self._find_data(wav.read(4096))
                    if self._data_offset is None:
                        return
                wav.seek(self._data_offset + 2 * len(self._samples))
                data = wav.read()
        except FileNotFoundError:
            return
        now = time.time()
        self._samples.frombytes(data[:len(data) // 2 * 2])
        self.start = min(self.start, now - len(self._samples) / self.rate)

    def _find_data(self, header):
        """Where the samples begin, once the header is complete; checks
        that the format is the one asked of parec."""
        if len(header) < 12 or header[:4] != b"RIFF" or header[8:12] != b"WAVE":
            return None
        position = 12
        while position + 8 <= len(header):
            chunk, size = header[position:position + 4], int.from_bytes(header[position + 4:position + 8], "little")
            if chunk == b"fmt ":
                fmt = header[position + 8:position + 24]
                if len(fmt) < 16:
                    return None
                tag, channels, rate = int.from_bytes(fmt[0:2], "little"), int.from_bytes(fmt[2:4], "little"), \
                    int.from_bytes(fmt[4:8], "little")
                bits = int.from_bytes(fmt[14:16], "little")
                if (tag, channels, rate, bits) != (1, 1, self.rate, 16):
                    raise RuntimeError(f"{self.path}: format {tag=} {channels=} {rate=} {bits=}, "
                                       f"not 16-bit mono PCM at {self.rate} Hz")
            if chunk == b"data":
                return position + 8
            position += 8 + size + size % 2
        return None

    def recorded_until(self):
        """The time of the end of the last sample recorded (-inf before the
        first)."""
        self._read()
        return self.start + len(self._samples) / self.rate if self._samples else -math.inf

    def wait_until_recorded(self, moment, timeout=5.0):
        """Waits until the recording reaches `moment`; TimeoutError if it
        stalls (parec died, or the sink stopped)."""
        deadline = time.monotonic() + timeout + max(0.0, moment - time.time())
        while self.recorded_until() < moment:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path} was not recorded up to {moment:.3f} "
                                   f"(it ends at {self.recorded_until():.3f}, now is {time.time():.3f})")
            time.sleep(0.01)

    def _index(self, moment):
        return min(len(self._samples), max(0, round((moment - self.start) * self.rate)))

    def _blocks(self, begin, end):
        """(time, peak) of each BLOCK-long block between two sample indexes."""
        size = max(1, round(BLOCK * self.rate))
        for index in range(begin, end, size):
            block = self._samples[index:min(index + size, end)]
            yield self.start + index / self.rate, max(max(block), -min(block)) / 32768

    def level(self, t0, t1):
        """Peak and RMS amplitude between two times (waits until t1 is
        recorded)."""
        self.wait_until_recorded(t1)
        samples = self._samples[self._index(t0):self._index(t1)]
        if not samples:
            return Level(0.0, 0.0)
        peak = max(max(samples), -min(samples)) / 32768
        rms = math.sqrt(sum(map(int.__mul__, samples, samples)) / len(samples)) / 32768
        return Level(peak, rms)

    def sound_between(self, t0, t1):
        """Whether any block between two times is sound (waits until t1 is
        recorded)."""
        return self.first_sound(t0, t1) is not None

    def first_sound(self, after, before):
        """When the first block of sound between two times begins, or None
        (waits until `before` is recorded)."""
        self.wait_until_recorded(before)
        for moment, peak in self._blocks(self._index(after), self._index(before)):
            if peak >= SOUND_PEAK:
                return moment
        return None

    def last_sound(self, after, before):
        """When the last block of sound between two times ends, or None
        (waits until `before` is recorded)."""
        self.wait_until_recorded(before)
        last = None
        for moment, peak in self._blocks(self._index(after), self._index(before)):
            if peak >= SOUND_PEAK:
                last = moment + BLOCK
        return last

    def wait_for_sound(self, after, timeout=10.0):
        """When sound first begins at or after `after`, looked for as the
        recording grows; TimeoutError if there is none within `timeout`."""
        deadline = time.monotonic() + timeout
        scanned = after
        while True:
            until = self.recorded_until()
            if until > scanned:
                found = self.first_sound(scanned, until)
                if found is not None:
                    return found
                scanned = until
            if time.monotonic() > deadline:
                raise TimeoutError(f"no sound in {self.path} within {timeout} s after {after:.3f}")
            time.sleep(0.02)


# ---------------------------------------------------------------- the whole


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Speech:
    """Speech capture for one environment: start(), then `log` and
    `recording`; stop() at the end."""

    def __init__(self, env, directory, spawn=None):
        self.env = dict(env)
        self.directory = Path(directory)
        self.config_dir = Path(self.env["XDG_CONFIG_HOME"]) / "speech-dispatcher"
        self.runtime_dir = Path(self.env["XDG_RUNTIME_DIR"]) / "speech-dispatcher"
        self.socket = self.runtime_dir / "speechd.sock"
        self.log = SpeechLog(self.runtime_dir / "log" / "speech-dispatcher.log")
        self.recording = Recording(self.directory / "speech.wav")
        self._spawn = spawn or self._spawn_here
        self._own_logs = spawn is None
        self.processes = {}  # the long-running ones, by name

    def _spawn_here(self, name, argv, stdout=None):
        with open(self.directory / f"{name}.log", "ab") as log:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout or log, stderr=log,
                                    env=self.env, start_new_session=True, preexec_fn=_die_with_parent)

    def _start(self, name, argv):
        self.processes[name] = self._spawn(name, argv)

    def _check_alive(self):
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see its log")

    def _pactl(self, *args, timeout=5):
        process = self._spawn("pactl", [TOOLS["pactl"], *args], stdout=subprocess.PIPE)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return process.returncode, output.decode(errors="replace").strip()

    def write_config(self):
        """speechd.conf in $XDG_CONFIG_HOME/speech-dispatcher, owned like
        XDG_CONFIG_HOME (the environment may belong to another user)."""
        config_home = Path(self.env["XDG_CONFIG_HOME"])
        config_home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.config_dir.mkdir(mode=0o755, exist_ok=True)
        path = self.config_dir / "speechd.conf"
        path.write_text(SPEECHD_CONF)
        owner = config_home.stat()
        for made in (self.config_dir, path):
            os.chown(made, owner.st_uid, owner.st_gid)

    def start(self, timeout=20.0):
        """Writes speechd.conf, starts the sound server with the null sink
        as default and the recording; returns once the recording runs."""
        deadline = time.monotonic() + timeout
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write_config()

        def until(what, done):
            while not done():
                self._check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"speech capture: {what} within {timeout} s")
                time.sleep(0.05)

        # WirePlumber gives up at once (exit 69) if PipeWire is not there yet.
        self._start("pipewire", [TOOLS["pipewire"]])
        until("pipewire made no socket", (Path(self.env["XDG_RUNTIME_DIR"]) / "pipewire-0").is_socket)
        for name in ("wireplumber", "pipewire-pulse"):
            self._start(name, [TOOLS[name]])
        until("pipewire-pulse did not answer", lambda: self._pactl("info")[0] == 0)
        code, output = self._pactl("load-module", "module-null-sink", f"sink_name={SINK}",
                                   f"sink_properties=device.description={SINK}")
        if code != 0:
            raise RuntimeError(f"pactl load-module module-null-sink: exit {code} {output}")
        # WirePlumber applies the default sink asynchronously; a stream
        # opened before would go to its auto_null sink and never be heard.
        until(f"the default sink did not become {SINK!r}",
              lambda: self._pactl("set-default-sink", SINK)[0] == 0 and self._pactl("get-default-sink")[1] == SINK)
        # --latency-msec=20: with the default latency parec loses the last
        # ~2 s of audio when it stops, and delivers in coarse chunks.
        self._start("parec", [TOOLS["parec"], "-d", f"{SINK}.monitor", "--latency-msec=20", "--file-format=wav",
                              f"--rate={RATE}", "--channels=1", "--format=s16le", str(self.recording.path)])
        until("parec did not start recording", lambda: self.recording.recorded_until() > -math.inf)
        return self

    # -- speech-dispatcher

    def dispatcher_pids(self):
        """speech-dispatcher and its output modules serving this
        environment: processes of those programs whose XDG_RUNTIME_DIR is
        this one. (It daemonizes, and its modules are not its children.)"""
        marker = f"XDG_RUNTIME_DIR={self.env['XDG_RUNTIME_DIR']}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                exe = os.readlink(f"/proc/{entry}/exe")
                if exe == TOOLS["speech-dispatcher"] or exe.startswith(MODULES_DIR + "/"):
                    if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        return found

    def ssip(self, *commands, timeout=5.0):
        """Sends SSIP commands to speech-dispatcher on one connection; the
        reply to each (its lines, the last one `NNN text`)."""
        replies = []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(str(self.socket))
            stream = connection.makefile("rwb")
            for command in commands:
                stream.write(command.encode() + b"\r\n")
                stream.flush()
                lines = []
                while not lines or not re.match(r"^\d{3} ", lines[-1]):
                    line = stream.readline()
                    if not line:
                        raise ConnectionError(f"speech-dispatcher closed the connection after {command!r}")
                    lines.append(line.decode(errors="replace").rstrip("\r\n"))
                replies.append(lines)
        return replies

    # -- the end

    def logs(self):
        """(title, text) for a failure report: what speech-dispatcher said
        it spoke, its module's log and, when they ran here, the sound
        server's output."""
        heard = "\n".join(f"{u.time:.3f} {u.text}" for u in self.log.utterances())
        sections = [("speech-dispatcher: spoken", heard)]
        module_log = self.runtime_dir / "log" / "espeak-ng.log"
        if module_log.exists():
            sections.append(("speech-dispatcher: espeak-ng.log", module_log.read_text(errors="replace")))
        if self._own_logs:
            for name in (*self.processes, "pactl"):
                path = self.directory / f"{name}.log"
                if path.exists():
                    sections.append((f"{name} output", path.read_text(errors="replace")))
        return sections

    def stop(self):
        """Stops speech-dispatcher (so nothing speaks on), then parec (with
        SIGINT, so that it completes the WAV header), then the sound
        server."""
        self.stop_dispatcher()
        for name in ("parec", "pipewire-pulse", "wireplumber", "pipewire"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGINT if name == "parec" else signal.SIGTERM)
            try:
                process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop_dispatcher(self, timeout=2.0):
        """Ends speech-dispatcher and its modules (SIGTERM, then SIGKILL
        after `timeout`): the next client starts a cold one."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.dispatcher_pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + timeout
            while pids and self.dispatcher_pids() and time.monotonic() < deadline:
                time.sleep(0.02)
