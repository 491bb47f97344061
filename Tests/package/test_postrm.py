"""The package's maintainer scripts and guidedaccess-dconf-profile, run as
they are (sh, that is dash) on crafted trees under a temporary DPKG_ROOT:
nothing outside the temporary directory is read or written, and no root is
needed.

Under DPKG_ROOT the scripts run neither systemd nor dconf: fakes of
`dconf`, `busctl`, `systemctl`, `deb-systemd-invoke` and `setpriv` first on
PATH record every call and fail, and each test checks none was made.

A shared database ([Dconf] DatabaseName=local, beside the administrator's
own keyfiles and locks) keeps the administrator's compiled database and
profile line; only what the package added goes. Symbolic links pointing out
of the root lead to a canary directory whose files must survive.

The scripts tested are the repository's; GUIDEDACCESS_POSTRM,
GUIDEDACCESS_PRERM and GUIDEDACCESS_DCONF_PROFILE name others (e.g. an
older version's, from `git show`).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POSTRM = Path(os.environ.get("GUIDEDACCESS_POSTRM", REPO / "debian/guidedaccess.postrm"))
PRERM = Path(os.environ.get("GUIDEDACCESS_PRERM", REPO / "debian/guidedaccess.prerm"))
PROFILE_TOOL = Path(os.environ.get("GUIDEDACCESS_DCONF_PROFILE", REPO / "systemd/guidedaccess-dconf-profile"))
MARK = "# guidedaccess-dconf-profile"
FAKED = ["dconf", "busctl", "systemctl", "deb-systemd-invoke", "setpriv"]

# What the service writes in DatabaseDir/DatabaseName.d.
SERVICE_KEYFILES = ["50-guidedaccess", "40-guidedaccess-baseline"]
SERVICE_LOCKS = ["locks/guidedaccess", "locks/guidedaccess-baseline"]
ADMIN_KEYFILE = "[org/gnome/desktop/lockdown]\ndisable-command-line=true\n"
ADMIN_LOCK = "/org/gnome/desktop/lockdown/disable-command-line\n"


class Kiosk:
    """A temporary DPKG_ROOT (`root`), a canary directory beside it that
    links may point at, and the fakes' call log."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.root = tmp / "root"
        self.canary = tmp / "canary"
        self.bin = tmp / "bin"
        self.calls = tmp / "calls"
        for d in (self.root, self.canary, self.bin):
            d.mkdir()
        for name in FAKED:
            fake = self.bin / name
            fake.write_text(f'#!/bin/sh\necho "{name} $*" >>"{self.calls}"\nexit 1\n')
            fake.chmod(0o755)

    def path(self, relative: str) -> Path:
        return self.root / relative.lstrip("/")

    def write(self, relative: str, text: str) -> Path:
        path = self.path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def config(self, dconf: str):
        self.write("/etc/guidedaccess/guidedaccess.conf", "[Service]\nBackend=dconf\n\n[Dconf]\n" + dconf)

    def service_files(self, database: str):
        """What guidedaccessd writes in DATABASE.d (absolute, in the root)."""
        for name in SERVICE_KEYFILES + SERVICE_LOCKS:
            self.write(f"{database}.d/{name}", f"service's {name}\n")

    def admin_files(self, database: str):
        self.write(f"{database}.d/00-admin", ADMIN_KEYFILE)
        self.write(f"{database}.d/locks/00-admin", ADMIN_LOCK)

    def canary_file(self, relative: str, text: str = "canary\n") -> Path:
        path = self.canary / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def env(self) -> dict:
        return {"PATH": f"{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin", "DPKG_ROOT": str(self.root), "LC_ALL": "C"}

    def run(self, script: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(script), *args], env=self.env(), capture_output=True, text=True,
                              timeout=60)

    def postrm(self, action: str) -> subprocess.CompletedProcess:
        done = self.run(POSTRM, action)
        assert done.returncode == 0, done.stderr
        return done

    def profile_tool(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(PROFILE_TOOL, *args)

    def made_calls(self) -> str:
        return self.calls.read_text() if self.calls.exists() else ""

    def tree(self, top: Path = None) -> dict:
        """Every path under TOP (the root): its type and content or target."""
        top = top or self.root
        found = {}
        for path in sorted(top.rglob("*")):
            name = str(path.relative_to(top))
            if path.is_symlink():
                found[name] = ("link", os.readlink(path))
            elif path.is_dir():
                found[name] = ("dir",)
            else:
                found[name] = ("file", path.read_text())
        return found


@pytest.fixture
def kiosk(tmp_path):
    k = Kiosk(tmp_path)
    yield k
    assert k.made_calls() == "", "systemd or dconf was called under DPKG_ROOT"


def lines(path: Path) -> list:
    return path.read_text().splitlines()


def shared_database(kiosk: Kiosk) -> Kiosk:
    """DatabaseName=local, shared with the administrator's own keyfile and
    lock, compiled from both; the profile lists it and the user's own."""
    kiosk.config("DatabaseName=local\n")
    kiosk.admin_files("/etc/dconf/db/local")
    kiosk.service_files("/etc/dconf/db/local")
    kiosk.write("/etc/dconf/db/local", "compiled: the administrator's locks and the service's\n")
    kiosk.write("/etc/dconf/profile/user", "user-db:user\n")
    kiosk.write("/var/lib/guidedaccess/journal.json", '{"restrictions" : [], "version" : 2}\n')
    return kiosk


def assert_only_the_service_files_went(kiosk: Kiosk, database: str):
    keyfiles = kiosk.path(database + ".d")
    assert sorted(str(p.relative_to(keyfiles)) for p in keyfiles.rglob("*")) == \
        ["00-admin", "locks", "locks/00-admin"]
    assert (keyfiles / "00-admin").read_text() == ADMIN_KEYFILE
    assert (keyfiles / "locks/00-admin").read_text() == ADMIN_LOCK


# -- 1. A shared database: the administrator's compiled database stays -------

def test_purge_with_a_shared_database_keeps_the_admins_compiled_database_and_profile_line(kiosk):
    """The issue's acceptance: under DPKG_ROOT (no `dconf update`), purge
    with DatabaseName=local keeps /etc/dconf/db/local (the administrator's
    locks are in it) and their system-db:local, which they put right after
    the tool's mark; only what the package added goes, and a warning says to
    run `dconf update`."""
    shared_database(kiosk)
    profile = kiosk.path("/etc/dconf/profile/user")
    assert kiosk.profile_tool("--profile", str(profile)).returncode == 0
    # The administrator puts their own database before the service's.
    text = lines(profile)
    text.insert(text.index("system-db:guidedaccess"), "system-db:local")
    profile.write_text("\n".join(text) + "\n")
    # A link out of the root in the place of one of the service's files.
    baseline = kiosk.path("/etc/dconf/db/local.d/locks/guidedaccess-baseline")
    baseline.unlink()
    baseline.symlink_to(kiosk.canary_file("baseline"))
    done = kiosk.postrm("purge")
    assert kiosk.tree() == {
        "etc": ("dir",),
        "etc/dconf": ("dir",),
        "etc/dconf/db": ("dir",),
        "etc/dconf/db/local": ("file", "compiled: the administrator's locks and the service's\n"),
        "etc/dconf/db/local.d": ("dir",),
        "etc/dconf/db/local.d/00-admin": ("file", ADMIN_KEYFILE),
        "etc/dconf/db/local.d/locks": ("dir",),
        "etc/dconf/db/local.d/locks/00-admin": ("file", ADMIN_LOCK),
        "etc/dconf/profile": ("dir",),
        "etc/dconf/profile/user": ("file", "user-db:user\nsystem-db:local\n"),
        "etc/guidedaccess": ("dir",),
        "etc/guidedaccess/guidedaccess.conf": ("file", "[Service]\nBackend=dconf\n\n[Dconf]\nDatabaseName=local\n"),
        "var": ("dir",),
        "var/lib": ("dir",),
    }
    assert kiosk.tree(kiosk.canary) == {"baseline": ("file", "canary\n")}
    assert "dconf update" in done.stderr and str(kiosk.path("/etc/dconf/db/local")) in done.stderr, done.stderr


def test_remove_with_a_shared_database_keeps_the_compiled_database_and_says_to_run_dconf_update(kiosk):
    shared_database(kiosk)
    done = kiosk.postrm("remove")
    assert kiosk.path("/etc/dconf/db/local").exists()
    assert_only_the_service_files_went(kiosk, "/etc/dconf/db/local")
    assert "run `dconf update`" in done.stderr and "drops them" in done.stderr, done.stderr


def test_purge_of_a_database_of_its_own_name_removes_it_all(kiosk):
    """DatabaseName=kiosk whose .d held only the service's files (Tests/
    container step 4b): the compiled database was the service's alone."""
    kiosk.path("/etc/dconf/db").mkdir(parents=True)
    kiosk.path("/var/lib").mkdir(parents=True)
    before = kiosk.tree()
    kiosk.config("DatabaseName=kiosk\n")
    kiosk.service_files("/etc/dconf/db/kiosk")
    kiosk.write("/etc/dconf/db/kiosk", "compiled\n")
    kiosk.write("/var/lib/guidedaccess/journal.json", "{}\n")
    kiosk.postrm("purge")
    # The administrator's own configuration is theirs to remove.
    kiosk.path("/etc/guidedaccess/guidedaccess.conf").unlink()
    kiosk.path("/etc/guidedaccess").rmdir()
    assert kiosk.tree() == before


def test_purge_of_a_default_install_leaves_the_kiosk_as_before(kiosk):
    """Tests/container's contract: the profile tool creates the profile and
    its directory, the service writes its default database and journal;
    purge leaves the tree exactly as it was."""
    kiosk.write("/etc/dconf/db/site.d/00-site", ADMIN_KEYFILE)
    kiosk.write("/etc/dconf/db/site", "compiled site\n")
    kiosk.path("/var/lib").mkdir(parents=True)
    before = kiosk.tree()
    assert kiosk.profile_tool("--profile", str(kiosk.path("/etc/dconf/profile/user"))).returncode == 0
    profile = lines(kiosk.path("/etc/dconf/profile/user"))
    assert profile[0].startswith(f"{MARK} created this file and its directory") and \
        profile[-1] == "system-db:guidedaccess"
    kiosk.service_files("/etc/dconf/db/guidedaccess")
    kiosk.write("/etc/dconf/db/guidedaccess", "compiled\n")
    kiosk.write("/var/lib/guidedaccess/journal.json", "{}\n")
    kiosk.postrm("purge")
    assert kiosk.tree() == before


def test_remove_of_the_default_database_removes_it_when_it_cannot_be_rebuilt(kiosk):
    kiosk.service_files("/etc/dconf/db/guidedaccess")
    kiosk.write("/etc/dconf/db/guidedaccess", "compiled\n")
    kiosk.write("/etc/dconf/profile/user", f"user-db:user\n{MARK} added: system-db:guidedaccess\n"
                                          "system-db:guidedaccess\n")
    done = kiosk.postrm("remove")
    assert not kiosk.path("/etc/dconf/db/guidedaccess").exists()
    assert sorted(kiosk.tree(kiosk.path("/etc/dconf/db/guidedaccess.d"))) == ["locks"]
    # remove leaves the profile line (the database is its to name).
    assert lines(kiosk.path("/etc/dconf/profile/user"))[-1] == "system-db:guidedaccess"
    assert "removing it so that its locks go" in done.stderr


# -- 2. The profile: only the line the mark records --------------------------

def test_profile_tool_records_the_line_it_adds_in_its_mark(kiosk):
    profile = kiosk.write("/etc/dconf/profile/kiosk", "user-db:user\nsystem-db:local")  # no final newline
    done = kiosk.profile_tool("--name", "kiosk", "--profile", str(profile))
    assert done.returncode == 0, done.stderr
    assert lines(profile) == ["user-db:user", "system-db:local", f"{MARK} added: system-db:kiosk",
                              "system-db:kiosk"]
    assert kiosk.profile_tool("--name", "kiosk", "--profile", str(profile), "--check").returncode == 0


def test_purge_removes_the_recorded_line_wherever_it_moved_and_nothing_else(kiosk):
    kiosk.config("DatabaseName=local\n")
    profile = kiosk.write("/etc/dconf/profile/user", "\n".join([
        "user-db:user",
        "system-db:guidedaccess",  # moved above the mark by the administrator
        f"{MARK} added: system-db:guidedaccess",
        "system-db:local",
        "system-db:site",
    ]) + "\n")
    kiosk.postrm("purge")
    assert lines(profile) == ["user-db:user", "system-db:local", "system-db:site"]


def test_purge_removes_only_the_first_exact_match_after_the_mark(kiosk):
    profile = kiosk.write("/etc/dconf/profile/user", "\n".join([
        "system-db:guidedaccess ",  # not exactly the line
        "user-db:user",
        f"{MARK} added: system-db:kiosk",
        "system-db:local",
        "system-db:kiosk",
        "system-db:kiosk",
    ]) + "\n")
    kiosk.postrm("purge")
    assert lines(profile) == ["system-db:guidedaccess ", "user-db:user", "system-db:local", "system-db:kiosk"]


def test_purge_keeps_an_admin_line_after_an_old_style_mark_and_warns(kiosk):
    """A mark of an older guidedaccess-dconf-profile ("added the next line")
    followed by a line it never adds for this configuration."""
    kiosk.config("DatabaseName=local\n")
    profile = kiosk.write("/etc/dconf/profile/user", "\n".join([
        "user-db:user",
        f"{MARK} added the next line; purging guidedaccess removes it",
        "system-db:site",
        "system-db:guidedaccess",
    ]) + "\n")
    done = kiosk.postrm("purge")
    assert lines(profile) == ["user-db:user", "system-db:site", "system-db:guidedaccess"]
    assert "'system-db:site'" in done.stderr and "left" in done.stderr, done.stderr


@pytest.mark.parametrize("configured", [None, "kiosk"])
def test_purge_removes_the_line_after_an_old_style_mark_when_it_is_the_tools(kiosk, configured):
    name = configured or "guidedaccess"
    if configured:
        kiosk.config(f"DatabaseName={configured}\n")
    profile = kiosk.write("/etc/dconf/profile/user", "\n".join([
        f"{MARK} created this file; purging guidedaccess removes it",
        "user-db:user",
        "system-db:site",
        f"{MARK} added the next line; purging guidedaccess removes it",
        f"system-db:{name}",
    ]) + "\n")
    kiosk.postrm("purge")
    assert lines(profile) == ["user-db:user", "system-db:site"]


def test_purge_leaves_a_symlinked_profile_and_what_it_points_to(kiosk):
    target = kiosk.canary_file("profile", f"user-db:user\n{MARK} added: system-db:guidedaccess\n"
                                          "system-db:guidedaccess\n")
    link = kiosk.path("/etc/dconf/profile/user")
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    done = kiosk.postrm("purge")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == f"user-db:user\n{MARK} added: system-db:guidedaccess\nsystem-db:guidedaccess\n"
    assert "symbolic link" in done.stderr


def test_profile_tool_refuses_to_replace_a_symlinked_profile(kiosk):
    target = kiosk.canary_file("profile", "user-db:user\n")
    link = kiosk.path("/etc/dconf/profile/user")
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    done = kiosk.profile_tool("--profile", str(link))
    assert done.returncode == 1 and "symbolic link" in done.stderr
    assert link.is_symlink() and target.read_text() == "user-db:user\n"


# -- 3. DatabaseDir canonical, symbolic links not followed -------------------

@pytest.mark.parametrize("database_dir", [
    "/../canary/db",  # out of the root
    "/etc/dconf/db/../../../../canary/db",
    "/etc/dconf//db",
    "/etc/./dconf/db",
    "etc/dconf/db",
])
def test_a_database_dir_that_is_not_canonical_is_refused(kiosk, database_dir):
    kiosk.config(f"DatabaseDir={database_dir}\nDatabaseName=kiosk\n")
    # Where the path would lead: out of the root, and in it.
    for where in (kiosk.canary / "db", kiosk.path("/etc/dconf/db")):
        for name in SERVICE_KEYFILES + SERVICE_LOCKS:
            path = where / "kiosk.d" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("kept\n")
        (where / "kiosk").write_text("compiled\n")
    canary, inside = kiosk.tree(kiosk.canary), kiosk.tree(kiosk.path("/etc/dconf"))
    done = kiosk.postrm("purge")
    assert kiosk.tree(kiosk.canary) == canary
    assert kiosk.tree(kiosk.path("/etc/dconf")) == inside
    assert f"DatabaseDir={database_dir}" in done.stderr, done.stderr


def test_a_database_dir_with_a_trailing_slash_is_cleaned(kiosk):
    kiosk.config("DatabaseDir=/etc/dconf/db/\nDatabaseName=kiosk\n")
    kiosk.service_files("/etc/dconf/db/kiosk")
    kiosk.write("/etc/dconf/db/kiosk", "compiled\n")
    kiosk.postrm("purge")
    assert sorted(kiosk.tree(kiosk.path("/etc/dconf"))) == ["db"]


def test_a_symlinked_keyfile_directory_is_not_followed(kiosk):
    kiosk.config("DatabaseName=kiosk\n")
    for name in SERVICE_KEYFILES + SERVICE_LOCKS:
        kiosk.canary_file(f"kiosk.d/{name}")
    kiosk.path("/etc/dconf/db").mkdir(parents=True)
    kiosk.path("/etc/dconf/db/kiosk.d").symlink_to(kiosk.canary / "kiosk.d")
    kiosk.write("/etc/dconf/db/kiosk", "compiled\n")
    canary = kiosk.tree(kiosk.canary)
    done = kiosk.postrm("purge")
    assert kiosk.tree(kiosk.canary) == canary
    assert kiosk.path("/etc/dconf/db/kiosk.d").is_symlink()
    assert "symbolic link" in done.stderr


def test_a_symlinked_locks_directory_is_not_followed(kiosk):
    """locks/ links out of the root: the service's keyfiles go, the locks it
    links to stay, and so does the compiled database (not the service's
    alone any more)."""
    kiosk.config("DatabaseName=kiosk\n")
    for name in SERVICE_KEYFILES:
        kiosk.write(f"/etc/dconf/db/kiosk.d/{name}", "service's\n")
    for name in ("guidedaccess", "guidedaccess-baseline", "00-admin"):
        kiosk.canary_file(f"locks/{name}")
    kiosk.path("/etc/dconf/db/kiosk.d/locks").symlink_to(kiosk.canary / "locks")
    kiosk.write("/etc/dconf/db/kiosk", "compiled\n")
    canary = kiosk.tree(kiosk.canary)
    done = kiosk.postrm("purge")
    assert kiosk.tree(kiosk.canary) == canary
    assert kiosk.tree(kiosk.path("/etc/dconf/db")) == {
        "kiosk": ("file", "compiled\n"), "kiosk.d": ("dir",), "kiosk.d/locks": ("link", str(kiosk.canary / "locks"))}
    assert "locks is a symbolic link" in done.stderr and "dconf update" in done.stderr


def test_symlinks_in_the_place_of_the_service_files_are_removed_not_followed(kiosk):
    """A link where the service writes a file, or its compiled database:
    the link goes, never what it points to."""
    for name in SERVICE_KEYFILES + SERVICE_LOCKS:
        link = kiosk.path(f"/etc/dconf/db/guidedaccess.d/{name}")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(kiosk.canary_file(name.replace("/", "-")))
    kiosk.path("/etc/dconf/db/guidedaccess").symlink_to(kiosk.canary_file("compiled"))
    kiosk.path("/var/lib").mkdir(parents=True)
    kiosk.canary_file("state/journal.json")
    kiosk.path("/var/lib/guidedaccess").symlink_to(kiosk.canary / "state")
    canary = kiosk.tree(kiosk.canary)
    kiosk.postrm("purge")
    assert kiosk.tree(kiosk.canary) == canary
    assert sorted(kiosk.tree()) == ["etc", "etc/dconf", "etc/dconf/db", "var", "var/lib"]


def test_an_absolute_link_on_the_way_out_of_the_root_is_not_followed(kiosk):
    """DatabaseDir=/srv/dconf where the root's /srv links to a directory
    outside it (an absolute link resolves against the running system, not
    the root); the same for /var and /etc/dconf/profile."""
    kiosk.config("DatabaseDir=/srv/dconf\nDatabaseName=kiosk\n")
    for name in SERVICE_KEYFILES + SERVICE_LOCKS:
        kiosk.canary_file(f"srv/dconf/kiosk.d/{name}")
    kiosk.canary_file("srv/dconf/kiosk", "compiled\n")
    kiosk.path("/srv").symlink_to(kiosk.canary / "srv")
    kiosk.canary_file("var/lib/guidedaccess/journal.json")
    kiosk.path("/var").symlink_to(kiosk.canary / "var")
    kiosk.canary_file("profile/user", f"user-db:user\n{MARK} added: system-db:kiosk\nsystem-db:kiosk\n")
    kiosk.path("/etc/dconf").mkdir(parents=True)
    kiosk.path("/etc/dconf/profile").symlink_to(kiosk.canary / "profile")
    canary = kiosk.tree(kiosk.canary)
    done = kiosk.postrm("purge")
    assert kiosk.tree(kiosk.canary) == canary
    assert done.stderr.count("not followed under DPKG_ROOT") == 3, done.stderr


# -- 4. guidedaccess-dconf-profile's arguments --------------------------------

@pytest.mark.parametrize("name, shown", [
    ("guidedaccess\nsystem-db:evil", r"guidedaccess\nsystem-db:evil"),
    ("tab\there", r"tab\there"),
    ("bell\a", r"bell\a"),
    ("two words", "two words"),
    ("semi;colon", "semi;colon"),
    ("kiosk/db", "kiosk/db"),
    ("caf\u00e9", r"caf\303\251"),
    (".", "."),
    ("..", ".."),
    ("", ""),
])
def test_profile_tool_refuses_a_bad_database_name(kiosk, name, shown):
    profile = kiosk.path("/etc/dconf/profile/user")
    done = kiosk.profile_tool("--name", name, "--profile", str(profile))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"invalid database name '{shown}'" in done.stderr, done.stderr
    assert not profile.exists() and not profile.parent.exists()


@pytest.mark.parametrize("name", ["kiosk", "local-2", "site_db", "db.v1", "-x"])
def test_profile_tool_takes_a_good_database_name(kiosk, name):
    profile = kiosk.path("/etc/dconf/profile/user")
    done = kiosk.profile_tool("--name", name, "--profile", str(profile))
    assert done.returncode == 0, done.stderr
    assert lines(profile)[-2:] == [f"{MARK} added: system-db:{name}", f"system-db:{name}"]


def test_profile_tool_refuses_a_profile_name_with_control_characters(kiosk):
    profile = str(kiosk.path("/etc/dconf/profile/user")) + "\nx"
    done = kiosk.profile_tool("--profile", profile)
    assert done.returncode == 2 and r"user\nx'" in done.stderr, done.stderr
    assert not kiosk.path("/etc/dconf/profile").exists()


@pytest.mark.parametrize("args", [["--name"], ["--profile"], ["--check", "--name"]])
def test_profile_tool_says_which_option_lacks_its_value(kiosk, args):
    done = kiosk.profile_tool(*args)
    assert done.returncode == 2 and f"{args[-1]} needs a value" in done.stderr, done.stderr


# -- 5. prerm: user-mode sessions ---------------------------------------------

def journal(session: bool) -> str:
    """A user-mode journal as the service writes it (SessionJournal: keys
    sorted, indented, ' : '), padded as its slots are."""
    record = {"restrictions": [], "version": 2}
    if session:
        record["drivers"] = {"settings": {"snapshot": [
            {"double": 2.0, "key": "mag-factor", "schema": "org.gnome.desktop.a11y.magnifier", "unset": False},
            {"bool": False, "key": "screen-magnifier-enabled", "schema": "org.gnome.desktop.a11y.applications",
             "unset": False},
            {"key": "gtk-theme", "schema": "org.gnome.desktop.interface", "string": "Adwaita", "unset": False},
            {"key": "cursor-theme", "schema": "org.gnome.desktop.interface", "string": "it's \"odd\"",
             "unset": False},
            {"key": "text-scaling-factor", "schema": "org.gnome.desktop.interface", "unset": True},
        ]}}
        record["session"] = {"deadlineUsec": 0, "features": ["zoom", "high-contrast"], "inhibitSleep": False,
                             "ownerUID": 1000, "textScale": 1.5, "zoomFactor": 4.0}
    text = json.dumps(record, indent=2, separators=(",", " : "), sort_keys=True) + "\n"
    return text + " " * (4096 - len(text) - 1) + "\n"


def users(kiosk: Kiosk):
    kiosk.write("/etc/passwd", "\n".join([
        "root:x:0:0:root:/root:/bin/bash",
        "daemon:x:999:999::/var/lib/daemon:/usr/sbin/nologin",
        "kiosk:x:1000:1000:Kiosk:/home/kiosk:/bin/bash",
        "idle:x:1001:1001::/home/idle:/bin/bash",
        "linked:x:1002:1002::/home/linked:/bin/bash",
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
    ]) + "\n")
    state = ".local/state/guidedaccess/journal.json"
    kiosk.write(f"/home/kiosk/{state}", journal(True))
    kiosk.write(f"/home/idle/{state}", journal(False))
    kiosk.write(f"/var/lib/daemon/{state}", journal(True))
    kiosk.write(f"/root/{state}", journal(True))
    link = kiosk.path(f"/home/linked/{state}")
    link.parent.mkdir(parents=True)
    link.symlink_to(kiosk.canary_file("journal.json", journal(True)))


def test_prerm_names_a_user_mode_session_it_cannot_end_and_how_to_undo_it(kiosk):
    """No user manager runs (nothing does under DPKG_ROOT): the kiosk user's
    journal still records a session, and the message says whose, which
    file, that it was not undone, and the commands that put back the values
    it records. An idle journal, a system user's, and a link say nothing."""
    users(kiosk)
    before = kiosk.tree()
    done = kiosk.run(PRERM, "remove")
    assert done.returncode == 0, done.stderr
    path = kiosk.path("/home/kiosk/.local/state/guidedaccess/journal.json")
    said = done.stderr
    assert f"user kiosk (uid 1000): the user-mode session recorded in {path} was not undone" in said, said
    assert "install guidedaccess again and, logged in as kiosk, run `guidedaccessctl end`" in said
    for command in ["gsettings set org.gnome.desktop.a11y.magnifier mag-factor 2.0",
                    "gsettings set org.gnome.desktop.a11y.applications screen-magnifier-enabled false",
                    "gsettings set org.gnome.desktop.interface gtk-theme \"'Adwaita'\"",
                    "gsettings set org.gnome.desktop.interface cursor-theme ...  (the value from before is in the file)",
                    "gsettings reset org.gnome.desktop.interface text-scaling-factor"]:
        assert f"guidedaccess:     {command}\n" in said, said
    for other in ("idle", "daemon", "linked", "root", "nobody"):
        assert f"user {other} " not in said
    assert kiosk.tree() == before  # nothing in home directories is touched


@pytest.mark.parametrize("action", ["upgrade", "deconfigure", "failed-upgrade"])
def test_prerm_says_nothing_of_user_sessions_but_on_remove(kiosk, action):
    users(kiosk)
    done = kiosk.run(PRERM, action)
    assert done.returncode == 0 and done.stderr == "", done.stderr
