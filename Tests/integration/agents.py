"""The session agent (`guidedaccessd --agent`, spec 1.2 section 1) in the
integration tests: a kiosk user's session beside a GAEnv whose private bus
stands in for the system bus.

- AgentSession: what the agent needs around it, as one user (nobody by
  default, never root: root is never the agent): a private session bus of
  its own (dbus-daemon with the tests' bus.conf.in), HOME, XDG_* and a
  state directory owned by that user, the agent's configuration (the
  system configuration it reads: `[Service] Desktop=sway` and DISPLAY=:99,
  so that the screen reader is a program the agent runs), and a bin
  directory first on PATH.
- `orca` in that bin directory: a stand-in for Orca (real Orca speaks in
  the container test) that appends its pid to orca.pids and sleeps; with
  `orca="dies"`, one that exits half a second after each start; with
  `orca="broken"`, a file exec refuses, as a broken install is. The
  agent starts it with speech-dispatcher found on the real PATH.
- Agent: `setpriv --reuid=UID … guidedaccessd --agent` in that session,
  started, kill -9'd and started again; its log.
- FakeAgent (fake_agent.py): an agent we can make misbehave — slow to
  answer Apply, leaving in the middle of it — registering as another user.

Written against docs/dbus-api.md ("Session agents (1.2)").
"""

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from gadaemon import BUS_CONFIG_TEMPLATE, DAEMON_BINARY, _STARTED, _die_with_parent, _stop

HERE = Path(__file__).resolve().parent
AGENT_PATH = "/org/guidedaccess/Agent"
AGENT_IFACE = "org.guidedaccess.Agent1"
SESSION_NAME = "org.guidedaccess.SessionAgent"

FAKE_ORCA = """#!/bin/sh
echo $$ >> "{pids}"
exec sleep 100000
"""
# A stand-in that starts, then exits after half a second, every time.
DYING_ORCA = """#!/bin/sh
echo $$ >> "{pids}"
sleep 0.5
exit 3
"""


_COPIES = Path(tempfile.gettempdir()) / f"ga-agent-files-{os.getpid()}"


def readable(path):
    """A copy of one of our files (the daemon, fake_agent.py) that every
    user may read and run: the checkout may be below a directory only root
    may enter (/root on a fresh machine). One copy per test run."""
    path = Path(path)
    copy = _COPIES / path.name
    if not copy.exists() or copy.stat().st_mtime != path.stat().st_mtime:
        _COPIES.mkdir(exist_ok=True)
        os.chmod(_COPIES, 0o755)
        shutil.copy2(path, copy)
        os.chmod(copy, 0o755)
    return copy


atexit.register(shutil.rmtree, _COPIES, ignore_errors=True)


class AgentSession:
    """A kiosk user's session for an agent: its own session bus and home."""

    def __init__(self, system_address, user="nobody", desktop="sway", orca="sleeps", config_extra=""):
        entry = pwd.getpwnam(user)
        self.user, self.uid, self.gid = user, entry.pw_uid, entry.pw_gid
        self.system_address = system_address
        self.root = Path(tempfile.mkdtemp(prefix="/tmp/ga-ag-"))
        os.chmod(self.root, 0o755)
        for name in ("home", "config", "runtime", "bin"):
            (self.root / name).mkdir()
        self.state_dir = self.root / "home" / ".local" / "state" / "guidedaccess"
        self.pids_file = self.root / "orca.pids"
        self.pids_file.write_text("")
        orca_path = self.root / "bin" / "orca"
        if orca == "broken":
            orca_path.write_bytes(b"\x7fELF not really\n")
        else:
            orca_path.write_text({"sleeps": FAKE_ORCA, "dies": DYING_ORCA}[orca].format(pids=self.pids_file))
        orca_path.chmod(0o755)
        self.config = self.root / "agent.conf"
        self.config.write_text(f"[Service]\nDesktop={desktop}\n{config_extra}")
        self.socket = self.root / "bus"
        self.address = f"unix:path={self.socket}"
        config = BUS_CONFIG_TEMPLATE.read_text().replace("@TYPE@", "session").replace("@SOCKET@", str(self.socket))
        (self.root / "bus.conf").write_text(config)
        self._bus_log = open(self.root / "dbus-daemon.log", "wb")
        self.bus_process = subprocess.Popen(
            ["dbus-daemon", f"--config-file={self.root}/bus.conf", "--nofork", "--nopidfile", "--print-address=1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._bus_log, preexec_fn=_die_with_parent)
        _STARTED.append(self.bus_process)
        line = self.bus_process.stdout.readline().decode()
        if not line.startswith(self.address):
            raise RuntimeError(f"the agent's dbus-daemon did not start: {line!r}")
        os.chmod(self.socket, 0o777)
        for path in [self.root / n for n in ("home", "config", "runtime", "bin")] + [self.pids_file]:
            os.chown(path, self.uid, self.gid)
        os.chmod(self.root / "runtime", 0o700)
        self.env = {
            "HOME": str(self.root / "home"),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_RUNTIME_DIR": str(self.root / "runtime"),
            "XDG_STATE_HOME": str(self.root / "home" / ".local" / "state"),
            "DBUS_SESSION_BUS_ADDRESS": self.address,
            "DBUS_SYSTEM_BUS_ADDRESS": system_address,
            "DISPLAY": ":99",
            "PATH": f"{self.root / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "NO_AT_BRIDGE": "1",
        }
        self.agents = []

    def as_user(self):
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]

    def agent(self, extra_args=()):
        agent = Agent(self, extra_args)
        self.agents.append(agent)
        return agent

    def orca_pids(self):
        return [int(p) for p in self.pids_file.read_text().split()]

    def running_orcas(self):
        """The stand-in Orcas started here that still run (not zombies)."""
        alive = []
        for pid in self.orca_pids():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if state != "Z":
                alive.append(pid)
        return alive

    def stop(self):
        for agent in self.agents:
            agent.stop()
        for pid in self.orca_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _stop(self.bus_process)
        self.bus_process.stdout.close()
        self._bus_log.close()
        shutil.rmtree(self.root, ignore_errors=True)


class Agent:
    """guidedaccessd --agent as the session's user."""

    def __init__(self, session, extra_args=()):
        self.session = session
        self.argv = [*session.as_user(), str(readable(DAEMON_BINARY)), "--agent", "--config", str(session.config),
                     *extra_args]
        self.log_path = session.root / f"agent-{len(session.agents)}.log"
        self._log = open(self.log_path, "ab")
        self.process = None

    def start(self):
        self._log.write(f"\n===== {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                        env=self.session.env, preexec_fn=_die_with_parent)
        _STARTED.append(self.process)
        return self

    def wait_for_log(self, text, timeout=10.0, since=0):
        """Waits for TEXT in the log after its first SINCE characters."""
        deadline = time.monotonic() + timeout
        while text not in self.log()[since:]:
            if self.process.poll() is not None:
                raise AssertionError(f"the agent exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the agent's log has no {text!r} after {timeout} s:\n{self.log()[-3000:]}")
            time.sleep(0.01)

    def wait_exit(self, timeout=10.0):
        return self.process.wait(timeout=timeout)

    @property
    def pid(self):
        return self.process.pid

    def kill9(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=5)

    def log(self):
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.process is not None:
            _stop(self.process)
        self._log.close()


class FakeAgent:
    """fake_agent.py as user UID: registers, then answers Apply as told."""

    def __init__(self, system_address, user="daemon", apply_delay=0.0, exit_in_apply=False, name="fake-agent"):
        self.root = Path(tempfile.mkdtemp(prefix="/tmp/ga-fa-"))
        os.chmod(self.root, 0o777)
        entry = pwd.getpwnam(user)
        self.calls_path = self.root / "calls"
        argv = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--",
                "/usr/bin/python3", str(readable(HERE / "fake_agent.py")), str(self.calls_path), str(apply_delay),
                "exit" if exit_in_apply else "answer"]
        self._log = open(self.root / "log", "wb")
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log,
                                        env={"DBUS_SYSTEM_BUS_ADDRESS": system_address, "PATH": "/usr/bin:/bin"},
                                        preexec_fn=_die_with_parent)
        _STARTED.append(self.process)
        self.registration = self.process.stdout.readline().decode().strip()

    def calls(self):
        return self.calls_path.read_text().splitlines() if self.calls_path.exists() else []

    def log(self):
        self._log.flush()
        return (self.root / "log").read_text(errors="replace")

    def stop(self):
        _stop(self.process)
        self.process.stdout.close()
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)
