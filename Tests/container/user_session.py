"""The kiosk user's own systemd manager, an X display and speech that can
be read, inside the Debian 12 container (nspawn.Container): what the
service's screen reader, a transient unit of that manager, needs around it.

- `ensure_speech_rootfs()`: the base root filesystem plus Orca 43,
  speech-dispatcher with espeak-ng and Xvfb, cached beside it as
  rootfs-bookworm-speech (a copy of the base, `apt-get install` in a chroot;
  its stamp is the base's plus the package list, so either change rebuilds
  it). The base itself stays as it is: the other tests keep their smaller one.
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
import re
import subprocess
import time

import nspawn
from container_setup import KIOSK_UID, KIOSK_USER

SPEECH_PACKAGES = ["orca", "speech-dispatcher", "speech-dispatcher-espeak-ng", "xvfb"]
SPEECH_ROOTFS = f"rootfs-{nspawn.SUITE}-speech"

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

    def install(work, mirror):
        log(f"container: building {nspawn.CACHE_DIR / SPEECH_ROOTFS}: {base} and apt-get install "
            f"{' '.join(SPEECH_PACKAGES)} (under a minute)")
        subprocess.run(["cp", "-a", "--reflink=auto", f"{base}/.", str(work)], check=True, capture_output=True)
        (work / nspawn.STAMP_NAME).unlink()
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-ec", _APT_SCRIPT, "sh", *SPEECH_PACKAGES],
            env={"PATH": nspawn.PATH, "ROOT": str(work)}, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(f"apt-get install in {work} failed ({result.returncode}):\n"
                               f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")

    return nspawn.build_cached(SPEECH_ROOTFS, speech_stamp_text(), install)


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
