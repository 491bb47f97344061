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
  sink `speech` as the default sink (speechd.conf sends audio to "pulse",
  that is to this sink), whose monitor parec records; this file, run as a
  script (`python3 speech.py record FILE.wav`), writes that to a WAV and
  gives every piece of it a wall-clock time (Recording), so that a test can
  ask whether there was sound between two times, when sound began after a
  time, and when it ended.

speech-dispatcher itself is not started here: the screen reader starts it
(`speech-dispatcher --spawn`, which daemonizes) as it would on a real
desktop, so that its start-up counts in the time to the first speech. It
reads the configuration written here because XDG_CONFIG_HOME points here.
Speech finds it (dispatcher_pids), talks SSIP to it (ssip, cancel_all) and
ends it (stop_dispatcher).

Every time here is a time.time() value, the clock of speech-dispatcher's log.

The processes are started through a `spawn(name, argv, stdout=None)`
callable returning a subprocess.Popen: by default as children of this
process with `env`, their output in DIRECTORY/NAME.log; a harness that
runs its desktop as another user or in another mount namespace passes its
own (gnomeshell.Desktop.spawn is one), which must give them the same
environment. What is written here (speechd.conf, DIRECTORY) is given to the
owner of XDG_RUNTIME_DIR. Nothing here knows which desktop it serves.

The recipe: ../shared/notes/real-systems.md, section 3."""

import array
import bisect
import ctypes
import html
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

TOOLS = {name: f"/usr/bin/{name}" for name in (
    "pipewire", "wireplumber", "pipewire-pulse", "pactl", "parec", "speech-dispatcher", "python3")}
MODULES_DIR = "/usr/lib/speech-dispatcher-modules"
SINK = "speech"
RATE = 22050  # espeak-ng's own rate, plenty for speech
# Who the harness is when it talks SSIP (cancel_all), so that
# speech-dispatcher's log tells it from the screen reader and guidedaccessd.
CLIENT_NAME = "user:guidedaccess-tests:harness"

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


def screen_readers(env):
    """Live Orca processes of one environment: each `orca` whose
    XDG_RUNTIME_DIR is env's (whoever started it)."""
    marker = f"XDG_RUNTIME_DIR={env['XDG_RUNTIME_DIR']}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != "orca":
                continue
            if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if marker in environment(entry):
                found.append(int(entry))
        except OSError:
            continue
    return sorted(found)


def environment(pid):
    """The `NAME=value` entries of /proc/PID/environ. A process in the middle
    of an exec has its new name (or executable) but, for a moment, an empty
    environment there: read again for up to 50 ms."""
    deadline = time.monotonic() + 0.05
    while True:
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if entries != [b""] or time.monotonic() >= deadline:
            return entries
        time.sleep(0.002)


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
    the text kept is what is spoken, "Order now push button.". A
    message's text may span lines (it ends at `|, ssml_mode=N`); lines are
    read only once they are complete, so a line being written is never
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


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _wav_header(rate, data_bytes):
    """The 44-byte header of a 16-bit mono PCM WAV."""
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + data_bytes, b"WAVE", b"fmt ", 16, 1, 1, rate,
                       2 * rate, 2, 16, b"data", data_bytes)


HEADER_BYTES = len(_wav_header(RATE, 0))


def record(path, rate=RATE):
    """The recorder (`python3 speech.py record FILE.wav`, started by
    Speech.start): runs parec on the null sink's monitor and writes what it
    delivers to FILE.wav, and for every read a line `TIME SAMPLES` to
    FILE.wav.times: the wall-clock time the read returned and the samples
    written by then, so that every sample has a time even when the sound
    server drops or delays some: on a loaded machine (60 % CPU steal) the
    sample count fell 6 % behind the wall clock, so a clock derived from
    the count alone was off by seconds within a minute. The header's data
    length is 0 until SIGTERM or SIGINT, which stop parec and complete it."""
    path = Path(path)
    # --latency-msec=20: parec delivers every 20 ms (the default is coarse,
    # and loses the last ~2 s when it stops).
    parec = subprocess.Popen(
        [TOOLS["parec"], "-d", f"{SINK}.monitor", "--latency-msec=20", "--raw", f"--rate={rate}",
         "--channels=1", "--format=s16le"], stdout=subprocess.PIPE, preexec_fn=_die_with_parent)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: parec.terminate())
    written = 0
    with open(path, "wb") as wav, open(path.with_name(path.name + ".times"), "w") as times:
        wav.write(_wav_header(rate, 0))
        carry = b""
        while True:
            data = os.read(parec.stdout.fileno(), 65536)
            if not data:
                break
            now = time.time()
            data, carry = carry + data, b""
            if len(data) % 2:
                data, carry = data[:-1], data[-1:]
            wav.write(data)
            wav.flush()  # the samples before the line that gives them a time
            written += len(data)
            times.write(f"{now:.6f} {written // 2}\n")
            times.flush()
        wav.seek(0)
        wav.write(_wav_header(rate, written))
    return parec.wait()


class Recording:
    """What the recorder wrote so far (read as it grows): the samples, and
    when each was captured. Sample i, delivered by the read that returned
    at time t with n samples written, was captured at t - (n - i) / RATE:
    late by the sound server's latency (a fragment or two of 20 ms), never
    early, and never more than one read's worth off when samples go
    missing."""

    def __init__(self, path, rate=RATE):
        self.path = Path(path)
        self.times_path = self.path.with_name(self.path.name + ".times")
        self.rate = rate
        self._samples = array.array("h")
        self._times = []  # per read: when it returned
        self._counts = []  # per read: samples written by then
        self._times_offset = 0

    def _read(self):
        try:
            with open(self.times_path, "rb") as times:
                times.seek(self._times_offset)
                chunk = times.read()
        except FileNotFoundError:
            return
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._times_offset += len(complete)
        for line in complete.decode().splitlines():
            moment, count = line.split()
            self._times.append(float(moment))
            self._counts.append(int(count))
        missing = (self._counts[-1] if self._counts else 0) - len(self._samples)
        if missing > 0:
            with open(self.path, "rb") as wav:
                wav.seek(HEADER_BYTES + 2 * len(self._samples))
                self._samples.frombytes(wav.read(2 * missing))

    def _time_of(self, index):
        read = bisect.bisect_right(self._counts, index)
        return self._times[read] - (self._counts[read] - index) / self.rate

    def _index(self, moment):
        read = bisect.bisect_left(self._times, moment)
        if read == len(self._times):
            return len(self._samples)
        first = self._counts[read - 1] if read else 0
        index = round(self._counts[read] - (self._times[read] - moment) * self.rate)
        return min(self._counts[read], max(first, index))

    def recorded_until(self):
        """The time of the end of the recording so far (-inf before the
        first read)."""
        self._read()
        return self._times[-1] if self._times else -math.inf

    def wait_until_recorded(self, moment, timeout=5.0):
        """Waits until the recording reaches `moment`; TimeoutError if it
        stalls (the recorder or parec died, or the sink stopped)."""
        deadline = time.monotonic() + timeout + max(0.0, moment - time.time())
        while self.recorded_until() < moment:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path} was not recorded up to {moment:.3f} "
                                   f"(it ends at {self.recorded_until():.3f}, now is {time.time():.3f})")
            time.sleep(0.01)

    def _blocks(self, begin, end):
        """(time, peak) of each BLOCK-long block between two sample indexes."""
        size = max(1, round(BLOCK * self.rate))
        for index in range(begin, end, size):
            block = self._samples[index:min(index + size, end)]
            yield self._time_of(index), max(max(block), -min(block)) / 32768

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


class Speech:
    """Speech capture for one environment: start(), then `log` (what
    speech-dispatcher spoke) and `recording` (what was heard); stop() at
    the end. DIRECTORY gets speech.wav, speech.wav.times and, with the
    default spawn, the processes' logs."""

    def __init__(self, env, directory, spawn=None, readable=lambda path: path):
        """`readable(path)`: a path of this module the processes can read
        (a harness that runs them as another user may have to copy it)."""
        self.readable = readable
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

    def _give(self, path):
        """Gives a path made here to the environment's owner (the owner of
        XDG_RUNTIME_DIR): the processes may run as another user."""
        owner = Path(self.env["XDG_RUNTIME_DIR"]).stat()
        os.chown(path, owner.st_uid, owner.st_gid)

    def write_config(self):
        """speechd.conf in $XDG_CONFIG_HOME/speech-dispatcher."""
        for directory in (Path(self.env["XDG_CONFIG_HOME"]), self.config_dir):
            if not directory.exists():
                directory.mkdir(mode=0o700)
                self._give(directory)
        path = self.config_dir / "speechd.conf"
        path.write_text(SPEECHD_CONF)
        self._give(path)

    def start(self, timeout=20.0):
        """Writes speechd.conf, starts the sound server with the null sink
        as default and the recording; returns once the recording runs."""
        deadline = time.monotonic() + timeout
        if not self.directory.exists():
            self.directory.mkdir(mode=0o700)
            self._give(self.directory)
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
        # pipewire-pulse has been seen to exit at start-up on a loaded
        # machine (exit 239, -EEXIST; seen once, in a CI run); started
        # again once, with a note, before that counts as a failure.
        restarted = False
        while self._pactl("info")[0] != 0:
            pulse = self.processes["pipewire-pulse"]
            if pulse.poll() is not None and not restarted:
                print(f"speech capture: pipewire-pulse exited with {pulse.returncode} at start-up; starting it again")
                restarted = True
                self._start("pipewire-pulse", [TOOLS["pipewire-pulse"]])
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"speech capture: pipewire-pulse did not answer within {timeout} s")
            time.sleep(0.05)
        code, output = self._pactl("load-module", "module-null-sink", f"sink_name={SINK}",
                                   f"sink_properties=device.description={SINK}")
        if code != 0:
            raise RuntimeError(f"pactl load-module module-null-sink: exit {code} {output}")
        # WirePlumber applies the default sink asynchronously; a stream
        # opened before would go to its auto_null sink and never be heard.
        until(f"the default sink did not become {SINK!r}",
              lambda: self._pactl("set-default-sink", SINK)[0] == 0 and self._pactl("get-default-sink")[1] == SINK)
        self._start("speech-recorder", [TOOLS["python3"], str(self.readable(Path(__file__).resolve())), "record",
                                        str(self.recording.path)])
        until("the recorder recorded nothing", lambda: self.recording.recorded_until() > -math.inf)
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
                    if marker in environment(entry):
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

    def cancel_all(self):
        """Silences speech-dispatcher: what it speaks and what it has
        queued, for every client (silence within 0.1 s, measured). The
        replies: [['208 OK CLIENT NAME SET'], ['213 OK CANCELED']]."""
        return self.ssip(f"SET self CLIENT_NAME {CLIENT_NAME}", "CANCEL all")


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
        """Stops speech-dispatcher (so nothing speaks on), then the
        recorder (it completes the WAV header), then the sound server."""
        self.stop_dispatcher()
        for name in ("speech-recorder", "pipewire-pulse", "wireplumber", "pipewire"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


if __name__ == "__main__":
    if sys.argv[1:2] != ["record"] or len(sys.argv) != 3:
        sys.exit("usage: speech.py record FILE.wav")
    sys.exit(record(sys.argv[2]))
