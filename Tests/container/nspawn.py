"""A Debian 12 container booted with systemd as PID 1, for the system test.

- `ensure_rootfs()`: the root filesystem, built once with debootstrap from the
  mirror apt already uses and cached at CACHE_DIR/rootfs-bookworm; a stamp
  inside it records the suite, variant and package list, and a different list
  rebuilds it. It is built in a temporary directory beside it and renamed
  into place, under a lock.
- `Container`: boots that root filesystem with systemd-nspawn (`--volatile=
  overlay`: every run starts from the pristine cache and leaves nothing in
  it), runs commands inside with nsenter, and cleans up after itself: power
  off, kill stragglers, remove the cgroups nspawn leaves behind on a host
  without systemd, and `/run/systemd/nspawn/propagate/NAME`.

Facts about this recipe: ../../../shared/notes/real-systems.md, section 2.
"""

import ctypes
import fcntl
import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

SUITE = "bookworm"
VARIANT = "minbase"
# dbus-user-session: without it dconf-service fails to configure, and the
# kiosk user gets no session bus from user@.service. systemd-journal-remote
# (journal-upload and journal-remote, enabled by nothing) and python3-dbus
# (a caller that makes several calls on one connection): test_fleet.py.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "dbus-user-session", "polkitd", "pkexec",
    "libpam-systemd", "dconf-cli", "gsettings-desktop-schemas", "libglib2.0-bin",
    "systemd-journal-remote", "python3-dbus",
]
CACHE_DIR = Path(os.environ.get("GA_CONTAINER_CACHE", "/var/cache/guidedaccess-tests"))
STAMP_NAME = ".guidedaccess-tests-stamp"
CGROUP_PREFIX = "guidedaccess-ct-"
PROPAGATE_DIR = Path("/run/systemd/nspawn/propagate")
PR_SET_PDEATHSIG = 1
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Unavailable(Exception):
    """This machine cannot run the container test (the message says why)."""


# --- the root filesystem ---------------------------------------------------


def stamp_text():
    return f"suite={SUITE}\nvariant={VARIANT}\ninclude={','.join(PACKAGES)}\n"


def debian_mirror():
    """The Debian mirror apt uses for SUITE (deb822 .sources or sources.list)."""
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for stanza in re.split(r"\n\s*\n", Path(path).read_text()):
            fields = {}
            for line in stanza.splitlines():
                m = re.match(r"([A-Za-z-]+):\s*(.*)", line)
                if m and not line.startswith("#"):
                    fields[m.group(1).lower()] = m.group(2).split()
            if "deb" in fields.get("types", []) and SUITE in fields.get("suites", []) and fields.get("uris"):
                return fields["uris"][0].rstrip("/")
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        if not os.path.exists(path):
            continue
        for line in Path(path).read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                return words[1].rstrip("/")
    return None


def ensure_rootfs(log=print):
    """The cached root filesystem, built when absent or stale.
    Returns (path, seconds spent building: 0.0 when cached)."""

    def debootstrap(work, mirror):
        log(f"container: building {CACHE_DIR / f'rootfs-{SUITE}'} with debootstrap from {mirror} (about a minute)")
        result = subprocess.run(
            ["debootstrap", f"--variant={VARIANT}", f"--include={','.join(PACKAGES)}", SUITE, str(work), mirror],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            debootstrap_log = work / "debootstrap" / "debootstrap.log"
            tail = debootstrap_log.read_text()[-3000:] if debootstrap_log.exists() else ""
            raise RuntimeError(
                f"debootstrap failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}\n{tail}")

    return build_cached(f"rootfs-{SUITE}", stamp_text(), debootstrap)


def build_cached(name, wanted, build):
    """The cached root filesystem CACHE_DIR/NAME whose stamp is `wanted`:
    as it is, or made anew by build(work, mirror) in a temporary directory
    that then replaces it whole. One build at a time (a lock in CACHE_DIR).
    Returns (path, seconds spent building: 0.0 when cached)."""
    root = CACHE_DIR / name
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = root / STAMP_NAME
        if stamp.is_file() and stamp.read_text() == wanted:
            return root, 0.0
        mirror = debian_mirror()
        if not mirror:
            raise Unavailable(f"no Debian mirror for {SUITE} in /etc/apt/sources.list(.d): cannot build {name}")
        try:
            urllib.request.urlopen(f"{mirror}/dists/{SUITE}/Release", timeout=20).close()
        except Exception as error:  # noqa: BLE001 (any network failure means the same)
            raise Unavailable(f"the Debian mirror {mirror} cannot be reached ({error}): cannot build {name}")
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(dir=CACHE_DIR, prefix=f".{name}."))
        try:
            work.chmod(0o755)  # it becomes the container's /
            build(work, mirror)
            (work / STAMP_NAME).write_text(wanted)
            old = None
            if root.exists():
                old = Path(tempfile.mkdtemp(dir=CACHE_DIR, prefix=f".{name}.old."))
                os.rename(root, old / "rootfs")
            os.rename(work, root)
            work = None
            if old:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
        return root, time.monotonic() - started


# --- cgroups ------------------------------------------------------------------


def cgroup2_mount():
    """Where the cgroup2 (unified) hierarchy is mounted: /sys/fs/cgroup on a
    unified host, /sys/fs/cgroup/unified on a hybrid one."""
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            left, _, right = line.partition(" - ")
            if right.split()[0] == "cgroup2":
                return left.split()[4]
    return None


def own_cgroup2_path():
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return "/"


def cgroup_tree(path):
    """Every cgroup directory under path, deepest first."""
    dirs = [d for d, _, _ in os.walk(path)]
    return sorted(dirs, key=lambda d: d.count("/"), reverse=True)


def cgroup_pids(path):
    pids = []
    for d in cgroup_tree(path):
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return pids


def remove_cgroup(path, timeout=10.0):
    """Kills whatever is left in the cgroup tree and removes it, bottom up."""
    if not os.path.isdir(path):
        return
    deadline = time.monotonic() + timeout
    while True:
        pids = cgroup_pids(path)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            for d in cgroup_tree(path):
                os.rmdir(d)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def remove_stale():
    """What an earlier run that was killed left: our cgroups without
    processes and their machines' propagate directories."""
    base = cgroup2_mount()
    if not base:
        return
    parent = os.path.normpath(f"{base}/{own_cgroup2_path()}")
    for path in glob.glob(os.path.join(parent, CGROUP_PREFIX + "*")):
        if not cgroup_pids(path):
            name = os.path.basename(path)
            try:
                remove_cgroup(path, timeout=1)
            except OSError:
                continue
            remove_propagate(name)


def remove_propagate(name):
    path = PROPAGATE_DIR / name
    for mount in mounts_under(path):
        subprocess.run(["umount", "-l", mount], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def mounts_under(path):
    path = str(path).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].replace("\\040", " ")
            if point == path or point.startswith(path + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


# --- the container ------------------------------------------------------------


class Container:
    """systemd-nspawn --boot of ROOT with STAGE bound read-only at /stage.

    By default every boot starts from ROOT as it is (`--volatile=overlay`).
    With `persistent=True` the container's changes go to an overlay upper
    directory under WORKDIR that outlives a power-off, so `reboot()` boots
    the same system again: what a reboot keeps, it keeps."""

    def __init__(self, root, stage, workdir, persistent=False, suffix=""):
        self.lower = Path(root)
        self.persistent = persistent
        self.layers = Path(workdir) / "layers"
        self.root = self.layers / "merged" if persistent else self.lower
        self.stage = Path(stage)
        self.name = f"{CGROUP_PREFIX}{os.getpid()}{suffix}"
        self.console_path = Path(workdir) / "console.log"
        self.process = None
        self.pid1 = None
        self._uids = {}
        base = cgroup2_mount()
        if not base:
            raise Unavailable("no cgroup2 hierarchy is mounted: systemd-nspawn cannot give the container unified cgroups")
        self.cgroup = os.path.normpath(f"{base}/{own_cgroup2_path()}/{self.name}")

    def boot(self, timeout=60.0):
        """Starts the container and waits until systemd says it is up.
        Returns the seconds it took."""
        started = time.monotonic()
        os.makedirs(self.cgroup, exist_ok=True)
        procs = os.path.join(self.cgroup, "cgroup.procs")
        if self.persistent:
            for part in ("upper", "work", "merged"):
                (self.layers / part).mkdir(parents=True, exist_ok=True)
            (self.layers / "upper").chmod(0o755)  # it becomes the container's /
            subprocess.run(
                ["mount", "-t", "overlay", "overlay", "-o",
                 f"lowerdir={self.lower},upperdir={self.layers / 'upper'},workdir={self.layers / 'work'}",
                 str(self.root)], check=True, capture_output=True, text=True)

        def enter_cgroup():
            # nspawn makes payload/ and supervisor/ in the cgroup it starts in.
            with open(procs, "w") as f:
                f.write("0")
            # Should this process die without cleaning up, nspawn gets
            # SIGTERM, which powers the container off (--kill-signal's
            # default with --boot); the next run removes the rest.
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

        env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1")
        self.console = open(self.console_path, "w")
        self.process = subprocess.Popen(
            ["systemd-nspawn", "-q", "-D", str(self.root), "-M", self.name, "--boot",
             "--register=no", "--keep-unit", *([] if self.persistent else ["--volatile=overlay"]),
             "--private-network", "--system-call-filter=bpf", f"--bind-ro={self.stage}:/stage"],
            stdin=subprocess.DEVNULL, stdout=self.console, stderr=subprocess.STDOUT,
            env=env, preexec_fn=enter_cgroup)
        deadline = time.monotonic() + timeout
        while self.pid1 is None:
            if self.process.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited with {self.process.returncode}:\n{self.console_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no systemd in the container after {timeout} s:\n{self.console_tail()}")
            self.pid1 = self._find_pid1()
            if self.pid1 is None:
                time.sleep(0.05)
        # Until systemd has its private socket, systemctl cannot ask it: it
        # prints nothing or "offline" then.
        while True:
            result = self.run(["systemctl", "is-system-running", "--wait"], check=False,
                              timeout=max(1.0, deadline - time.monotonic()))
            state = result.stdout.strip()
            if state not in ("", "offline") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if state not in ("running", "degraded"):
            raise RuntimeError(f"the container's systemd is {state!r}:\n{self.console_tail()}")
        self.boot_state = state
        return time.monotonic() - started

    def _find_pid1(self):
        """The child of systemd-nspawn in another pid namespace whose comm is systemd."""
        own_ns = os.readlink("/proc/self/ns/pid")
        for status in glob.glob("/proc/[0-9]*/status"):
            try:
                text = Path(status).read_text()
                pid = int(status.split("/")[2])
                ppid = int(re.search(r"^PPid:\s+(\d+)", text, re.M).group(1))
                if ppid != self.process.pid or not re.search(r"^Name:\s+systemd$", text, re.M):
                    continue
                if os.readlink(f"/proc/{pid}/ns/pid") != own_ns:
                    return pid
            except (OSError, AttributeError, ValueError):
                continue
        return None

    def console_tail(self, chars=4000):
        try:
            return self.console_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def run(self, argv, user=None, check=True, timeout=60, input=None):
        """Runs argv inside the container (all its namespaces) with a clean
        environment; as `user` through runuser, with that user's session bus
        (user@UID.service) and runtime directory. Returns CompletedProcess."""
        command = ["nsenter", "-t", str(self.pid1), "-a", "--", "env", "-i", f"PATH={PATH}", "LANG=C.UTF-8"]
        if user is None:
            command += ["HOME=/root"]
        else:
            uid = self.uid(user)
            command += ["runuser", "-u", user, "--", "env", f"HOME=/home/{user}", f"USER={user}",
                        f"XDG_RUNTIME_DIR=/run/user/{uid}", f"DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{uid}/bus"]
        result = subprocess.run(command + list(argv), input=input, capture_output=True, text=True, timeout=timeout,
                                stdin=None if input is not None else subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(
                f"in the container{f' as {user}' if user else ''}: {' '.join(argv)} exited {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}")
        return result

    def sh(self, script, **kwargs):
        return self.run(["sh", "-ec", script], **kwargs)

    def uid(self, user):
        if user not in self._uids:
            self._uids[user] = int(self.run(["id", "-u", user]).stdout)
        return self._uids[user]

    def shutdown(self, timeout=30.0):
        """Powers off, then makes sure nothing is left: processes, cgroups,
        the propagate directory, mounts."""
        errors = []
        if self.process is not None and self.process.poll() is None:
            if self.pid1:
                try:
                    os.kill(self.pid1, signal.SIGRTMIN + 4)  # systemd: poweroff
                except ProcessLookupError:
                    pass
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                errors.append(f"the container did not power off in {timeout} s; killed")
                self.process.kill()
                self.process.wait(timeout=10)
        if getattr(self, "console", None):
            self.console.close()
        try:
            remove_cgroup(self.cgroup)
        except OSError as error:
            errors.append(f"cannot remove {self.cgroup}: {error}")
        remove_propagate(self.name)
        for mount in mounts_under(self.root):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        self.process = None
        self.pid1 = None
        return errors

    def reboot(self, timeout=60.0):
        """Powers off (systemd stops every service, as on a reboot) and boots
        the same system again; persistent containers only. Returns the
        seconds the boot took."""
        assert self.persistent, "reboot() keeps nothing without persistent=True"
        errors = self.shutdown()
        if errors:
            raise RuntimeError(f"power-off before the reboot: {errors}")
        self._uids = {}
        return self.boot(timeout)
