"""The kiosk user's own systemd manager, an X display and speech that can
be read, inside the Debian 12 container (nspawn.Container): what the
service's screen reader, a transient unit of that manager, needs around it.

- `ensure_speech_rootfs()`: the base root filesystem plus Orca 43,
  speech-dispatcher with espeak-ng and Xvfb, cached beside it as
  rootfs-bookworm-speech (a copy of the base, `apt-get install` in a chroot;
  its stamp is the base's plus the package list, so either change rebuilds
  it). The base itself stays as it is: the other tests keep their smaller one.
- `ensure_agent_rootfs()`: the speech root filesystem plus sway, Xwayland,
  PipeWire, WirePlumber, pipewire-pulse and parec (AGENT_PACKAGES), cached
  as rootfs-bookworm-agent the same way (test_agent_speech.py only).
- `ensure_x11_rootfs()`: the agent root filesystem plus picom, matchbox,
  ImageMagick, xsettingsd and wvkbd (X11_PACKAGES), cached as rootfs-bookworm-x11 the same way
  (test_x11_agent.py only).
- `ensure_browser_rootfs()`: the base plus Chromium and iproute2
  (BROWSER_PACKAGES), cached as rootfs-bookworm-browser the same way
  (test_browser_units.py only); BROWSER_KIOSK_CONFIG, its system mode.
- `prepare_agent_kiosk(ct)`: system mode with the session agent and sway
  enabled for every user, PipeWire's null sink `speech`, speech-dispatcher
  through pulse; `start_recording()`, `sound()`, `wait_for_sound()`,
  `last_sound()`: what reaches that sink, recorded with parec, as RMS of
  10 ms windows; `user_processes()`, `journal()`.
- `prepare_x11_kiosk(ct, gtk_button)`: the same system mode and speech with
  an X11 session enabled for every user instead of sway (Xvfb with GLX and
  an -auth file, matchbox, the GTK window of Tests/desktop/gtk_button.py)
  and root's own X server on a lower display; `screenshot()`,
  `saturation()`, `pixels_changed()`: the root window with ImageMagick.
- `prepare(ct)`: the kiosk user (if missing), linger (user@UID.service and
  its bus at /run/user/UID/bus), Xvfb on DISPLAY as a user unit, and
  speechd.conf with `LogLevel 5` and ALSA's null device (no sound card, no
  sound server needed: speech-dispatcher logs every message it speaks).
- `systemctl()`, `unit()`, `wait_unit()`, `cgroup_pids()`, `comm()`: the
  user's units and their processes.
- `spoken()`, `utterances()`, `wait_for_utterance()`: what speech-dispatcher
  was asked to say, and when (`MSG before index marking: |...|` lines of its
  log).

Checked with systemd 252, Orca 43.1, speech-dispatcher 0.11.4.
"""

import calendar
import json
import re
import subprocess
import time

import nspawn
from container_setup import KIOSK_UID, KIOSK_USER

SPEECH_PACKAGES = ["orca", "speech-dispatcher", "speech-dispatcher-espeak-ng", "xvfb"]
SPEECH_ROOTFS = f"rootfs-{nspawn.SUITE}-speech"
# The locked kiosk that speaks through the session agent (test_agent_speech.py):
# a headless sway with Xwayland (Orca 43 needs an X display), PipeWire with
# WirePlumber and its pulse server (a null sink to record), parec.
AGENT_PACKAGES = ["sway", "xwayland", "pipewire", "pipewire-pulse", "wireplumber", "pulseaudio-utils"]
AGENT_ROOTFS = f"rootfs-{nspawn.SUITE}-agent"
# The X11 kiosk with the session agent (test_x11_agent.py): the agent root
# filesystem (Orca, speech-dispatcher, Xvfb, PipeWire and parec) plus picom
# (the compositor the service runs for invert-colors and grayscale),
# matchbox (the kiosk's window manager), ImageMagick (screenshots) and
# xsettingsd (the settings manager the agent runs for GTK's text, contrast
# and motion); and wvkbd, the last of the package's Recommends this root
# filesystem lacked: the X11 kiosk installs the package with the README's
# own line (Recommends installed, no -y), which then needs nothing from the
# network.
X11_PACKAGES = ["picom", "matchbox-window-manager", "imagemagick", "xsettingsd", "wvkbd"]
X11_ROOTFS = f"rootfs-{nspawn.SUITE}-x11"
# The kiosk browser (test_browser_units.py): Debian 12's Chromium, run
# headless (no display needed), and iproute2 for `ss` (what listens).
BROWSER_PACKAGES = ["chromium", "iproute2"]
BROWSER_ROOTFS = f"rootfs-{nspawn.SUITE}-browser"

DISPLAY = ":5"
XVFB_UNIT = "guidedaccess-test-xvfb.service"

# The stock speechd.conf with LogLevel 5 (the log then holds every message)
# and espeak-ng; its audio goes to ALSA's null device, defined in alsa-lib's
# own alsa.conf: no sound card and no sound server in the container.
SPEECHD_CONF = """\
LogLevel 5
LogDir "default"
DefaultVolume 100
AudioOutputMethod "alsa"
AudioALSADevice "null"
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

MANAGER = ("org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager")


# --- the root filesystem ------------------------------------------------------


def speech_stamp_text():
    return nspawn.stamp_text() + f"apt-install={','.join(SPEECH_PACKAGES)}\n"


# Run in a private mount namespace: proc, dev, tmp and the host's resolv.conf
# vanish with it, whatever happens. policy-rc.d keeps maintainer scripts from
# starting daemons in the chroot (they would outlive it).
_APT_SCRIPT = """\
mount -t proc proc "$ROOT/proc"
mount --rbind /dev "$ROOT/dev"
mount -t tmpfs tmpfs "$ROOT/tmp"
mount --bind /etc/resolv.conf "$ROOT/etc/resolv.conf"
printf '#!/bin/sh\\nexit 101\\n' > "$ROOT/usr/sbin/policy-rc.d"
chmod 755 "$ROOT/usr/sbin/policy-rc.d"
chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive sh -ec '
apt-get -q update
apt-get -q install -y --no-install-recommends "$@"
apt-get clean
rm -rf /var/lib/apt/lists/*
' sh "$@"
rm -f "$ROOT/usr/sbin/policy-rc.d"
"""


def ensure_speech_rootfs(base, log=print):
    """The cached speech root filesystem, built from BASE (the cached base,
    nspawn.ensure_rootfs()) when absent or stale. Returns (path, seconds
    spent building: 0.0 when cached)."""
    return _ensure_layer(base, SPEECH_ROOTFS, speech_stamp_text(), SPEECH_PACKAGES, log)


def agent_stamp_text():
    return speech_stamp_text() + f"apt-install={','.join(AGENT_PACKAGES)}\n"


def ensure_agent_rootfs(speech, log=print):
    """The cached agent root filesystem: the speech one (SPEECH, from
    ensure_speech_rootfs()) plus sway with Xwayland and PipeWire with its
    pulse server (AGENT_PACKAGES), built when absent or stale. Returns
    (path, seconds spent building: 0.0 when cached)."""
    return _ensure_layer(speech, AGENT_ROOTFS, agent_stamp_text(), AGENT_PACKAGES, log)


def x11_stamp_text():
    return agent_stamp_text() + f"apt-install={','.join(X11_PACKAGES)}\n"


def ensure_x11_rootfs(agent, log=print):
    """The cached X11 root filesystem: the agent one (AGENT, from
    ensure_agent_rootfs()) plus picom, matchbox, ImageMagick, xsettingsd and wvkbd
    (X11_PACKAGES), built when absent or stale. Returns (path, seconds
    spent building: 0.0 when cached)."""
    return _ensure_layer(agent, X11_ROOTFS, x11_stamp_text(), X11_PACKAGES, log)


# System mode for the kiosk browser (test_browser_units.py): the dconf
# backend, the agent admitted for the kiosk user (no seat0 session in a
# container), and the kiosk user a client, so that its launcher
# (`guidedaccessctl --system browser`) may attach the browser; the page API
# for the origin of the page the test serves on 127.0.0.1:8088.
BROWSER_KIOSK_PAGE_ORIGIN = "http://127.0.0.1:8088"
BROWSER_KIOSK_CONFIG = f"""\
[Service]
Backend=dconf

[Agent]
AllowUsers={KIOSK_USER}

[Clients]
AllowUsers={KIOSK_USER}

[Browser]
AllowOrigins={BROWSER_KIOSK_PAGE_ORIGIN}
"""


def browser_stamp_text():
    return nspawn.stamp_text() + f"apt-install={','.join(BROWSER_PACKAGES)}\n"


def ensure_browser_rootfs(base, log=print):
    """The cached browser root filesystem: the base (BASE, from
    nspawn.ensure_rootfs(), not the speech one) plus Chromium and iproute2
    (BROWSER_PACKAGES), built when absent or stale. Returns (path, seconds
    spent building: 0.0 when cached)."""
    return _ensure_layer(base, BROWSER_ROOTFS, browser_stamp_text(), BROWSER_PACKAGES, log)


def _ensure_layer(base, name, stamp, packages, log):
    """CACHE_DIR/NAME: a copy of BASE with PACKAGES installed by apt-get in
    a chroot, cached under STAMP."""

    def install(work, mirror):
        log(f"container: building {nspawn.CACHE_DIR / name}: {base} and apt-get install "
            f"{' '.join(packages)} (under a minute)")
        subprocess.run(["cp", "-a", "--reflink=auto", f"{base}/.", str(work)], check=True, capture_output=True)
        (work / nspawn.STAMP_NAME).unlink()
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-ec", _APT_SCRIPT, "sh", *packages],
            env={"PATH": nspawn.PATH, "ROOT": str(work)}, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(f"apt-get install in {work} failed ({result.returncode}):\n"
                               f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")

    return nspawn.build_cached(name, stamp, install)


# --- the user's manager, its units --------------------------------------------


def wait_for(predicate, what, timeout=15.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def add_user(ct, user=KIOSK_USER, uid=KIOSK_UID):
    """The kiosk user, unless it exists (conftest.install() adds it too)."""
    if ct.run(["id", "-u", user], check=False).returncode != 0:
        ct.run(["useradd", "--create-home", "--uid", str(uid), user])


def enable_linger(ct, user=KIOSK_USER):
    """`loginctl enable-linger`: logind starts user@UID.service and keeps it
    without a login. Returns the seconds until the manager answers on the
    user's bus (it connects there once dbus.socket has started the bus)."""
    started = time.monotonic()
    ct.run(["loginctl", "enable-linger", user])
    uid = ct.uid(user)
    wait_for(lambda: ct.run(["systemctl", "is-active", "-q", f"user@{uid}.service"], check=False).returncode == 0,
             f"user@{uid}.service")
    wait_for(lambda: ct.run(["busctl", "--user", "get-property", *MANAGER, "Version"], user=user,
                            check=False).returncode == 0, f"user {user}'s manager on its bus")
    return time.monotonic() - started


def systemctl(ct, *args, user=KIOSK_USER, check=True):
    return ct.run(["systemctl", "--user", *args], user=user, check=check)


def systemd_run(ct, unit, argv, user=KIOSK_USER, description=None):
    """`systemd-run --user --unit=UNIT`: a transient unit of the user's manager."""
    return ct.run(["systemd-run", "--user", "-q", f"--unit={unit}",
                   *([f"--description={description}"] if description else []), "--", *argv], user=user)


def unit(ct, name, *properties, user=KIOSK_USER):
    """{property: value} from `systemctl --user show` (strings)."""
    out = systemctl(ct, "show", "-p", ",".join(properties), name, user=user).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_unit(ct, name, what, predicate, *properties, user=KIOSK_USER, timeout=15.0):
    """Polls PROPERTIES of NAME until PREDICATE(dict) holds; returns the dict."""
    found = {}

    def check():
        found.update(unit(ct, name, *properties, user=user))
        return predicate(found)

    wait_for(check, f"{name}: {what} (last {found})", timeout=timeout)
    return dict(found)


def cgroup_pids(ct, control_group):
    """The pids in a unit's cgroup (its ControlGroup property), as the
    container sees them; [] once the cgroup is gone."""
    result = ct.run(["cat", f"/sys/fs/cgroup{control_group}/cgroup.procs"], check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def comm(ct, pid):
    return ct.run(["cat", f"/proc/{pid}/comm"], check=False).stdout.strip()


# --- the display and the speech -----------------------------------------------


def start_xvfb(ct, user=KIOSK_USER, display=DISPLAY):
    """Xvfb as a user unit (Orca 43 needs DISPLAY: it runs xkbcomp at
    start-up). Returns the seconds until its socket is there."""
    started = time.monotonic()
    systemd_run(ct, XVFB_UNIT, ["/usr/bin/Xvfb", display, "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                user=user, description=f"X display {display} for tests")
    socket = f"/tmp/.X11-unix/X{display.lstrip(':')}"
    wait_for(lambda: ct.run(["test", "-S", socket], check=False).returncode == 0, f"Xvfb's socket {socket}")
    return time.monotonic() - started


def configure_speech(ct, user=KIOSK_USER):
    """speechd.conf in the user's XDG_CONFIG_HOME (SPEECHD_CONF)."""
    ct.sh("mkdir -p ~/.config/speech-dispatcher && cat > ~/.config/speech-dispatcher/speechd.conf",
          user=user, input=SPEECHD_CONF)


def speech_log_path(ct, user=KIOSK_USER):
    return f"/run/user/{ct.uid(user)}/speech-dispatcher/log/speech-dispatcher.log"


# "[Tue Nov 24 04:56:09 2026 : 82306] speechd:     MSG before index marking: |<speak>…</speak>|, ssml_mode=1":
# local time (the root filesystem's is UTC) and microseconds, not zero-padded.
_SAID = re.compile(r"^\[(\w+ \w+ +\d+ [\d:]+ \d+) : (\d+)\] speechd:\s+MSG before index marking: \|(.*)\|, ssml_mode",
                   re.M)


def spoken(ct, user=KIOSK_USER):
    """[(when, text)]: what speech-dispatcher was asked to speak, in order,
    when (seconds since the epoch) and without the SSML markup Orca wraps
    it in ("Screen reader on.")."""
    log = ct.run(["cat", speech_log_path(ct, user)], check=False).stdout
    said = []
    for stamp, micro, text in _SAID.findall(log):
        when = calendar.timegm(time.strptime(stamp, "%a %b %d %H:%M:%S %Y")) + int(micro) / 1e6
        said.append((when, re.sub(r"\s+", " ", re.sub(r"<[^>]*>", "", text)).strip()))
    return said


def utterances(ct, user=KIOSK_USER):
    return [text for _, text in spoken(ct, user)]


def wait_for_utterance(ct, text=None, since=0, user=KIOSK_USER, timeout=20.0):
    """Waits until speech-dispatcher's log has an utterance after the first
    SINCE (TEXT, or any); returns (its index, when it was logged)."""
    def found():
        for index, (when, said) in enumerate(spoken(ct, user)[since:], since):
            if text is None or said == text:
                return index, when
        return None

    return wait_for(found, f"speech-dispatcher to say {text or 'anything'!r}", timeout=timeout)


def prepare(ct, user=KIOSK_USER):
    """The kiosk user with a running manager, DISPLAY and speech logging.
    Returns {step: seconds}."""
    add_user(ct, user)
    times = {"linger → user manager on its bus": enable_linger(ct, user)}
    times["Xvfb unit → socket"] = start_xvfb(ct, user)
    configure_speech(ct, user)
    return times


# --- the locked kiosk that speaks through the session agent -------------------
#
# test_agent_speech.py: system mode (guidedaccessd.service, dconf) with the
# session agent enabled for every user, a headless sway with Xwayland as the
# kiosk user's compositor, PipeWire with a null sink `speech` as the only
# (so default) sink, speech-dispatcher speaking through pulse into it, and
# parec recording its monitor.

# The service's configuration: the dconf backend, the agent admitted for the
# kiosk user (no seat0 session in a container), and outside a session the
# kiosk user's own values writable, so that the session's lock shows.
AGENT_CONFIG = f"""\
[Service]
Backend=dconf

[Agent]
AllowUsers={KIOSK_USER}

[Dconf]
LockOutsideSession=false
"""

AGENT_UNIT = "guidedaccess-agent.service"
SWAY_UNIT = "guidedaccess-test-sway.service"
SWAY_CONFIG_PATH = "/etc/guidedaccess-test/sway.conf"
# `xwayland enable`: sway holds X socket :0 and starts Xwayland when the
# first X client (Orca's xkbcomp) connects.
SWAY_CONFIG = """\
xwayland enable
output HEADLESS-1 resolution 1280x800
"""
# Until the pulse server answers with the speech sink as its default, that
# is, WirePlumber runs its policy: a stream that appears before (parec's,
# speech-dispatcher's) may never be linked ("pending linkable(s) not
# activated in 20sec", WirePlumber 0.4.13), and speech-dispatcher's module
# then hangs in INIT. Seen at about one login in six without this wait.
WAIT_FOR_SOUND_SERVER = ("/bin/sh -c 'for i in $(seq 200); do pactl info 2>/dev/null | grep -q \"Default Sink: speech\" "
                         "&& exit 0; sleep 0.05; done; exit 1'")
# The kiosk's compositor, started by the user's manager at login, as a
# kiosk session would; after the sound server (so that the screen reader,
# which the agent starts once the display is there, finds it ready).
# WAYLAND_DISPLAY and DISPLAY are given to no one: the agent finds them
# from the sockets (SessionProbe).
SWAY_SERVICE = f"""\
[Unit]
Description=Headless sway for the agent test
Wants=pipewire-pulse.service wireplumber.service
After=pipewire-pulse.service wireplumber.service guidedaccess-test-parec.service
[Service]
Environment=WLR_BACKENDS=headless WLR_LIBINPUT_NO_DEVICES=1 WLR_RENDERER=pixman
ExecStartPre={WAIT_FOR_SOUND_SERVER}
ExecStart=/usr/bin/sway --config {SWAY_CONFIG_PATH}
[Install]
WantedBy=default.target
"""
# A null sink from PipeWire's start (pactl's module would come too late
# after a reboot): the only sink, so WirePlumber makes it the default.
SPEECH_SINK_CONF = """\
context.objects = [
    { factory = adapter
      args = {
          factory.name     = support.null-audio-sink
          node.name        = "speech"
          node.description = "Speech (test sink)"
          media.class      = "Audio/Sink"
          audio.position   = [ MONO ]
          monitor.channel-volumes = true
      }
    }
]
"""
SPEECHD_CONF_PULSE = SPEECHD_CONF.replace('AudioOutputMethod "alsa"\nAudioALSADevice "null"\n',
                                          'AudioOutputMethod "pulse"\n')
assert SPEECHD_CONF_PULSE != SPEECHD_CONF
RECORDER_UNIT = "guidedaccess-test-parec.service"
RECORDING_RATE = 22050
RECORDING = f"/home/{KIOSK_USER}/speech.wav"
# What reaches the speech sink, recorded from the monitor (20 ms latency:
# the default loses seconds at the end); each start begins a new file.
# Enabled for the kiosk user, it records from the login on.
RECORDER_SERVICE = f"""\
[Unit]
Description=Speech recorder for the agent test
Wants=pipewire-pulse.service wireplumber.service
After=pipewire-pulse.service wireplumber.service
StartLimitIntervalSec=0
[Service]
Restart=on-failure
RestartSec=200ms
ExecStartPre={WAIT_FOR_SOUND_SERVER}
ExecStart=/usr/bin/parec -d speech.monitor --latency-msec=20 --file-format=wav --rate={RECORDING_RATE} \\
    --channels=1 --format=s16le %h/speech.wav
[Install]
WantedBy=default.target
"""

# Run in the container with python3: RMS of each 10 ms window of the
# recording (s16le mono) from SINCE (seconds since the epoch) on, timed from
# its end: the file's mtime is its last write, parec writing every 20 ms.
# Prints JSON {"end": t, "windows": [[t, rms], ...]}.
_WINDOWS_SCRIPT = r"""
import json, math, os, struct, sys
path, since = sys.argv[1], float(sys.argv[2])
with open(path, "rb") as f:
    head = f.read(4096)
    start = head.find(b"data") + 8
    rate = struct.unpack("<I", head[24:28])[0]
    st = os.fstat(f.fileno())
    end = st.st_mtime_ns / 1e9
    total = (st.st_size - start) // 2
    first = min(total, max(0, total - int((end - since) * rate)))
    f.seek(start + 2 * first)
    pcm = f.read(2 * (total - first))
n = len(pcm) // 2
samples = struct.unpack(f"<{n}h", pcm[:2 * n])
win = rate // 100
windows = []
for k in range(0, n - win + 1, win):
    chunk = samples[k:k + win]
    windows.append([round(end - (total - first - k) / rate, 4), round(math.sqrt(sum(s * s for s in chunk) / win), 1)])
print(json.dumps({"end": end, "windows": windows}))
"""
# RMS (of 32767) above which a 10 ms window is sound: the null sink's
# silence is exactly 0, espeak-ng's speech some thousands.
LOUD = 100.0


def prepare_agent_kiosk(ct, user=KIOSK_USER):
    """System mode as an administrator sets up a locked kiosk that speaks:
    the kiosk user, the dconf profile line, AGENT_CONFIG, guidedaccessd.service
    enabled and started, the agent enabled for every user (`systemctl
    --global enable`), sway enabled the same way, PipeWire's null sink, and
    the kiosk user's speechd.conf (pulse). Nobody has logged in yet.
    Returns {step: seconds}."""
    started = time.monotonic()
    _write_speaking_locked_kiosk(ct, user)
    ct.sh(f"mkdir -p {SWAY_CONFIG_PATH.rsplit('/', 1)[0]} && cat > {SWAY_CONFIG_PATH}", input=SWAY_CONFIG)
    ct.sh(f"cat > /etc/systemd/user/{SWAY_UNIT}", input=SWAY_SERVICE)
    _enable_locked_kiosk(ct, SWAY_UNIT)
    return {"system mode, agent and sway enabled": time.monotonic() - started}


def _write_speaking_locked_kiosk(ct, user):
    """What prepare_agent_kiosk and prepare_x11_kiosk share: the kiosk user,
    the dconf profile line, AGENT_CONFIG, the recorder's user unit,
    PipeWire's null sink and the kiosk user's speechd.conf (pulse)."""
    add_user(ct, user)
    ct.run(["guidedaccess-dconf-profile"])
    ct.sh("mkdir -p /etc/guidedaccess && cat > /etc/guidedaccess/guidedaccess.conf", input=AGENT_CONFIG)
    ct.sh(f"mkdir -p /etc/systemd/user && cat > /etc/systemd/user/{RECORDER_UNIT}", input=RECORDER_SERVICE)
    ct.sh("mkdir -p /etc/pipewire/pipewire.conf.d && cat > /etc/pipewire/pipewire.conf.d/speech-sink.conf",
          input=SPEECH_SINK_CONF)
    ct.sh("mkdir -p ~/.config/speech-dispatcher && cat > ~/.config/speech-dispatcher/speechd.conf", user=user,
          input=SPEECHD_CONF_PULSE)


def _enable_locked_kiosk(ct, *session_units):
    """The bus and systemd told of the files written; guidedaccessd.service
    enabled and started; the agent and SESSION_UNITS enabled for every user."""
    ct.run(["busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "ReloadConfig"])
    ct.run(["systemctl", "daemon-reload"])
    ct.run(["systemctl", "enable", "--now", "guidedaccessd.service"])
    ct.run(["systemctl", "--global", "enable", AGENT_UNIT, *session_units])


def start_recording(ct, user=KIOSK_USER):
    """RECORDER_UNIT (re)started: parec on the speech sink's monitor into
    RECORDING, a new file; returns once it writes."""
    systemctl(ct, "restart", RECORDER_UNIT, user=user)
    wait_for_recording(ct)


def wait_for_recording(ct, since=0.0):
    """Waits until RECORDING has been written after SINCE (seconds since the epoch)."""
    def writing():
        out = ct.run(["stat", "-c", "%s %.9Y", RECORDING], check=False).stdout.split()
        return out and int(out[0]) > 4096 and float(out[1]) > since

    wait_for(writing, f"parec writing {RECORDING}", timeout=15)


def sound(ct, since, path=RECORDING):
    """(end of the recording, [(time, rms)] of its 10 ms windows from SINCE)."""
    out = ct.run(["python3", "-c", _WINDOWS_SCRIPT, path, repr(since)]).stdout
    found = json.loads(out)
    return found["end"], [tuple(w) for w in found["windows"]]


def wait_for_sound(ct, since, timeout=10.0):
    """The time of the first loud window after SINCE, once there is one."""
    def onset():
        _, windows = sound(ct, since)
        return next((t for t, rms in windows if rms > LOUD), None)

    return wait_for(onset, f"sound on the speech sink after {since}", timeout=timeout, interval=0.25)


def last_sound(ct, since, quiet_for):
    """Waits until the recording reaches QUIET_FOR seconds past SINCE; returns
    (the time of the last loud window after SINCE or None, the loudest RMS
    in the last QUIET_FOR/2 seconds)."""
    wait_for(lambda: sound(ct, since + quiet_for)[0] > since + quiet_for + 0.05, "the recording to go on",
             timeout=quiet_for + 10, interval=0.2)
    end, windows = sound(ct, since)
    loud = [t for t, rms in windows if rms > LOUD]
    tail = [rms for t, rms in windows if t > end - quiet_for / 2]
    return (loud[-1] if loud else None), max(tail, default=0.0)


def user_processes(ct, pattern, uid=KIOSK_UID):
    """[(pid, unit cgroup, command line)] of the processes in user@UID's
    cgroup tree whose command line holds PATTERN."""
    out = ct.sh(
        f"find /sys/fs/cgroup/user.slice/user-{uid}.slice -name cgroup.procs | while read f; do "
        "  for p in $(cat $f); do printf '%s %s %s\\n' $p \"$(dirname $f)\" \"$(tr '\\0' ' ' < /proc/$p/cmdline)\"; "
        "  done; done 2>/dev/null || true").stdout
    found = []
    for line in out.splitlines():
        pid, cgroup, command = (line.split(" ", 2) + [""])[:3]
        if pattern in command:
            found.append((int(pid), cgroup.removeprefix("/sys/fs/cgroup"), command.strip()))
    return found


def journal(ct, args, user=None):
    """[(seconds since the epoch, pid, message)] of `journalctl -o json ARGS`."""
    out = ct.run(["journalctl", "--no-pager", "-o", "json", *args], user=user, check=False).stdout
    entries = []
    for line in out.splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE")
        if not isinstance(message, str):
            continue
        stamp = entry.get("_SOURCE_REALTIME_TIMESTAMP") or entry["__REALTIME_TIMESTAMP"]
        entries.append((int(stamp) / 1e6, int(entry.get("_PID", 0)), message))
    return entries


# --- an X11 kiosk with the session agent --------------------------------------
#
# test_x11_agent.py: the same system mode and speech as the locked kiosk
# above, but a bare X display instead of sway: the kiosk user's login starts
# Xvfb with GLX (with an -auth file, as startx runs its server), matchbox and
# the kiosk's GTK window (Tests/desktop/gtk_button.py), and the agent; the
# user's manager is given neither DISPLAY nor XAUTHORITY (only the kiosk's
# own units have them), so the agent finds the X socket and its cookie. A
# second X server, root's, on a lower display number stands for a display
# manager's: the agent must take its own user's.

X11_DISPLAY = ":7"
X11_ROOT_DISPLAY = ":0"
X11_AUTH = f"/home/{KIOSK_USER}/.serverauth.kiosk"
X11_ROOT_AUTH = "/root/.serverauth.greeter"
X11_SIZE = (800, 600)
X11_SERVER_UNIT = "guidedaccess-test-x11.service"
X11_SESSION_UNIT = "guidedaccess-test-x11-session.service"
X11_ROOT_UNIT = "guidedaccess-test-root-x11.service"
GTK_BUTTON_PATH = "/etc/guidedaccess-test/gtk_button.py"
X11_LABEL = "Order now"
# The kiosk app's own look: saturated hues, darker towards the bottom (a GTK
# user stylesheet), so that grayscale takes much saturation away
# (Tests/desktop/x11.py's).
X11_COLOURFUL_CSS = """\
window {
  background-image: linear-gradient(to bottom, rgba(0, 0, 0, 0.1), rgba(0, 0, 0, 0.7)),
                    linear-gradient(to right, #e01b24, #f6d32d, #33d17a, #33c7de, #3584e4, #c061cb);
}
"""
_WAIT_FOR_X_SOCKET = (f"/bin/sh -c 'for i in $(seq 200); do test -S /tmp/.X11-unix/X{X11_DISPLAY[1:]} && exit 0; "
                      "sleep 0.05; done; exit 1'")
# The X server, after the sound server (as sway above: the screen reader,
# which the agent may start once the display is there, finds it ready).
X11_SERVER_SERVICE = f"""\
[Unit]
Description=The kiosk's X server for the X11 agent test
Wants=pipewire-pulse.service wireplumber.service
After=pipewire-pulse.service wireplumber.service {RECORDER_UNIT}
[Service]
ExecStartPre={WAIT_FOR_SOUND_SERVER}
ExecStart=/usr/bin/Xvfb {X11_DISPLAY} -screen 0 {X11_SIZE[0]}x{X11_SIZE[1]}x24 +extension GLX -nolisten tcp \\
    -auth {X11_AUTH}
[Install]
WantedBy=default.target
"""
# What an .xinitrc would run: the window manager, then the kiosk's app.
X11_SESSION_SERVICE = f"""\
[Unit]
Description=The kiosk's window manager and app for the X11 agent test
Requires={X11_SERVER_UNIT}
After={X11_SERVER_UNIT}
[Service]
Environment=DISPLAY={X11_DISPLAY} XAUTHORITY={X11_AUTH}
ExecStartPre={_WAIT_FOR_X_SOCKET}
ExecStart=/bin/sh -c 'matchbox-window-manager -use_titlebar no & exec python3 -u {GTK_BUTTON_PATH} Order "{X11_LABEL}"'
[Install]
WantedBy=default.target
"""
# An Xauthority file of one MIT-MAGIC-COOKIE-1 for any address and display
# NUMBER (startx's ~/.serverauth.NNN), written by python3 in the container.
_WRITE_XAUTHORITY = r"""
import os, struct, sys
path, number = sys.argv[1], sys.argv[2].encode()
counted = lambda data: struct.pack(">H", len(data)) + data
entry = (struct.pack(">H", 0xFFFF) + counted(b"") + counted(number) + counted(b"MIT-MAGIC-COOKIE-1")
         + counted(os.urandom(16)))
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, entry)
os.close(fd)
"""


def prepare_x11_kiosk(ct, gtk_button, user=KIOSK_USER):
    """System mode as for the locked kiosk above (AGENT_CONFIG, the agent
    enabled for every user, PipeWire's null sink, speech through pulse),
    with an X11 kiosk session enabled for every user instead of sway: Xvfb
    on X11_DISPLAY with -auth X11_AUTH, matchbox and the GTK window
    (GTK_BUTTON, the text of Tests/desktop/gtk_button.py), painted with
    X11_COLOURFUL_CSS; and root's own X server on X11_ROOT_DISPLAY, running.
    Nobody has logged in yet. Returns {step: seconds}."""
    started = time.monotonic()
    _write_speaking_locked_kiosk(ct, user)
    ct.sh(f"mkdir -p {GTK_BUTTON_PATH.rsplit('/', 1)[0]} && cat > {GTK_BUTTON_PATH}", input=gtk_button)
    ct.sh(f"cat > /etc/systemd/user/{X11_SERVER_UNIT}", input=X11_SERVER_SERVICE)
    ct.sh(f"cat > /etc/systemd/user/{X11_SESSION_UNIT}", input=X11_SESSION_SERVICE)
    ct.sh("mkdir -p ~/.config/gtk-3.0 && cat > ~/.config/gtk-3.0/gtk.css", user=user, input=X11_COLOURFUL_CSS)
    ct.run(["python3", "-c", _WRITE_XAUTHORITY, X11_AUTH, X11_DISPLAY[1:]], user=user)
    ct.run(["python3", "-c", _WRITE_XAUTHORITY, X11_ROOT_AUTH, X11_ROOT_DISPLAY[1:]])
    ct.run(["systemd-run", "-q", f"--unit={X11_ROOT_UNIT}", "--description=root's X server (a display manager's)",
            "--", "/usr/bin/Xvfb", X11_ROOT_DISPLAY, "-screen", "0", "640x480x24", "-nolisten", "tcp",
            "-auth", X11_ROOT_AUTH])
    _enable_locked_kiosk(ct, X11_SERVER_UNIT, X11_SESSION_UNIT)
    root_socket = f"/tmp/.X11-unix/X{X11_ROOT_DISPLAY[1:]}"
    wait_for(lambda: ct.run(["test", "-S", root_socket], check=False).returncode == 0, f"root's X socket {root_socket}")
    return {"system mode, agent and X11 session enabled, root's X server": time.monotonic() - started}


def x11(ct, argv, user=KIOSK_USER, **kwargs):
    """ARGV as the kiosk user, an X client of its display (DISPLAY and
    XAUTHORITY set, as the kiosk's own programs have them)."""
    return ct.run(["env", f"DISPLAY={X11_DISPLAY}", f"XAUTHORITY={X11_AUTH}", *argv], user=user, **kwargs)


def screenshot(ct, path):
    """The root window (what the screen shows: the compositor's output while
    one runs) as a PNG at PATH in the container, by `import -window root`."""
    x11(ct, ["import", "-silent", "-window", "root", path])
    return path


def saturation(ct, path):
    """Mean HSL saturation of the image at PATH, 0…1."""
    return float(ct.run(["convert", path, "-colorspace", "HSL", "-format", "%[fx:mean.g]", "info:"]).stdout)


def pixels_changed(ct, a, b):
    """ImageMagick's `compare -metric AE`: how many pixels differ."""
    out = ct.run(["compare", "-metric", "AE", a, b, "null:"], check=False)
    return int(float(out.stderr.split()[0]))
