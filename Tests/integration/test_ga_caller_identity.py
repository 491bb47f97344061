"""Who a caller is (spec: Identity, Authorization), against callers that lie
about it: system mode's `[Clients] AllowUnits` with processes of other users
(`setpriv`) in cgroups they created.

The daemon runs in system mode (memory backend) with no polkit on the bus:
a caller the lists do not admit is told "polkit is not available".
"""

import os
from pathlib import Path

import pytest

from conftest import start_guidedaccessd
from gadaemon import IFACE, NAME, PATH

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def start_system_daemon(env, clients):
    config = env.write_config(f"[Service]\nBackend=memory\n[Clients]\n{clients}\n")
    return start_guidedaccessd(env, config=config, args=("--system",))


def session_active(env):
    code, out, err = env.busctl("get-property", NAME, PATH, IFACE, "SessionActive")
    assert code == 0, err
    return out.strip() == "b true"


def busctl_argv(env, member, *args, program="busctl"):
    return [program, f"--address={env.address}", "call", NAME, PATH, IFACE, member, *args]


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
