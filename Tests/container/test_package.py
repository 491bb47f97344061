"""The package's life on a kiosk, in a container of its own (conftest
`bare_kiosk`: the kiosk user with values of its own, nothing of guidedaccess):
installed with apt from the local file (every dependency already there,
no download), set up for system mode, a session run with LockOutsideSession
at its default; removed with a session in progress; installed again, moved
to a database of another name by a drop-in; purged with a session in
progress that is only in the journal (the service stopped, its locks held). After the purge the kiosk is as
it was: the listing of /etc, /usr, /var/lib and /lib/systemd (apt's and
dpkg's own records left out) equals the one taken before the install, the
kiosk user may change the mapped keys again, and neither systemd, D-Bus nor
polkit knows anything of the service.

The steps run in order on the one container.
"""

import json
import re

from container_setup import CONFIG, FACTS, KIOSK_USER, install_package
from test_container import (BUS, DEFAULTS, MAG, MESSAGE_IDS, OWN, SESSION, UNIT, expect_view, gdbus, journal_json,
                            kiosk_view, prop, wait_for)

# The administrator's configuration: the tests' own, LockOutsideSession at
# its default (true), so the mapped keys are locked whenever the service runs.
LOCKING_CONFIG = CONFIG.replace("LockOutsideSession=false\n", "")
LISTED = "/etc /usr /var/lib /lib/systemd/"
# What apt and dpkg record of any package that came and went: their status,
# lists, logs (not listed: /var/log, /var/cache).
BOOKKEEPING = ["/var/lib/dpkg", "/var/lib/apt"]
DATABASE = "/etc/dconf/db/guidedaccess"
PROFILE = "/etc/dconf/profile/user"
OTHER_DATABASE = "/etc/dconf/db/kiosk"
OTHER_DROP_IN = "/etc/guidedaccess/guidedaccess.conf.d/50-database.conf"
RUN = {}


def listing(ct):
    """Every file under LISTED but BOOKKEEPING: path, type, mode, owner, and
    the size (/usr) or content hash (/etc, /var/lib) of regular files, the
    target of symbolic links. No times."""
    prune = " -o ".join(f"-path {path}" for path in BOOKKEEPING)
    script = f"""
find {LISTED} -xdev \\( {prune} \\) -prune -o \\( -type d -printf '%p dir %m %u:%g\\n' \\) \\
    -o \\( -type l -printf '%p -> %l\\n' \\) -o \\( -type f -printf '%p file %m %u:%g %s\\n' \\) \\
    -o -printf '%p %y %m %u:%g\\n'
find /etc /var/lib -xdev \\( {prune} \\) -prune -o -type f -exec sha256sum {{}} + | sed 's/^\\([0-9a-f]*\\)  \\(.*\\)/\\2 sha256 \\1/'
"""
    return set(ct.sh(script, timeout=120).stdout.splitlines())


def apt(ct, *args):
    return ct.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-y", *args], timeout=120)


def activatable(ct):
    out = ct.run(["busctl", "--json=short", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                  "org.freedesktop.DBus", "ListActivatableNames"]).stdout
    return BUS in json.loads(out)["data"][0]


def unit_files(ct):
    return ct.run(["systemctl", "list-unit-files", "--no-legend", "guidedaccess*"], check=False).stdout


def our_database_files(ct):
    """What the service wrote in /etc/dconf/db (keyfiles and locks, its own)."""
    return ct.run(["find", "/etc/dconf/db", "-path", f"{DATABASE}.d/*", "-type", "f"]).stdout.split()


def own_values_writable(ct):
    """The kiosk user's own values, writable; and it can change one for real."""
    expect_view(ct, OWN, writable=True)
    ct.run(["gsettings", "set", MAG, "mag-factor", "3.5"], user=KIOSK_USER)
    assert kiosk_view(ct)[(MAG, "mag-factor")] == ("3.5", "true")
    ct.run(["gsettings", "set", MAG, "mag-factor", "3.0"], user=KIOSK_USER)


def test_step1_install_with_apt_needs_nothing_from_the_network(bare_kiosk, stage):
    ct = bare_kiosk
    ct.run(["gsettings", "set", MAG, "mag-factor", "3.0"], user=KIOSK_USER)
    expect_view(ct, OWN, writable=True)
    RUN["before"] = listing(ct)
    assert not activatable(ct) and "guidedaccess" not in unit_files(ct)
    [deb] = ct.run(["sh", "-c", "ls /stage/guidedaccess_*_amd64.deb"]).stdout.split()
    # Depends are all in the root filesystem: apt would install this one package.
    plan = apt(ct, "install", "-s", "--no-install-recommends", deb).stdout
    assert re.findall(r"^Inst (\S+)", plan, re.M) == ["guidedaccess"], plan
    # What Recommends would add (downloads; the container has no network).
    plan = apt(ct, "install", "-s", deb).stdout
    extra = set(re.findall(r"^Inst (\S+)", plan, re.M)) - {"guidedaccess"}
    recommended = ct.run(["dpkg-deb", "-f", deb, "Recommends"]).stdout.replace(",", " ").split()
    FACTS["package container: with Recommends apt would download"] = \
        f"{len(extra)} packages: {' '.join(sorted(extra & set(recommended)))} and what they depend on"
    install_package(ct)
    # Installed, neither enabled nor started (debian/rules): D-Bus activation starts it.
    assert ct.run(["systemctl", "is-enabled", UNIT], check=False).stdout.strip() == "disabled"
    assert ct.run(["systemctl", "is-active", UNIT], check=False).stdout.strip() == "inactive"
    assert wait_for(lambda: activatable(ct), "the bus name to be activatable")


def test_step2_system_mode_a_session_and_the_locks_outside_it(bare_kiosk):
    ct = bare_kiosk
    ct.run(["guidedaccess-dconf-profile"])
    profile = ct.run(["cat", PROFILE]).stdout
    assert profile.splitlines()[-1] == "system-db:guidedaccess" and profile.startswith(
        "# guidedaccess-dconf-profile created this file and its directory"), profile
    ct.sh("mkdir -p /etc/guidedaccess && cat > /etc/guidedaccess/guidedaccess.conf", input=LOCKING_CONFIG)
    assert prop(ct, "SessionActive") is False  # activates the service
    expect_view(ct, DEFAULTS, writable=False)
    gdbus(ct, "StartSession", "{'features': <['zoom', 'invert-colors']>, 'zoom-factor': <4.0>}")
    gdbus(ct, "ConfigureForSession", "['high-contrast']", "true")
    expect_view(ct, SESSION, writable=False)
    gdbus(ct, "EndSession")
    expect_view(ct, DEFAULTS, writable=False)
    # A session in progress for the removal.
    gdbus(ct, "StartSession", "{'features': <['zoom']>, 'zoom-factor': <4.0>}")
    assert kiosk_view(ct)[(MAG, "mag-factor")] == ("4.0", "false")
    assert ct.run(["test", "-s", "/var/lib/guidedaccess/journal.json"]).returncode == 0


def test_step3_remove_ends_the_session_and_leaves_no_lock(bare_kiosk):
    ct = bare_kiosk
    pid = int(ct.run(["systemctl", "show", "-p", "MainPID", "--value", UNIT]).stdout)
    out = apt(ct, "remove", "guidedaccess").stdout
    assert "guidedaccess: ending the session in progress" in out, out
    assert ct.run(["systemctl", "is-active", UNIT], check=False).stdout.strip() != "active"
    # The service undid the session itself (its audit record), then stopped.
    ct.run(["journalctl", "--sync"])
    ended = journal_json(ct, f"_PID={pid}", f"MESSAGE_ID={MESSAGE_IDS['sessionEnded']}")
    assert len(ended) == 2, ended  # step 2's end and the one prerm asked for
    assert ended[-1]["GUIDEDACCESS_REASON"] in ("ended", "ended-by-operator")
    # No lock is left: the database is rebuilt empty (the profile still
    # names it; no warning), the state directory is gone.
    assert our_database_files(ct) == []
    assert ct.run(["test", "-f", DATABASE]).returncode == 0
    own_values_writable(ct)
    warned = ct.run(["gsettings", "get", MAG, "mag-factor"], user=KIOSK_USER)
    assert warned.stderr == "", warned.stderr
    assert ct.run(["test", "-e", "/var/lib/guidedaccess"], check=False).returncode != 0
    assert ct.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "guidedaccess"]).stdout.strip() == "rc"


def test_step4_installed_again_it_starts_without_the_removed_session(bare_kiosk):
    ct = bare_kiosk
    install_package(ct)
    assert prop(ct, "SessionActive") is False
    expect_view(ct, DEFAULTS, writable=False)
    assert our_database_files(ct), "LockOutsideSession wrote nothing"


def test_step4b_a_database_of_its_own_from_a_drop_in(bare_kiosk):
    """The administrator moves the service to a database named in a drop-in
    (and lets the profile read it): purge must find that one too."""
    ct = bare_kiosk
    ct.sh(f"mkdir -p /etc/guidedaccess/guidedaccess.conf.d && cat > {OTHER_DROP_IN}",
          input="[Dconf]\nDatabaseName=kiosk\n")
    ct.run(["guidedaccess-dconf-profile", "--name", "kiosk"])
    ct.run(["systemctl", "restart", UNIT])
    gdbus(ct, "StartSession", "{'features': <['zoom']>, 'zoom-factor': <4.0>}")
    assert kiosk_view(ct)[(MAG, "mag-factor")] == ("4.0", "false")
    assert ct.run(["test", "-f", f"{OTHER_DATABASE}.d/locks/guidedaccess"]).returncode == 0


def test_step5_purge_leaves_the_kiosk_as_it_was(bare_kiosk):
    ct = bare_kiosk
    # The session is only in the journal (as after a reboot mid-session: the
    # service is D-Bus activated, not running); the locks stay meanwhile.
    ct.run(["systemctl", "stop", UNIT])
    assert kiosk_view(ct)[(MAG, "mag-factor")] == ("4.0", "false")
    # The listing sees what the package, the service and the profile tool
    # put there.
    added = {line.split()[0] for line in listing(ct) - RUN["before"]}
    assert {"/usr/libexec/guidedaccessd", f"{DATABASE}.d/locks/guidedaccess-baseline", DATABASE, PROFILE,
            f"{OTHER_DATABASE}.d/locks/guidedaccess", OTHER_DATABASE, "/var/lib/guidedaccess"} <= added, sorted(added)
    out = apt(ct, "purge", "guidedaccess").stdout
    # prerm had the service resume the session and end it: its own record.
    assert "guidedaccess: ending the session in progress" in out, out
    ct.run(["journalctl", "--sync"])
    ended = journal_json(ct, f"_SYSTEMD_UNIT={UNIT}", f"MESSAGE_ID={MESSAGE_IDS['sessionEnded']}")
    assert ended[-1]["GUIDEDACCESS_REASON"] in ("ended", "ended-by-operator"), ended[-1]
    own_values_writable(ct)
    assert "guidedaccess" not in unit_files(ct)
    assert wait_for(lambda: not activatable(ct), "the bus name to be gone from the activatable names")
    assert wait_for(lambda: ct.run(["pkaction", "--action-id", "org.guidedaccess.GuidedAccess1.start-session"],
                                   check=False).returncode != 0, "polkit to forget the actions")
    assert ct.run(["dpkg-query", "-W", "guidedaccess"], check=False).returncode != 0
    # The administrator's own configuration is theirs to remove: the package
    # never installs anything in /etc/guidedaccess.
    ct.run(["rm", "-r", "/etc/guidedaccess"])
    after = listing(ct)
    before = RUN["before"]
    assert (sorted(after - before), sorted(before - after)) == ([], []), "left behind / missing after purge"
    FACTS["package container: files compared before install and after purge"] = str(len(after))
