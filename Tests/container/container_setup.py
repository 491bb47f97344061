"""What the fixtures and the steps share: the kiosk user, the service's
configuration, installing the package, and the facts printed at the end of
the run."""

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
    missing = ct.run(["ldd", "/usr/libexec/guidedaccessd"]).stdout
    assert "not found" not in missing, f"libraries missing in the container:\n{missing}"
    return deb
