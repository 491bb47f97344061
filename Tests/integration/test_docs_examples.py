"""The examples of docs/dbus-api.md are true.

Every fenced block of docs/dbus-api.md is picked up by its info string:

- ```sh: each command (backslash continuations joined) is run with bash. Only
  busctl (with --user) and gdbus (with --session) commands may appear, so
  that they reach the private bus through DBUS_SESSION_BUS_ADDRESS; anything
  else belongs in a ```text block, which is not run. A comment `# → TEXT`
  right under a command is what it must print (several such lines: several
  lines of output); `# → error NAME` means it must fail with NAME in its
  stderr. Without one, the command must succeed.
- ```python: each block is a complete script, run with this interpreter
  (dbus-python, PyGObject) as a process of its own; it must exit 0.
- ```swift: type-checked against the built GuidedAccessClient module with
  `swiftc -typecheck` (skipped where there is no swiftc or no build; the
  build's Modules directory is GA_SWIFT_MODULES, default
  .build/debug/Modules). A snippet that does not import GuidedAccessClient
  gets the import; one that uses `guidedAccess` without defining it gets
  `let guidedAccess = try await GuidedAccessClient.connect()`, as the page
  says.

The busctl commands, the gdbus commands and the Python blocks are three runs,
each against its own guidedaccessd (user mode, private session bus, real
dconf): in the page's order the examples of one tool are one kiosk visit —
StartSession before ConfigureForSession, a restriction registered before it
is denied, EndSession last — and each run must leave every mapped key as it
was. A new example is picked up by its fence; one that fails fails its run,
naming the block's line in the page."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gadaemon import IFACE, NAME, PATH, REPO_ROOT

DOC = REPO_ROOT / "docs" / "dbus-api.md"
API_SOURCE = REPO_ROOT / "Sources" / "GuidedAccessAPI" / "GuidedAccessBus.swift"
EXAMPLE_TIMEOUT = 30.0
EXPECT = "# → "


# ---------------------------------------------------------------- extraction


class Block:
    def __init__(self, info, line, text):
        self.info = info
        self.line = line  # of the opening fence, 1-based
        self.text = text

    def __repr__(self):
        return f"{self.info} block at {DOC.name}:{self.line}"


def blocks(path=DOC):
    """Every fenced block, in page order; fences may be indented (list items)."""
    found = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```([\w+-]*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        indent, info, start = len(opening.group(1)), opening.group(2), i + 1
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        assert i < len(lines), f"{path.name}:{start}: the block is never closed"
        found.append(Block(info, start, "\n".join(body) + "\n"))
        i += 1
    return found


class Command:
    def __init__(self, block, line, text):
        self.block = block
        self.line = line
        self.text = text
        self.expected = []  # lines of output, or ["error NAME"]

    @property
    def tool(self):
        return shlex.split(self.text)[0]

    def __repr__(self):
        return f"{DOC.name}:{self.line}: {self.text}"


def commands(block):
    """The commands of a ```sh block, with the `# →` lines under each."""
    found = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line, number = lines[i], block.line + 1 + i
        i += 1
        stripped = line.strip()
        if stripped.startswith(EXPECT.strip()):
            assert found, f"{DOC.name}:{number}: expected output before any command"
            found[-1].expected.append(stripped[len(EXPECT.strip()):].strip())
            continue
        if not stripped or stripped.startswith("#"):
            continue
        text = line
        while text.rstrip().endswith("\\") and i < len(lines):
            text = text.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
        found.append(Command(block, number, text.strip()))
    return found


def sh_commands():
    return [command for block in blocks() if block.info == "sh" for command in commands(block)]


def python_blocks():
    return [block for block in blocks() if block.info == "python"]


def swift_blocks():
    return [block for block in blocks() if block.info == "swift"]


def api_methods():
    """The interface's methods, from the API's own declaration."""
    source = API_SOURCE.read_text()
    body = source.split("enum GuidedAccessMethod", 1)[1].split("}", 1)[0]
    return re.findall(r'case \w+ = "(\w+)"', body)


# ---------------------------------------------------------------- the page itself


def test_the_page_has_examples_of_every_method_in_every_form():
    """Each method of the interface has a busctl, a gdbus, a Python and a
    Swift example; the extraction finds what it should. RegisterAgent (1.2)
    has no Swift form: GuidedAccessClient is for kiosk apps, and the only
    agent in Swift is guidedaccessd --agent, as the page says."""
    methods = api_methods()
    assert len(methods) == 12, methods
    sh = sh_commands()
    python = python_blocks()
    missing = []
    for method in methods:
        if not any(c.tool == "busctl" and re.search(rf"\b{method}\b", c.text) for c in sh):
            missing.append(f"busctl {method}")
        if not any(c.tool == "gdbus" and f"{IFACE}.{method}" in c.text for c in sh):
            missing.append(f"gdbus {method}")
        if not any(re.search(rf"\b{method}\b", b.text) for b in python):
            missing.append(f"Python {method}")
    swift_calls = {
        "StartSession": "requestSession", "ConfigureForSession": "configure(", "EndSession": "endSession()",
        "RegisterRestrictions": "registerRestrictions(", "UnregisterRestrictions": "unregisterRestrictions(",
        "SetRestrictionState": "setRestrictionState(", "GetRestrictionState": "restrictionState(for:",
        "ListRestrictions": "restrictions()", "RegisterAgent": None, "AttachBrowser": "attachBrowser(socket:",
        "PageCall": None, "PageLeft": None,
    }
    assert set(swift_calls) == set(methods)
    for method, call in swift_calls.items():
        if call is None:
            if "There is no Swift form" not in DOC.read_text():
                missing.append(f"Swift {method} (or the sentence saying why there is none)")
            continue
        if not any(call in b.text for b in swift_blocks()):
            missing.append(f"Swift {method}")
    assert not missing, f"{DOC.name} lacks examples: {', '.join(missing)}"


def test_shell_examples_are_busctl_or_gdbus_on_the_session_bus():
    """Only what the runs below can point at a private bus: anything else
    in a ```sh block would not be tested (use ```text for it)."""
    bad = []
    for command in sh_commands():
        argv = shlex.split(command.text)
        if argv[0] == "busctl" and "--user" in argv:
            continue
        if argv[0] == "gdbus" and "--session" in argv:
            continue
        bad.append(repr(command))
    assert not bad, "not a busctl --user or gdbus --session command:\n" + "\n".join(bad)
    for block in python_blocks():
        assert "SystemBus" not in block.text and "BusType.SYSTEM" not in block.text, block


# ---------------------------------------------------------------- the runs


def run_command(ga_env, command):
    completed = subprocess.run(
        ["bash", "-c", command.text], stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=EXAMPLE_TIMEOUT, env=ga_env.env, cwd=ga_env.root,
    )
    report = f"{command!r}\nexit {completed.returncode}\nstdout: {completed.stdout}\nstderr: {completed.stderr}"
    if command.expected and command.expected[0].startswith("error "):
        name = command.expected[0][len("error "):].strip()
        assert completed.returncode != 0, f"expected {name}, but it succeeded:\n{report}"
        assert name in completed.stderr, f"expected {name}:\n{report}"
        return
    assert completed.returncode == 0, report
    if command.expected:
        assert completed.stdout.strip() == "\n".join(command.expected), f"the page says it prints:\n" + \
            "\n".join(command.expected) + f"\n{report}"


def assert_visit_over(ga_env, before):
    rc, out, err = ga_env.busctl("get-property", NAME, PATH, IFACE, "SessionActive")
    assert rc == 0 and out.strip() == "b false", (out, err)
    assert ga_env.snapshot() == before, "the examples left keys changed"


@pytest.mark.parametrize("tool", ["busctl", "gdbus"])
def test_shell_examples_in_page_order(ga_env, gad, tool):
    examples = [c for c in sh_commands() if c.tool == tool]
    assert len(examples) >= 8, examples
    before = ga_env.snapshot()
    for command in examples:
        run_command(ga_env, command)
    assert_visit_over(ga_env, before)


def test_python_examples_in_page_order(ga_env, gad):
    examples = python_blocks()
    assert len(examples) >= 8, examples
    before = ga_env.snapshot()
    directory = Path(tempfile.mkdtemp(dir=ga_env.root))
    for block in examples:
        script = directory / f"example-line-{block.line}.py"
        script.write_text(block.text)
        completed = subprocess.run(
            [sys.executable, str(script)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=EXAMPLE_TIMEOUT, env=ga_env.env, cwd=directory,
        )
        assert completed.returncode == 0, (
            f"{block!r} failed (exit {completed.returncode}):\n{block.text}\n"
            f"stdout: {completed.stdout}\nstderr: {completed.stderr}")
    assert_visit_over(ga_env, before)


# ---------------------------------------------------------------- Swift


def swift_setup():
    swiftc = shutil.which("swiftc")
    modules = Path(os.environ.get("GA_SWIFT_MODULES", REPO_ROOT / ".build" / "debug" / "Modules"))
    if swiftc is None:
        pytest.skip("no swiftc on PATH")
    if not (modules / "GuidedAccessClient.swiftmodule").exists():
        pytest.skip(f"no GuidedAccessClient.swiftmodule in {modules}: build first or set GA_SWIFT_MODULES")
    flags = ["-I", str(modules)]
    for module_map in sorted((REPO_ROOT / "Modules").glob("*/module.modulemap")):
        flags += ["-I", str(module_map.parent)]
    cflags = subprocess.run(["pkg-config", "--cflags", "dbus-1", "gio-2.0"], capture_output=True, text=True)
    for flag in cflags.stdout.split():
        flags += ["-Xcc", flag]
    return swiftc, flags


def swift_program(block):
    text = block.text
    prelude = []
    if "import GuidedAccessClient" not in text:
        prelude.append("import GuidedAccessClient")
    if re.search(r"\bguidedAccess\b", text) and "let guidedAccess" not in text:
        prelude.append("let guidedAccess = try await GuidedAccessClient.connect()")
    return "\n".join(prelude) + "\n" + text


@pytest.mark.parametrize("block", swift_blocks(), ids=lambda block: f"line{block.line}")
def test_swift_example_type_checks(block, tmp_path):
    swiftc, flags = swift_setup()
    source = tmp_path / "main.swift"
    source.write_text(swift_program(block))
    completed = subprocess.run(
        [swiftc, "-typecheck", *flags, str(source)], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0 and "error:" not in completed.stderr, (
        f"{block!r} does not type-check against GuidedAccessClient:\n{source.read_text()}\n{completed.stderr}")
