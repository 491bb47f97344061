"""A caller whose pid comes back as another process, for
test_ga_caller_identity.py (not collected by pytest).

Run as root as pid 1 of a new pid namespace (`unshare --fork --pid
--mount-proc`): its pid_max is the namespace's own (Linux ≥ 6.14), so pids
come back after about a hundred forks instead of the whole machine's 32768,
and the global pid_max is never touched. Inside, a private bus and
guidedaccessd --system with `[Clients] AllowExecutables=` a copy of sleep.

The attacker (nobody) connects from a process P, hands the connection to a
child and lets P exit. The pid P is then forked until it comes back, and the
allowed program is exec'd there: as nobody ("same-user"), or, with the copy
root's alone (0700), as root ("other-user": another user's program that
happened to get the pid). Then the attacker's child calls StartSession.

Prints one JSON line: {"reused": the allowed program runs at P, "outcome":
"admitted" or "denied: MESSAGE", "daemon_log": guidedaccessd's log}.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import gadaemon

PID_MAX = 400  # the kernel's minimum is 301; pids above 300 are reused first

ATTACKER = """
import ctypes, os, sys
import dbus, dbus.bus

ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the orphaned child stays ours
connecting = os.fork()
if connecting == 0:
    bus = dbus.bus.BusConnection(sys.argv[1])
    if os.fork() == 0:
        sys.stdin.readline()  # "go": the pid is someone else's now
        try:
            bus.call_blocking("org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                              "org.guidedaccess.GuidedAccess1", "StartSession", "a{sv}", ({},), timeout=10)
            print("admitted", flush=True)
        except dbus.DBusException as error:
            print("denied:", error.get_dbus_message(), flush=True)
        os._exit(0)
    os._exit(0)  # the connection outlives the process that made it
os.waitpid(connecting, 0)
print("freed", connecting, flush=True)
os.wait()
"""


def fork_until(pid, run_there):
    """Forks until a child gets `pid`, which then runs `run_there`; the
    others exit at once. Returns whether the pid came back."""
    for _ in range(20 * PID_MAX):
        child = os.fork()
        if child == 0:
            if os.getpid() == pid:
                run_there()
            os._exit(0)
        if child == pid:
            return True
        os.waitpid(child, 0)
    return False


def own_pid_max():
    """Whether a pid namespace has a pid_max of its own (Linux ≥ 6.14);
    before, writing it would change the whole machine's."""
    release = os.uname().release.split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (6, 14)


def main(scenario):
    assert os.getpid() == 1, "run me as pid 1 of a new pid namespace; the global pid_max must not change"
    assert own_pid_max(), "this kernel's pid_max is the whole machine's"
    with open("/proc/sys/kernel/pid_max", "w") as f:
        f.write(str(PID_MAX))
    env = gadaemon.GAEnv()
    try:
        (env.root / "bin").mkdir(mode=0o755)
        allowed = env.root / "bin" / "kiosk-app"
        shutil.copy("/bin/sleep", allowed)
        os.chmod(allowed, 0o755 if scenario == "same-user" else 0o700)
        config = env.write_config(f"[Service]\nBackend=memory\n[Clients]\nAllowExecutables={allowed}\n")
        daemon = env.start_daemon(config=config, args=("--system",))
        if fork_until(300, lambda: None):  # from here on pids cycle through 300…399
            os.waitpid(300, 0)
        script = env.root / "attacker.py"
        script.write_text(ATTACKER)
        attacker = subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", str(script),
             env.address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env.env)
        words = attacker.stdout.readline().split()
        assert words[0] == "freed", words
        pid = int(words[1])
        time.sleep(0.2)  # the recycling takes longer than /proc's start-time resolution (1/100 s)

        def run_allowed():
            if scenario == "same-user":
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
            os.execv(allowed, [str(allowed), "60"])

        reused = fork_until(pid, run_allowed)
        deadline = time.monotonic() + 5
        while reused and os.readlink(f"/proc/{pid}/exe") != str(allowed):
            assert time.monotonic() < deadline, "the allowed program did not start"
            time.sleep(0.01)
        attacker.stdin.write("go\n")
        attacker.stdin.flush()
        outcome = attacker.stdout.readline().strip()
        attacker.wait(timeout=10)
        if reused:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        print(json.dumps({"reused": reused, "outcome": outcome, "daemon_log": daemon.log()}))
    finally:
        env.stop()


if __name__ == "__main__":
    main(sys.argv[1])
