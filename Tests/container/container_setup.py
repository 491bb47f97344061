"""What the fixtures and the steps share: the kiosk user, the service's
configuration, installing the package (as the tests do, and as the README
tells an administrator to), and the facts printed at the end of the run."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent.parent / "README.md"

KIOSK_USER = "tester"
KIOSK_UID = 1000

CONFIG = """\
# System mode, written out: the dconf backend with its defaults, except that
# outside a session the kiosk user's own values hold and stay writable
# (LockOutsideSession=true, the default, is tried on its own at the end).
[Service]
Backend=dconf
# The kiosk runs GNOME; this container has no graphical session to detect.
Desktop=gnome-shell

[Dconf]
DatabaseDir=/etc/dconf/db
DatabaseName=guidedaccess
LockOutsideSession=false
"""

# Timings, the exposure figure: shown by conftest's terminal summary.
FACTS = {}


def readme_install_commands():
    """The command lines of the README's `## Install` section (its sh
    block), comments stripped, in order: what the `stage` fixture (the
    build, on this machine) and `x11_kiosk` (the install, on the kiosk) run
    as written."""
    section = README.read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    return [command for command in commands if command]


def install_package(ct):
    """The package built by the `stage` fixture installed with apt from
    /stage, as an administrator installs it; the binary's libraries must all
    be there. The container has no network: every dependency must already be
    in the root filesystem (nspawn.PACKAGES), and Recommends are not
    installed (apt would try to download the ones it lacks, orca and
    speech-dispatcher among them)."""
    [deb] = ct.run(["sh", "-c", "ls /stage/guidedaccess_*_amd64.deb"]).stdout.split()
    ct.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-q", "-y", "--no-install-recommends",
            deb], timeout=120)
    _libraries_found(ct)
    return deb


def install_as_the_readme_says(ct, checkout):
    """The README's install line, as written (no -y: a question would be
    answered by end of input, and apt would abort), run in CHECKOUT, the
    directory beside the package in /stage (the `stage` fixture). The root
    filesystem must hold every Depends and Recommends: the container has no
    network. Returns apt's output."""
    install = readme_install_commands()[-1]
    result = ct.run(["sh", "-c", f"cd {checkout} && {install}"], timeout=120, check=False)
    assert result.returncode == 0, f"the README's `{install}` failed on the kiosk ({result.returncode}):\n" \
        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    _libraries_found(ct)
    return result.stdout


def _libraries_found(ct):
    missing = ct.run(["ldd", "/usr/libexec/guidedaccessd"]).stdout
    assert "not found" not in missing, f"libraries missing in the container:\n{missing}"
