"""The interface XML installed in /usr/share/dbus-1/interfaces/
(docs/org.guidedaccess.GuidedAccess1.xml) is the interface the service
serves: the committed copy, `guidedaccessd --print-introspection` and a
running service's Introspect reply (read with gdbus, a client we did not
write) carry the same interface element, documentation included, and
gdbus-codegen builds bindings with that documentation from it.
Reference: docs/dbus-api.md."""

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from gadaemon import DAEMON_BINARY, IFACE, PATH, REPO_ROOT

COMMITTED = REPO_ROOT / "docs" / f"{IFACE}.xml"
DOC = "org.gtk.GDBus.DocString"
REGENERATE = f"regenerate it: {DAEMON_BINARY} --print-introspection > {COMMITTED}"


def _interface(xml_text):
    """The service's interface element, parsed (the DOCTYPE is skipped)."""
    root = ET.fromstring(xml_text[xml_text.index("<node"):])
    found = [i for i in root.findall("interface") if i.get("name") == IFACE]
    assert len(found) == 1, f"{IFACE} appears {len(found)} times in:\n{xml_text[:2000]}"
    return found[0]


def _interface_names(xml_text):
    return {i.get("name") for i in ET.fromstring(xml_text[xml_text.index("<node"):]).findall("interface")}


def _canonical(element):
    return ET.canonicalize(ET.tostring(element, encoding="unicode"), strip_text=True)


def _printed():
    result = subprocess.run([str(DAEMON_BINARY), "--print-introspection"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_committed_copy_is_what_the_binary_prints():
    assert _printed() == COMMITTED.read_text(), f"{COMMITTED} is out of date; {REGENERATE}"


def test_committed_copy_is_what_the_service_serves(ga_env, gad):
    rc, out, err = ga_env.run(["gdbus", "introspect", "--address", ga_env.address, "--dest", IFACE,
                               "--object-path", PATH, "--xml"])
    assert rc == 0, err
    served = _interface(out)
    assert _canonical(served) == _canonical(_interface(COMMITTED.read_text())), f"served:\n{out}"
    # The standard interfaces are on the object, not in the installed file.
    assert {"org.freedesktop.DBus.Properties", "org.freedesktop.DBus.Introspectable"} <= _interface_names(out)
    assert _interface_names(COMMITTED.read_text()) == {IFACE}


def test_every_member_is_documented():
    interface = _interface(COMMITTED.read_text())
    undocumented = [
        f"{element.tag} {element.get('name') or IFACE}"
        for element in [interface, *interface.findall("method"), *interface.findall("property"),
                        *interface.findall("signal")]
        if not any(a.get("name") == DOC and a.get("value", "").strip() for a in element.findall("annotation"))
    ]
    assert undocumented == []


def test_gdbus_codegen_carries_the_documentation(tmp_path):
    """What an integrator does with the installed file: C bindings whose
    gtk-doc comments are the interface's documentation."""
    result = subprocess.run(
        ["gdbus-codegen", "--interface-prefix", "org.guidedaccess.", "--c-namespace", "Ga",
         "--generate-c-code", str(tmp_path / "ga"), "--generate-docbook", str(tmp_path / "doc"), str(COMMITTED)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    header = (tmp_path / "ga.h").read_text()
    assert "ga_guided_access1_call_configure_for_session" in header
    assert "ga_guided_access1_get_supported_features" in header
    docbook = (tmp_path / f"doc-{IFACE}.xml").read_text()
    text = _interface(COMMITTED.read_text())
    start = next(a.get("value") for m in text.findall("method") if m.get("name") == "StartSession"
                 for a in m.findall("annotation") if a.get("name") == DOC)
    # DocBook output reflows the text; its first words are enough.
    assert " ".join(start.split()[:6]) in " ".join(docbook.split())


def test_committed_agent_interface_is_what_the_binary_prints():
    """(1.2) The session agent's interface, installed beside the service's:
    docs/org.guidedaccess.Agent1.xml is `guidedaccessd
    --print-agent-introspection`, and every member is documented."""
    committed = REPO_ROOT / "docs" / "org.guidedaccess.Agent1.xml"
    result = subprocess.run([str(DAEMON_BINARY), "--print-agent-introspection"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout == committed.read_text(), (
        f"{committed} is out of date; regenerate it: {DAEMON_BINARY} --print-agent-introspection > {committed}")
    root = ET.fromstring(result.stdout[result.stdout.index("<node"):])
    [interface] = root.findall("interface")
    assert interface.get("name") == "org.guidedaccess.Agent1"
    undocumented = [
        f"{element.tag} {element.get('name')}"
        for element in [interface, *interface.findall("method"), *interface.findall("property")]
        if not any(a.get("name") == DOC and a.get("value", "").strip() for a in element.findall("annotation"))
    ]
    assert undocumented == []


@pytest.mark.parametrize("name", [IFACE, "org.guidedaccess.Agent1"])
def test_qdbusxml2cpp_makes_a_qt_proxy_from_the_installed_xml_as_it_is(name, tmp_path):
    """Qt 5's qdbusxml2cpp stops (or crashes) at a type it does not know
    unless the XML names its Qt type (org.qtproject.QtDBus.QtTypeName): the
    installed files name them, for method arguments, properties and signal
    arguments alike. scripts/install-deps installs qtbase5-dev-tools."""
    tool = shutil.which("qdbusxml2cpp") or "/usr/lib/qt5/bin/qdbusxml2cpp"
    if not os.path.exists(tool):
        pytest.skip("qdbusxml2cpp is not installed (qtbase5-dev-tools; scripts/install-deps installs it)")
    result = subprocess.run([tool, "-p", "proxy", str(REPO_ROOT / "docs" / f"{name}.xml")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr, f"qdbusxml2cpp exited {result.returncode}: {result.stderr}"
    assert "QDBusPendingReply" in (tmp_path / "proxy.h").read_text()
