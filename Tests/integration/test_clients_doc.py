"""The examples of docs/clients.md run against the service.

Every fenced block of docs/clients.md has a marker, an HTML comment on the
line before it:

- `<!-- example NAME: FILE -->`: the block is the file FILE of example NAME;
- `<!-- example NAME: build -->`: shell commands that build it, run with
  `sh -e` in the example's directory, the installed interface XML
  (/usr/share/dbus-1/interfaces/…) replaced by docs/'s;
- `<!-- example NAME: run -->`: the command that runs it;
- `<!-- output -->`: what every example prints on a GNOME session;
- `<!-- config -->`: a configuration, checked with `guidedaccessd --system
  --check-configuration` (the user `kiosk` read as the user running the
  test);
- `<!-- excerpt: PATH -->`: lines of a file of the repository that another
  test runs (the runs of lines between `// …` lines must be in PATH, in
  order).

Each example runs as a process of its own, with the private bus as its
session bus (gadaemon.GAEnv: real dconf, a private HOME), `python3` the
interpreter running this test (dbus-python, PyGObject) and
`guidedaccessctl` the build's. Three cases, each against its own
guidedaccessd --user:

- a stand-in GNOME session (every feature supported): the page's output,
  exactly (the shell examples print no `session:` lines), and no key left
  changed;
- then, in the same service, while the test holds a session of its own on
  an open connection: `busy: MESSAGE` (busctl: `not started: MESSAGE`),
  exit status 2;
- a bare bus, no desktop (nothing supported): `supported:` and
  `unsupported: MESSAGE`, exit status 2.

MESSAGE is the message the service gives the test for the same call, so a
changed reply, as well as an example that no longer builds, fails here.

The C and Qt examples are built with their page's commands; the Swift one
is compiled with swiftc against this checkout's build (GA_SWIFT_MODULES,
default .build/debug/Modules; the objects of the targets GuidedAccessClient
needs, as the build links kiosk-session), and its Package.swift must be the
one scripts/check-client-package builds. The builds start together, in the
background, when the first example runs. An example whose tools are missing
(Qt's, node, swiftc or a build) is skipped, saying which."""

import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import start_guidedaccessd
from gadaemon import DAEMON_BINARY, GA_ERROR, REPO_ROOT, Recorder

import dbus

DOC = REPO_ROOT / "docs" / "clients.md"
INSTALLED_XML = "/usr/share/dbus-1/interfaces/org.guidedaccess.GuidedAccess1.xml"
REPO_XML = REPO_ROOT / "docs" / "org.guidedaccess.GuidedAccess1.xml"
CHECK_CLIENT_PACKAGE = REPO_ROOT / "scripts" / "check-client-package"
SWIFT_MODULES = Path(os.environ.get("GA_SWIFT_MODULES", REPO_ROOT / ".build" / "debug" / "Modules"))

# What the page must show: every language of issue 27 (the web page is an excerpt).
EXAMPLES = ["python-dbus", "python-gio", "c", "qt", "busctl", "gdbus", "guidedaccessctl", "swift", "node"]
NO_SIGNALS = {"busctl", "gdbus", "guidedaccessctl"}  # no `session:` lines
ERRORS_BY_MESSAGE_ONLY = {"busctl"}  # busctl prints no error name
ALL_FEATURES = "grayscale high-contrast invert-colors large-text on-screen-keyboard reduce-motion screen-reader zoom"
WANTED = {"features": dbus.Array(["zoom"], signature="s")}
RUN_TIMEOUT = 30.0
BUILD_TIMEOUT = 300.0

MARKER = re.compile(r"^<!-- (?:example (?P<name>[\w-]+): (?P<role>\S+)|excerpt: (?P<excerpt>\S+)|(?P<kind>output|config)) -->$")


# ---------------------------------------------------------------- the page


class Block:
    def __init__(self, line, info, text, marker):
        self.line = line  # of the opening fence, 1-based
        self.info = info
        self.text = text
        self.marker = marker  # the MARKER match, or None

    def __repr__(self):
        return f"```{self.info} block at {DOC.name}:{self.line}"


def page_blocks():
    lines = DOC.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^```([\w+-]*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        start = i
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = MARKER.match(lines[j].strip()) if j >= 0 else None
        body = []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{DOC.name}:{start + 1}: the block is never closed"
        found.append(Block(start + 1, opening.group(1), "\n".join(body) + "\n", marker))
        i += 1
    return found


class Example:
    def __init__(self, name):
        self.name = name
        self.files = {}  # relative path → text
        self.build = None
        self.run = None
        self.line = None


def examples():
    found = {}
    for block in page_blocks():
        if block.marker is None or not block.marker.group("name"):
            continue
        example = found.setdefault(block.marker.group("name"), Example(block.marker.group("name")))
        example.line = example.line or block.line
        role = block.marker.group("role")
        if role == "build":
            assert example.build is None, f"{block!r}: a second build block for {example.name}"
            example.build = block.text
        elif role == "run":
            assert example.run is None, f"{block!r}: a second run block for {example.name}"
            example.run = block.text.strip()
        else:
            assert role not in example.files, f"{block!r}: {role} twice in {example.name}"
            example.files[role] = block.text
    return found


def blocks_of(kind):
    return [block for block in page_blocks() if block.marker is not None and block.marker.group("kind") == kind]


def expected_output():
    (block,) = blocks_of("output")
    return block.text.splitlines()


def test_every_block_is_marked_and_every_language_has_an_example():
    unmarked = [repr(block) for block in page_blocks() if block.marker is None]
    assert not unmarked, "blocks the test would not run (mark them):\n" + "\n".join(unmarked)
    found = examples()
    assert list(found) == EXAMPLES, f"the page's examples, in its order: {list(found)}"
    for example in found.values():
        assert example.run, f"example {example.name} has no run block"
        assert example.files, f"example {example.name} has no file"
    # The generated proxies come from the installed XML, which the builds here replace.
    for name in ("c", "qt"):
        assert INSTALLED_XML in found[name].build, f"example {name} does not build from {INSTALLED_XML}"
    assert found["swift"].run == "swift build && .build/debug/kioskapp"
    lines = expected_output()
    assert lines[0] == f"supported: {ALL_FEATURES}" and len(lines) == 4, lines
    assert len(blocks_of("config")) >= 1
    assert any(block.marker.group("excerpt") for block in page_blocks() if block.marker)


def test_the_swift_package_is_the_one_check_client_package_builds():
    script = CHECK_CLIENT_PACKAGE.read_text()
    built = re.search(r'cat >"\$work/kioskapp/Package.swift" <<SWIFT\n(.*?)\nSWIFT\n', script, re.S)
    assert built, f"no Package.swift in {CHECK_CLIENT_PACKAGE.name}"
    page = examples()["swift"].files["Package.swift"]
    url = re.search(r'\.package\(url: "([^"]+)", from: "([^"]+)"\)', page)
    assert url, page
    as_built = built.group(1).replace("file://$work/guidedaccess", url.group(1)).replace("$version", url.group(2))
    assert page.strip() == as_built.strip(), (
        f"docs/clients.md's Package.swift is not the one {CHECK_CLIENT_PACKAGE.name} builds:\n{as_built}")
    assert "Sources/kioskapp/main.swift" in examples()["swift"].files


def test_the_excerpts_are_in_the_files_that_other_tests_run():
    for block in page_blocks():
        if block.marker is None or not block.marker.group("excerpt"):
            continue
        source = (REPO_ROOT / block.marker.group("excerpt")).read_text().splitlines()
        source = [line.rstrip() for line in source]
        position = 0
        runs, run = [], []
        for line in block.text.splitlines():
            if line.strip().startswith("// …"):
                runs.append(run)
                run = []
            elif line.strip():
                run.append(line.rstrip())
        runs.append(run)
        for run in filter(None, runs):
            for start in range(position, len(source) - len(run) + 1):
                if source[start:start + len(run)] == run:
                    position = start + len(run)
                    break
            else:
                pytest.fail(f"{block!r}: these lines are not in {block.marker.group('excerpt')} "
                            f"(after line {position}):\n" + "\n".join(run))


def test_the_configuration_examples_are_valid(tmp_path):
    if not DAEMON_BINARY.exists():
        pytest.fail(f"{DAEMON_BINARY} does not exist: build it first", pytrace=False)
    user = pwd.getpwuid(os.getuid()).pw_name
    for block in blocks_of("config"):
        config = tmp_path / f"line-{block.line}.conf"
        config.write_text(re.sub(r"^(AllowUsers=)kiosk$", rf"\g<1>{user}", block.text, flags=re.M))
        completed = subprocess.run(
            [str(DAEMON_BINARY), "--system", "--config", str(config), "--check-configuration"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        assert completed.returncode == 0, f"{block!r} is not a valid configuration:\n{completed.stderr}"


# ---------------------------------------------------------------- building


def tool_missing(name):
    """Why the example NAME cannot be built or run here, or None."""
    needs = {
        "c": ["gdbus-codegen", "gcc", "pkg-config"],
        "qt": ["qdbusxml2cpp", "moc", "g++", "pkg-config"],
        "swift": ["swiftc", "pkg-config"],
        "node": ["node"],
        "busctl": ["busctl"],
        "gdbus": ["gdbus"],
    }.get(name, [])
    missing = [tool for tool in needs if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not on PATH (scripts/install-deps installs them)"
    if name == "qt" and subprocess.run(["pkg-config", "--exists", "Qt5DBus"]).returncode != 0:
        return "no Qt5DBus for pkg-config (qtbase5-dev; scripts/install-deps installs it)"
    if name == "swift" and not (SWIFT_MODULES / "GuidedAccessClient.swiftmodule").exists():
        return f"no GuidedAccessClient.swiftmodule in {SWIFT_MODULES}: build first or set GA_SWIFT_MODULES"
    return None


def swift_command(directory):
    """swiftc for the page's main.swift, linked with the objects the build
    links kiosk-session with (GuidedAccessClient and what it needs)."""
    build = SWIFT_MODULES.parent
    objects_list = build / "kiosk-session.product" / "Objects.LinkFileList"
    if not objects_list.exists():
        return None
    objects = [line for line in objects_list.read_text().split() if "/kiosk_session.build/" not in line]
    flags = ["-swift-version", "6", "-I", str(SWIFT_MODULES)]
    for module_map in sorted((REPO_ROOT / "Modules").glob("*/module.modulemap")):
        flags += ["-I", str(module_map.parent)]
    cflags = subprocess.run(["pkg-config", "--cflags", "dbus-1", "gio-2.0"], capture_output=True, text=True)
    for flag in cflags.stdout.split():
        flags += ["-Xcc", flag]
    (directory / ".build" / "debug").mkdir(parents=True)
    return ["swiftc", *flags, "Sources/kioskapp/main.swift", *objects, "-ldbus-1", "-o", ".build/debug/kioskapp"]


class Builds:
    """Every example's files written, the builds started together."""

    def __init__(self, root):
        self.root = root
        self.examples = examples()
        self.processes = {}
        self.skipped = {}
        for name, example in self.examples.items():
            directory = root / name
            for relative, text in example.files.items():
                (directory / relative).parent.mkdir(parents=True, exist_ok=True)
                (directory / relative).write_text(text)
            why = tool_missing(name)
            if why:
                self.skipped[name] = why
                continue
            if name == "swift":
                argv = swift_command(directory)
                if argv is None:
                    self.skipped[name] = f"no kiosk-session link list in {SWIFT_MODULES.parent}: build first"
                    continue
            elif example.build:
                argv = ["sh", "-ec", example.build.replace(INSTALLED_XML, str(REPO_XML))]
            else:
                continue
            self.processes[name] = subprocess.Popen(
                argv, cwd=directory, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)

    def ready(self, name):
        """The example's directory once it is built; skips when it cannot be."""
        if name in self.skipped:
            pytest.skip(f"example {name}: {self.skipped[name]}")
        process = self.processes.get(name)
        if process is not None:
            try:
                output, _ = process.communicate(timeout=BUILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
            assert process.returncode == 0, (
                f"example {name} (docs/clients.md:{self.examples[name].line}) does not build "
                f"(exit {process.returncode}):\n{output}")
        return self.root / name

    def stop(self):
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.communicate()


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    made = Builds(tmp_path_factory.mktemp("clients"))
    yield made
    made.stop()


# ---------------------------------------------------------------- running


def run_example(ga_env, builds, name):
    """Runs the example; returns (exit status, its stdout's lines without
    trailing blanks, report for a failure)."""
    directory = builds.ready(name)
    command = builds.examples[name].run
    if name == "swift":
        command = command.removeprefix("swift build && ")  # built above, with swiftc
    env = dict(ga_env.env)
    # python3: this interpreter (dbus-python, PyGObject); guidedaccessctl: the build's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), str(DAEMON_BINARY.parent), env["PATH"]])
    completed = subprocess.run(
        ["sh", "-c", command], cwd=directory, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=RUN_TIMEOUT)
    lines = [line.rstrip() for line in completed.stdout.splitlines()]
    report = (f"example {name} (docs/clients.md:{builds.examples[name].line}): `{command}` exited "
              f"{completed.returncode}\nstdout:\n{completed.stdout}\nstderr:\n{completed.stderr}")
    return completed.returncode, lines, report


def error_line(name, kind, message):
    return f"{'not started' if name in ERRORS_BY_MESSAGE_ONLY else kind}: {message}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_on_a_gnome_session_and_while_another_session_is_on(ga_env, gad, builds, name):
    rec = Recorder(ga_env)
    before = ga_env.snapshot()

    status, lines, report = run_example(ga_env, builds, name)
    expected = [line for line in expected_output() if not (name in NO_SIGNALS and line.startswith("session:"))]
    assert status == 0 and lines == expected, f"expected:\n" + "\n".join(expected) + f"\n{report}"
    assert rec.prop("SessionActive") is False, f"the example left its session on\n{report}"
    assert ga_env.snapshot() == before, f"the example left keys changed\n{report}"

    # A session of the test's own, its connection open: everyone else's is SessionBusy.
    rec.call("StartSession", "a{sv}", ({},))
    other = Recorder(ga_env)
    error, message = other.error("StartSession", "a{sv}", (WANTED,))
    assert error == GA_ERROR + "SessionBusy", (error, message)
    status, lines, report = run_example(ga_env, builds, name)
    expected = [f"supported: {ALL_FEATURES}", error_line(name, "busy", message)]
    assert status == 2 and lines == expected, f"expected:\n" + "\n".join(expected) + f"\n{report}"
    assert rec.prop("SessionOwner") == rec.unique_name
    rec.call("EndSession")
    assert ga_env.snapshot() == before


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_without_a_desktop(ga_env, builds, name):
    ga_env.stand_for_no_desktop()
    start_guidedaccessd(ga_env)
    rec = Recorder(ga_env)
    error, message = rec.error("StartSession", "a{sv}", (WANTED,))
    assert error == GA_ERROR + "UnsupportedFeature", (error, message)

    status, lines, report = run_example(ga_env, builds, name)
    expected = ["supported:", error_line(name, "unsupported", message)]
    assert status == 2 and lines == expected, f"expected:\n" + "\n".join(expected) + f"\n{report}"
    assert rec.prop("SessionActive") is False
