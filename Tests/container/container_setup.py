"""What the fixtures and the steps share: the kiosk user, the service's
configuration, installing the staged files, and the facts printed at the
end of the run."""

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


def install_files(ct):
    """The staged `make install` tree copied into a booted container, as a
    package would put it; the binary's libraries must all be there."""
    ct.sh("tar -C /stage/root -cf - . | tar -C / -xf - --keep-directory-symlink --no-same-owner")
    missing = ct.run(["ldd", "/usr/libexec/guidedaccessd"]).stdout
    assert "not found" not in missing, f"libraries missing in the container:\n{missing}"
