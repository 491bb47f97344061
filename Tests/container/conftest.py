"""Fixtures of the container system test (see README.md here).

`stage`: the Debian package, built once per run with `dpkg-buildpackage -b`
(debian/rules: the Makefile's release build, Swift standard library linked
statically, and `make install`), checked with lintian (errors and warnings
fail). `rootfs`: the cached Debian 12 root filesystem. `container`: it booted
with systemd as PID 1, cleaned up afterwards whatever happens. `installed`:
the package installed inside with apt, system mode configured
(Backend=dconf), the kiosk user `tester` with a session bus and values of its
own. `fleet_container`: a container of its own, installed the same way
(test_fleet.py). `bare_kiosk`: the kiosk before the package
(test_package.py). `speech_rootfs`: the root filesystem with Orca,
speech-dispatcher and Xvfb as well (user_session.py); `speech_container`:
it booted, the package installed, the kiosk user's own manager, an X
display and speech-dispatcher's log ready (user mode, the screen reader).
`agent_rootfs`: that plus sway, Xwayland and PipeWire; `agent_kiosk`: it
booted (persistent across `reboot()`), system mode with the session agent
enabled for every user (test_agent_speech.py). `x11_rootfs`: that plus
picom, matchbox, ImageMagick, xsettingsd and wvkbd (every Recommends of the
package is then there); `x11_kiosk`: it booted, the package installed with the README's
own line (`apt-get install ../guidedaccess_….deb`, no network), the same system
mode with an X11 session (Xvfb, matchbox, a GTK window) instead of sway
(test_x11_agent.py).
`browser_rootfs`: the base plus Chromium (user_session.py);
`browser_container`: it booted, the package installed, the kiosk user's
manager (user mode, test_browser_units.py); `browser_kiosk`: a second one,
system mode with the session agent and the kiosk user admitted as a client.

The test is skipped, with the reason, only where the machine cannot run it:
not root, a tool or cgroup2 missing, no reachable Debian mirror to build the
root filesystem from.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import nspawn  # noqa: E402
import user_session  # noqa: E402
from container_setup import (CONFIG, FACTS, KIOSK_UID, KIOSK_USER, install_as_the_readme_says, install_package,  # noqa: E402
                             readme_install_commands)

REPO_ROOT = HERE.parent.parent
# What a failure's report shows (conftest `booted`): the system service and
# the kiosk user's units, or the kiosk user's manager and units alone.
SYSTEM_SERVICE_JOURNAL = (f"guidedaccessd and uid {KIOSK_UID}",
                          ["_SYSTEMD_UNIT=guidedaccessd.service", "+", f"_UID={KIOSK_UID}"])
KIOSK_USER_JOURNAL = (f"uid {KIOSK_UID}: its manager and units", [f"_UID={KIOSK_UID}"])
_CONTAINER = []


def pytest_configure(config):
    # SIGTERM (a CI timeout, kill) ends the run like Ctrl-C: the fixtures'
    # finalizers still power the container off and clean up.
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def pytest_terminal_summary(terminalreporter):
    if FACTS:
        terminalreporter.write_sep("-", "container test")
        for name, value in FACTS.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _CONTAINER:
        ct = _CONTAINER[0]
        # A container may name its own matches: (title, journalctl arguments).
        title, matches = getattr(ct, "failure_journal", (
            "guidedaccessd, dbus, polkit", ["-u", "guidedaccessd", "-u", "dbus", "-u", "polkit"]))
        try:
            journal = ct.run(["journalctl", "--no-pager", "-n", "40", *matches], check=False, timeout=20).stdout
        except Exception as error:  # noqa: BLE001 (a report must not fail)
            journal = f"(cannot read the journal: {error})"
        report.sections.append((f"journal in the container ({title})", journal))


def unavailable_reason():
    if os.geteuid() != 0:
        return "it needs root (debootstrap, systemd-nspawn, cgroups)"
    for tool in ("debootstrap", "systemd-nspawn", "nsenter", "dpkg-buildpackage", "dh", "lintian"):
        if not shutil.which(tool):
            return (f"{tool} is missing (scripts/install-deps installs debootstrap, systemd-container, "
                    "dpkg-dev, debhelper and lintian)")
    if not nspawn.cgroup2_mount():
        return "no cgroup2 hierarchy is mounted"
    return None


@pytest.fixture(scope="session")
def workdir():
    path = Path(tempfile.mkdtemp(prefix="guidedaccess-ct."))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def rootfs():
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"container test not run: {reason}")
    nspawn.remove_stale()
    try:
        root, seconds = nspawn.ensure_rootfs(log=lambda line: print(line, file=sys.stderr))
    except nspawn.Unavailable as error:
        pytest.skip(f"container test not run: {error}")
    FACTS["root filesystem"] = f"built in {seconds:.0f} s" if seconds else f"cached ({root})"
    return root


def _layer(ensure, base, fact):
    """A cached root filesystem layer on BASE (user_session's ENSURE), its
    build time or cache the fact FACT; the test skipped, with the reason,
    where it cannot be built."""
    try:
        root, seconds = ensure(base, log=lambda line: print(line, file=sys.stderr))
    except nspawn.Unavailable as error:
        pytest.skip(f"container test not run: {error}")
    FACTS[fact] = f"built in {seconds:.0f} s" if seconds else f"cached ({root})"
    return root


@pytest.fixture(scope="session")
def speech_rootfs(rootfs):
    """The base plus Orca, speech-dispatcher and Xvfb (user_session.py), a
    separate cache: only the tests that ask for it pay for it."""
    return _layer(user_session.ensure_speech_rootfs, rootfs, "speech root filesystem")


@pytest.fixture(scope="session")
def agent_rootfs(speech_rootfs):
    """The speech root filesystem plus sway with Xwayland and PipeWire with
    its pulse server (user_session.py), cached separately again: only
    test_agent_speech.py pays for it."""
    return _layer(user_session.ensure_agent_rootfs, speech_rootfs, "agent root filesystem")


@pytest.fixture(scope="session")
def x11_rootfs(agent_rootfs):
    """The agent root filesystem plus picom, matchbox, ImageMagick, xsettingsd and wvkbd
    (user_session.py), cached separately: only test_x11_agent.py pays for it."""
    return _layer(user_session.ensure_x11_rootfs, agent_rootfs, "X11 root filesystem")


@pytest.fixture(scope="session")
def browser_rootfs(rootfs):
    """The base plus Chromium and iproute2 (user_session.py), cached
    separately: only test_browser_units.py pays for it."""
    return _layer(user_session.ensure_browser_rootfs, rootfs, "browser root filesystem")


@pytest.fixture(scope="session")
def stage(rootfs, workdir):
    """The package, built as the README's `## Install` tells an administrator
    to: its command lines before the install, run as written, in order, as
    root in the repository (`apt-get build-dep .`, `dpkg-buildpackage -us
    -uc -b`; the release build in .build is reused, debian/rules cleans
    nothing there). dpkg-buildpackage writes the package and its
    .buildinfo/.changes beside the repository, as the README says; they are
    moved into a directory of the work directory (bound read-only at
    /stage). Files of those names already there stop the run (they are not
    the test's to overwrite), and so does a README whose package is not the
    version debian/changelog builds.
    `x11_kiosk` runs the README's install line on the kiosk. lintian's
    errors and warnings fail the run (a justified one belongs in debian/'s
    lintian-overrides); its other tags are printed with the facts."""
    *build, install = readme_install_commands()
    match = re.fullmatch(r"apt-get install \.\./(guidedaccess_[^/ ]+_amd64)\.deb", install)
    assert match, f"the README's last install line is not `apt-get install ../guidedaccess_VERSION_amd64.deb`: {install!r}"
    out = workdir / "stage"
    out.mkdir()
    # The directory the README's install line runs in (a clone of the
    # repository there, here an empty one beside the package).
    (out / REPO_ROOT.name).mkdir()
    # The README names the version debian/changelog builds.
    version = subprocess.run(["dpkg-parsechangelog", "-SVersion"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
    assert match[1] == f"guidedaccess_{version}_amd64", \
        f"the README installs {match[1]}.deb, debian/changelog builds guidedaccess_{version}_amd64.deb"
    # What the build writes beside the repository: the .changes and the
    # files it lists (the package, its -dbgsym, the .buildinfo). Files of
    # those names already there are not ours to overwrite or move.
    ours = f"guidedaccess*_{version}_*"
    there = sorted(str(path) for path in REPO_ROOT.parent.glob(ours))
    if there:
        pytest.fail(f"the README's build would overwrite {', '.join(there)}: move them away and run again")
    try:
        for command in build:
            started = time.monotonic()
            result = subprocess.run(command, shell=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                    capture_output=True, text=True, timeout=3600)
            if result.returncode != 0:
                pytest.fail(f"the README's `{command}` failed ({result.returncode}):\n"
                            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
            summary = re.findall(r"^\d+ upgraded, .*$", result.stdout, re.M)
            FACTS[f"README: {command}"] = f"{time.monotonic() - started:.1f} s" + \
                (f" ({summary[-1]})" if summary else "")
        changes = REPO_ROOT.parent / f"{match[1]}.changes"
        assert changes.is_file(), f"the README's build did not write {changes}"
        files = changes.read_text().split("\nFiles:\n", 1)[1].split("\n\n", 1)[0]
        listed = [line.split()[-1] for line in files.splitlines() if line.startswith(" ")]
        assert f"{match[1]}.deb" in listed, f"{changes} lists no {match[1]}.deb: {listed}"
        for name in [*listed, changes.name]:
            shutil.move(REPO_ROOT.parent / name, out / name)
    finally:
        # A failed build's leftovers (all written by it: nothing was there before).
        for path in REPO_ROOT.parent.glob(ours):
            if path.is_file():
                path.unlink()
    [deb] = out.glob("guidedaccess_*_amd64.deb")
    FACTS["package"] = f"{deb.name}, {deb.stat().st_size / 1e6:.1f} MB"
    root = workdir / "package-contents"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    binary = root / "usr/libexec/guidedaccessd"
    assert binary.is_file(), f"the package has no {binary.relative_to(root)}"
    linked = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    assert "libswiftCore" not in linked, f"{binary} links the Swift runtime dynamically:\n{linked}"
    started = time.monotonic()
    lint = subprocess.run(["lintian", "--fail-on", "error,warning", str(out / f"{match[1]}.changes")],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    tags = [line for line in lint.stdout.splitlines() if re.match(r"[EWIPXO]: ", line)]
    FACTS["lintian"] = f"{time.monotonic() - started:.1f} s; " + ("; ".join(tags) or "no tags")
    if lint.returncode != 0 or any(tag.startswith(("E: ", "W: ")) for tag in tags):
        pytest.fail(f"lintian ({lint.returncode}):\n{lint.stdout}\n{lint.stderr}")
    return out


@pytest.fixture(scope="session")
def container(rootfs, stage, workdir):
    ct = nspawn.Container(rootfs, stage, workdir)
    try:
        seconds = ct.boot()
        FACTS["boot"] = f"{seconds:.1f} s to {ct.boot_state}"
        _CONTAINER.append(ct)
        yield ct
    finally:
        _CONTAINER.clear()
        started = time.monotonic()
        errors = ct.shutdown()
        FACTS["power off and clean-up"] = f"{time.monotonic() - started:.1f} s"
        leftovers = [p for p in (ct.cgroup, str(nspawn.PROPAGATE_DIR / ct.name)) if os.path.exists(p)]
        if errors or leftovers:
            pytest.fail(f"container clean-up: {errors} left: {leftovers}")


@pytest.fixture(scope="session")
def installed(container):
    """The package installed with apt, system mode configured, the kiosk
    user set up with values of its own."""
    return install(container)


def install(ct):
    """What `installed` does, for any booted container."""
    install_package(ct)
    ct.run(["useradd", "--create-home", "--uid", str(KIOSK_UID), KIOSK_USER])
    ct.run(["guidedaccess-dconf-profile"])
    ct.run(["guidedaccess-dconf-profile", "--check"])
    ct.sh("mkdir -p /etc/guidedaccess && cat > /etc/guidedaccess/guidedaccess.conf", input=CONFIG)
    ct.run(["systemctl", "daemon-reload"])
    ct.run(["busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "ReloadConfig"])
    # The kiosk user's own session manager and session bus: gsettings writes
    # go through dconf-service there (reads are direct file reads).
    ct.run(["systemctl", "start", f"user@{KIOSK_UID}.service"])
    return ct


@pytest.fixture(scope="module")
def rebootable(rootfs, stage, workdir):
    """A second container, installed as `installed` is, whose changes
    survive `reboot()` (an overlay upper directory in the work directory)."""
    ct = nspawn.Container(rootfs, stage, workdir / "reboot", persistent=True, suffix="-reboot")
    try:
        seconds = ct.boot()
        FACTS["reboot container: first boot"] = f"{seconds:.1f} s"
        _CONTAINER.insert(0, ct)  # the one a failure's report reads the journal of
        yield install(ct)
    finally:
        shut_down(ct, "reboot container")


@pytest.fixture(scope="module")
def bare_kiosk(rootfs, stage, workdir):
    """A fourth container, the kiosk before the package: the kiosk user with
    its own manager and session bus, nothing of guidedaccess installed
    (test_package.py installs, removes and purges it there)."""
    with booted(rootfs, stage, workdir, "package", "package container") as ct:
        ct.run(["useradd", "--create-home", "--uid", str(KIOSK_UID), KIOSK_USER])
        ct.run(["systemctl", "start", f"user@{KIOSK_UID}.service"])
        yield ct


@pytest.fixture(scope="module")
def fleet_container(rootfs, stage, workdir):
    """A kiosk of its own for test_fleet.py, installed as `installed` is:
    its journal goes to a collector through systemd-journal-upload."""
    journal = ("guidedaccessd, journal-upload, journal-remote",
               ["-u", "guidedaccessd", "-u", "systemd-journal-upload", "-u", "systemd-journal-remote"])
    with booted(rootfs, stage, workdir, "fleet", "fleet container", journal=journal) as ct:
        yield install(ct)


@pytest.fixture(scope="module")
def speech_container(speech_rootfs, stage, workdir):
    """A third container, from the speech root filesystem: the package
    installed (no system-mode configuration), the
    kiosk user's manager through linger, Xvfb on :5 and speech-dispatcher
    logging what it says (user_session.prepare)."""
    # What fails here is in the kiosk user's journal: its manager, the
    # service, the screen reader's units.
    with booted(speech_rootfs, stage, workdir, "speech", "speech container", journal=KIOSK_USER_JOURNAL) as ct:
        install_package(ct)
        for step, seconds in user_session.prepare(ct).items():
            FACTS[f"speech container: {step}"] = f"{seconds:.2f} s"
        yield ct


@pytest.fixture(scope="module")
def agent_kiosk(agent_rootfs, stage, workdir):
    """A locked kiosk that speaks (test_agent_speech.py): the agent root
    filesystem booted with changes that survive `reboot()`, the package
    installed, system mode with the session agent and sway enabled for
    every user (user_session.prepare_agent_kiosk); the kiosk user has not
    logged in yet."""
    ct = nspawn.Container(agent_rootfs, stage, workdir / "agent", persistent=True, suffix="-agent")
    # The service's journal and the kiosk user's (its manager, the agent, Orca).
    ct.failure_journal = SYSTEM_SERVICE_JOURNAL
    try:
        FACTS["agent container: boot"] = f"{ct.boot():.1f} s"
        _CONTAINER.insert(0, ct)
        install_package(ct)
        for step, seconds in user_session.prepare_agent_kiosk(ct).items():
            FACTS[f"agent container: {step}"] = f"{seconds:.2f} s"
        yield ct
    finally:
        shut_down(ct, "agent container")


@pytest.fixture(scope="module")
def x11_kiosk(x11_rootfs, stage, workdir):
    """An X11 kiosk in system mode with the session agent
    (test_x11_agent.py): the X11 root filesystem booted, the package
    installed, the agent and the kiosk's X session (Xvfb, matchbox, the GTK
    window of Tests/desktop/gtk_button.py) enabled for every user, root's
    own X server running (user_session.prepare_x11_kiosk); the kiosk user
    has not logged in yet."""
    with booted(x11_rootfs, stage, workdir, "x11", "X11 container", journal=SYSTEM_SERVICE_JOURNAL) as ct:
        ct.readme_install = install_as_the_readme_says(ct, f"/stage/{REPO_ROOT.name}")
        gtk_button = (REPO_ROOT / "Tests/desktop/gtk_button.py").read_text()
        for step, seconds in user_session.prepare_x11_kiosk(ct, gtk_button).items():
            FACTS[f"X11 container: {step}"] = f"{seconds:.2f} s"
        yield ct


@pytest.fixture(scope="module")
def browser_container(browser_rootfs, stage, workdir):
    """User mode with the kiosk browser (test_browser_units.py): the browser
    root filesystem booted, the package installed (the user unit as it
    ships), the kiosk user's manager and session bus through linger."""
    # The kiosk user's journal: its manager, the service, the browser's unit.
    with booted(browser_rootfs, stage, workdir, "browser", "browser container", journal=KIOSK_USER_JOURNAL) as ct:
        install_package(ct)
        user_session.add_user(ct)
        FACTS["browser container: linger → user manager on its bus"] = f"{user_session.enable_linger(ct):.2f} s"
        yield ct


@pytest.fixture(scope="module")
def browser_kiosk(browser_rootfs, stage, workdir):
    """System mode with the kiosk browser (test_browser_units.py): the
    browser root filesystem booted, the package installed, BROWSER_KIOSK_CONFIG
    (dconf, the agent and the launcher admitted for the kiosk user),
    guidedaccessd.service enabled and started, the session agent enabled for
    every user and started by the kiosk user's login (linger)."""
    with booted(browser_rootfs, stage, workdir, "browser-kiosk", "browser kiosk", journal=SYSTEM_SERVICE_JOURNAL) as ct:
        install_package(ct)
        started = time.monotonic()
        user_session.add_user(ct)
        ct.run(["guidedaccess-dconf-profile"])
        ct.sh("mkdir -p /etc/guidedaccess && cat > /etc/guidedaccess/guidedaccess.conf",
              input=user_session.BROWSER_KIOSK_CONFIG)
        ct.run(["systemctl", "daemon-reload"])
        ct.run(["systemctl", "enable", "--now", "guidedaccessd.service"])
        ct.run(["systemctl", "--global", "enable", user_session.AGENT_UNIT])
        user_session.enable_linger(ct)
        FACTS["browser kiosk: system mode, agent enabled, login"] = f"{time.monotonic() - started:.2f} s"
        yield ct


@contextlib.contextmanager
def booted(rootfs, stage, workdir, name, label, journal=None):
    """A container of its own from ROOTFS (in workdir/NAME, unit suffix
    -NAME), booted (the boot's time a fact, `LABEL: boot`), the one a
    failure's report reads the journal of (JOURNAL: (title, journalctl
    arguments), else conftest's default); powered off and checked clean
    afterwards whatever happens."""
    directory = workdir / name
    directory.mkdir()
    ct = nspawn.Container(rootfs, stage, directory, suffix=f"-{name}")
    if journal is not None:
        ct.failure_journal = journal
    try:
        FACTS[f"{label}: boot"] = f"{ct.boot():.1f} s"
        _CONTAINER.insert(0, ct)
        yield ct
    finally:
        shut_down(ct, label)


def shut_down(ct, what):
    """Powers a container off; fails the test when anything of it is left
    (cgroups, nspawn's propagate directory, mounts)."""
    if ct in _CONTAINER:
        _CONTAINER.remove(ct)
    errors = ct.shutdown()
    leftovers = [p for p in (ct.cgroup, str(nspawn.PROPAGATE_DIR / ct.name)) if os.path.exists(p)]
    leftovers += nspawn.mounts_under(ct.root)
    if errors or leftovers:
        pytest.fail(f"{what} clean-up: {errors} left: {leftovers}")
