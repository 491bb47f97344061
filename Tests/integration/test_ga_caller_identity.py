"""Who a caller is (spec: Identity, Authorization), against callers that lie
about it: system mode's `[Clients] AllowExecutables` and `AllowUnits`, and
take-over, with processes of other users (`setpriv`), mount namespaces of
their own (`unshare -Urm`), cgroups they created, and pids they recycled
(`pid_reuse.py`, in a pid namespace of its own).

The daemon runs in system mode (memory backend) with no polkit on the bus:
a caller the lists do not admit is told "polkit is not available".
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import start_guidedaccessd
from gadaemon import IFACE, NAME, PATH

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
HERE = Path(__file__).resolve().parent


def start_system_daemon(env, clients):
    config = env.write_config(f"[Service]\nBackend=memory\n[Clients]\n{clients}\n")
    return start_guidedaccessd(env, config=config, args=("--system",))


def session_active(env):
    code, out, err = env.busctl("get-property", NAME, PATH, IFACE, "SessionActive")
    assert code == 0, err
    return out.strip() == "b true"


def busctl_argv(env, member, *args, program="busctl"):
    return [program, f"--address={env.address}", "call", NAME, PATH, IFACE, member, *args]


def installed_copy(env, source, name, mode):
    """A copy of `source` at ROOT/bin/NAME with `mode`, owned by root."""
    directory = env.root / "bin"
    directory.mkdir(mode=0o755, exist_ok=True)
    target = directory / name
    shutil.copy(source, target)
    os.chmod(target, mode)
    return target


# ---------------------------------------------------------------- executables and mount namespaces


def test_an_allowed_executable_is_admitted(ga_env):
    start_system_daemon(ga_env, "AllowExecutables=/usr/bin/busctl")
    code, _, err = ga_env.run(busctl_argv(ga_env, "StartSession", "a{sv}", "0"), prefix=NOBODY)
    assert code == 0, err
    assert session_active(ga_env)


def test_another_program_bind_mounted_over_an_allowed_path_in_a_mount_namespace_is_not_admitted(ga_env):
    # The allowed program is root's alone (0700); nobody mounts busctl over
    # its path in a namespace of its own and runs it from there.
    allowed = installed_copy(ga_env, "/bin/sleep", "kiosk-app", 0o700)
    start_system_daemon(ga_env, f"AllowExecutables={allowed}")
    call = " ".join(busctl_argv(ga_env, "StartSession", "a{sv}", "0", program=str(allowed)))
    code, _, err = ga_env.run(["unshare", "-Urm", "sh", "-c", f"mount --bind /usr/bin/busctl {allowed} && exec {call}"],
                              prefix=NOBODY)
    assert code != 0, "admitted as the program at the allowed path"
    assert "polkit is not available" in err, err
    assert not session_active(ga_env)


def test_take_over_is_refused_to_another_program_mounted_over_the_owners_path(ga_env):
    start_system_daemon(ga_env, "AllowUsers=nobody")
    owner = installed_copy(ga_env, "/usr/bin/busctl", "kiosk-ctl", 0o755)
    code, _, err = ga_env.run(busctl_argv(ga_env, "StartSession", "a{sv}", "0", program=str(owner)), prefix=NOBODY)
    assert code == 0, err  # its process has gone: the owner is gone
    end = busctl_argv(ga_env, "EndSession", program=str(owner))
    code, _, err = ga_env.run(["unshare", "-Urm", "sh", "-c",
                               f"mount --bind /usr/bin/busctl {owner} && exec {' '.join(end)}"], prefix=NOBODY)
    assert code != 0, "took over as the owner's program"
    assert session_active(ga_env)
    code, _, err = ga_env.run(end, prefix=NOBODY)  # the owner's program itself takes over
    assert code == 0, err
    assert not session_active(ga_env)


# ---------------------------------------------------------------- fork and exec (spec: Identity)

FORK_EXEC = """
import os, sys, time
import dbus, dbus.bus

address, program = sys.argv[1:3]
bus = dbus.bus.BusConnection(address)
child = os.fork()
if child:
    os.execv(program, [program, "30"])
deadline = time.monotonic() + 5  # until the parent has exec'd the allowed program
while time.monotonic() < deadline:
    try:
        if os.readlink(f"/proc/{os.getppid()}/exe") == program:
            break
    except OSError:
        pass
    time.sleep(0.01)
try:
    bus.call_blocking("org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                      "org.guidedaccess.GuidedAccess1", "StartSession", "a{sv}", ({},), timeout=10)
    print("admitted", flush=True)
except dbus.DBusException as error:
    print("denied", error.get_dbus_message(), flush=True)
os.kill(os.getppid(), 9)
"""


def test_a_caller_whose_connecting_process_execs_an_allowed_program_is_admitted_as_the_spec_says(ga_env):
    # Executable identity is the connecting process's program now: a
    # process that connects, forks, and execs the allowed program keeps a
    # connection in its child that counts as that program (docs/internals.md, "Who a caller is":
    # AllowExecutables alone is no security boundary).
    allowed = installed_copy(ga_env, "/bin/sleep", "kiosk-app", 0o755)
    start_system_daemon(ga_env, f"AllowExecutables={allowed}")
    script = ga_env.root / "fork_exec.py"
    script.write_text(FORK_EXEC)
    code, out, err = ga_env.run(["/usr/bin/python3", str(script), ga_env.address, str(allowed)], prefix=NOBODY)
    assert out.strip() == "admitted", (out, err)


# ---------------------------------------------------------------- pid reuse


def pid_reuse(scenario):
    """Runs pid_reuse.py in a new pid namespace (where pid_max is its own)."""
    import pid_reuse

    if not pid_reuse.own_pid_max():
        pytest.skip("a pid namespace has a pid_max of its own from Linux 6.14 on")
    completed = subprocess.run(
        ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, str(HERE / "pid_reuse.py"), scenario],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(HERE)})
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return json.loads(completed.stdout.splitlines()[-1])


def test_a_recycled_pid_running_the_allowed_program_as_the_same_user_is_not_the_caller():
    result = pid_reuse("same-user")
    assert result["reused"], result
    assert result["outcome"].startswith("denied"), result
    assert "started after its connection" in result["daemon_log"], result["daemon_log"]


def test_a_recycled_pid_running_another_users_allowed_program_is_not_the_caller():
    result = pid_reuse("other-user")
    assert result["reused"], result
    assert result["outcome"].startswith("denied"), result
    assert "runs as uid 0, not as the connection's uid 65534" in result["daemon_log"], result["daemon_log"]


# ---------------------------------------------------------------- units and cgroups


def cgroup2_root():
    """Where the unified cgroup hierarchy is mounted, if this machine lets
    us make cgroups in it."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2" and os.access(fields[1], os.W_OK):
            return Path(fields[1])
    return None


@pytest.fixture
def cgroups(ga_env):
    """A slice of the test's own under the cgroup2 root; removed afterwards."""
    root = cgroup2_root()
    if root is None:
        pytest.skip("no writable cgroup2 hierarchy (the parsing has unit tests)")
    top = root / f"ga-it-{os.getpid()}-{ga_env.root.name}.slice"
    top.mkdir()
    yield top
    for directory in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if directory.is_dir():
            directory.rmdir()
    top.rmdir()


def in_cgroup(cgroup, argv):
    """Runs argv with the shell moved into `cgroup` first (by root)."""
    return ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]


def test_a_process_of_an_allowed_system_unit_is_admitted(ga_env, cgroups):
    unit = cgroups / "kiosk-app.service"
    unit.mkdir()
    start_system_daemon(ga_env, "AllowUnits=kiosk-app.service")
    code, _, err = ga_env.run(in_cgroup(unit, [*NOBODY, *busctl_argv(ga_env, "StartSession", "a{sv}", "0")]))
    assert code == 0, err
    assert session_active(ga_env)


def test_a_users_own_unit_of_an_allowed_name_is_not_that_system_unit(ga_env, cgroups):
    # systemd delegates user@65534.service's subtree to the user, who can
    # make cgroups of any name there and move its processes into them.
    manager = cgroups / "user-65534.slice" / "user@65534.service"
    manager.mkdir(parents=True)
    for path in [manager, *manager.iterdir()]:
        os.chown(path, 65534, 65534)
    start_system_daemon(ga_env, "AllowUnits=kiosk-app.service")
    mine = manager / "app.slice" / "kiosk-app.service"
    attack = f'mkdir -p {mine} && echo $$ > {mine}/cgroup.procs && exec "$@"'
    code, _, err = ga_env.run(in_cgroup(manager, [*NOBODY, "sh", "-c", attack, "sh",
                                                  *busctl_argv(ga_env, "StartSession", "a{sv}", "0")]))
    assert code != 0, "admitted as the system unit kiosk-app.service"
    assert "polkit is not available" in err, err
    assert not session_active(ga_env)
