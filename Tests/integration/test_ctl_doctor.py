"""guidedaccessctl doctor against a real guidedaccessd on a private bus:
what the kiosk delivers, feature by feature, and why not where not — the
service's UnsupportedReasons, which are the messages of its
UnsupportedFeature errors; exit status 0 only when the required features
are supported (6 otherwise, 10 without a service).
Contract: docs/dbus-api.md (Properties), guidedaccessctl(1) (doctor)."""

import json
import os
import re

import pytest

from conftest import start_guidedaccessd
from gadaemon import REPO_ROOT, Recorder

CTL = os.environ.get("GUIDEDACCESSCTL", str(REPO_ROOT / ".build" / "debug" / "guidedaccessctl"))

FEATURE = 6
SERVICE_UNAVAILABLE = 10
USAGE = 2
ALL = ["screen-reader", "zoom", "invert-colors", "grayscale", "high-contrast", "large-text", "on-screen-keyboard",
       "reduce-motion"]
REQUIRED = ["screen-reader", "zoom", "invert-colors", "grayscale"]


@pytest.fixture(autouse=True)
def _ctl_built():
    if not os.path.exists(CTL):
        pytest.fail(f"{CTL} does not exist: build it with 'swift build --product guidedaccessctl'", pytrace=False)


def doctor(env, *args):
    return env.run([CTL, "--address", env.address, "doctor", *args])


def start(env, config=None):
    """guidedaccessd on a bare bus (no desktop to detect), or with CONFIG."""
    env.stand_for_no_desktop()
    return start_guidedaccessd(env, config=env.write_config(config) if config else None)


def feature_lines(out):
    """{feature: 'yes' | 'no: REASON'} from the text report."""
    lines = {}
    for line in out.splitlines():
        match = re.match(r"^[* ] ([a-z-]+): +(yes|no: .*)$", line)
        if match and match.group(1) in ALL:
            lines[match.group(1)] = match.group(2)
    return lines


def test_a_bare_bus_delivers_none_of_the_four_and_says_why(ga_env):
    start(ga_env)
    rec = Recorder(ga_env)
    reasons = rec.prop("UnsupportedReasons")
    supported = rec.prop("SupportedFeatures")
    assert rec.prop("Desktop") == "none"
    rc, out, err = doctor(ga_env)
    print(out)
    assert rc == FEATURE, err
    lines = feature_lines(out)
    assert set(lines) == set(ALL), out
    for feature in ALL:
        if feature in supported:
            assert lines[feature] == "yes"
        else:
            # The service's reason, shown without the feature's name in front.
            assert lines[feature] == "no: " + reasons[feature].removeprefix(f"{feature}: "), out
    for feature in REQUIRED:
        assert out.splitlines()[[i for i, line in enumerate(out.splitlines()) if f" {feature}:" in line][0]][0] == "*"
    assert re.search(r"^  desktop: +no +none", out, re.M), out
    assert re.search(r"^  service: +ok +guidedaccessd ", out, re.M), out
    for check in ("display", "orca", "speech-dispatcher", "speech-output-modules", "picom", "xsettingsd",
                  "wvkbd-mobintl", "unit"):
        assert re.search(rf"^  {check}: +(ok|no) ", out, re.M), f"no {check} line:\n{out}"
    last = out.rstrip("\n").splitlines()[-1]
    assert last.startswith("Missing: screen-reader, zoom, invert-colors, grayscale"), last


def test_json_is_the_properties(ga_env):
    start(ga_env)
    rec = Recorder(ga_env)
    props = rec.props()
    rc, out, err = doctor(ga_env, "--json")
    assert rc == FEATURE, err
    report = json.loads(out)
    assert report["desktop"] == props["Desktop"] == "none"
    assert report["mode"] == "user"
    assert report["serviceReachable"] is True
    assert report["backend"] == props["Backend"] and report["version"] == props["Version"]
    assert report["agent"] == props["Agent"] == ""
    assert set(report["features"]) == set(ALL)
    for feature, verdict in report["features"].items():
        assert verdict["supported"] == (feature in props["SupportedFeatures"])
        assert verdict["reason"] == props["UnsupportedReasons"].get(feature), feature
    assert set(props["UnsupportedReasons"]) == set(ALL) - set(props["SupportedFeatures"])
    assert report["required"] == REQUIRED
    assert report["missing"] == [f for f in REQUIRED if f not in props["SupportedFeatures"]]
    assert report["ok"] is False
    names = [check["name"] for check in report["checks"]]
    assert names[0] == "service" and "display" in names and "unit" in names
    assert all(isinstance(c["ok"], bool) and isinstance(c["detail"], str) and c["detail"] for c in report["checks"])
    # No system-mode checks in user mode.
    assert "dconf-profile" not in names and "polkit-policy" not in names


def test_the_memory_backend_delivers_everything(ga_env):
    start(ga_env, "[Service]\nBackend=memory\n")
    rc, out, err = doctor(ga_env)
    assert rc == 0, f"{out}\n{err}"
    assert all(verdict == "yes" for verdict in feature_lines(out).values()), out
    assert out.rstrip("\n").splitlines()[-1].startswith("Missing: nothing"), out
    rc, out, err = doctor(ga_env, "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["ok"] is True and report["missing"] == []
    assert all(v == {"supported": True, "reason": None} for v in report["features"].values()), report["features"]
    assert Recorder(ga_env).prop("UnsupportedReasons") == {}


def test_feature_narrows_the_requirement(ga_env):
    # sway: the settings it acts on are delivered; zoom and the colours are not.
    start(ga_env, "[Service]\nDesktop=sway\n")
    props = Recorder(ga_env).props()
    assert "high-contrast" in props["SupportedFeatures"] and "zoom" not in props["SupportedFeatures"], props
    rc, out, err = doctor(ga_env, "--feature", "high-contrast", "--feature", "reduce-motion")
    assert rc == 0, f"{out}\n{err}"
    assert out.rstrip("\n").splitlines()[-1].startswith("Missing: nothing"), out
    rc, out, err = doctor(ga_env, "--feature", "high-contrast", "--feature", "zoom", "--json")
    assert rc == FEATURE, err
    report = json.loads(out)
    assert report["required"] == ["high-contrast", "zoom"] and report["missing"] == ["zoom"]
    assert report["features"]["zoom"]["reason"] == props["UnsupportedReasons"]["zoom"]
    rc, out, err = doctor(ga_env, "--feature", "no-such-feature")
    assert rc == USAGE and "no-such-feature" in err, err


def test_no_service_is_a_finding(ga_env):
    # A bus without the service (the test's own, guidedaccessd not started),
    # and no bus at all.
    ga_env.stand_for_no_desktop()
    for address in (ga_env.address, f"unix:path={ga_env.root}/no-bus"):
        rc, out, err = ga_env.run([CTL, "--address", address, "doctor"])
        assert rc == SERVICE_UNAVAILABLE, f"{out}\n{err}"
        assert re.search(r"^  service: +no +no answer on the bus at ", out, re.M), out
        assert "no service answered" in out.rstrip("\n").splitlines()[-1], out
        assert all(v.startswith("no: no service answered") for v in feature_lines(out).values()), out
        rc, out, err = ga_env.run([CTL, "--address", address, "doctor", "--json"])
        assert rc == SERVICE_UNAVAILABLE, err
        report = json.loads(out)
        assert report["serviceReachable"] is False and report["serviceError"] and report["ok"] is False
        assert report["missing"] == REQUIRED


def test_unsupported_reasons_are_the_unsupported_feature_messages(ga_env):
    """What the property says for a feature is what a call asking for it is
    told: StartSession and ConfigureForSession."""
    start(ga_env, "[Service]\nDesktop=sway\n")
    rec = Recorder(ga_env)
    reasons = rec.prop("UnsupportedReasons")
    assert set(reasons) == set(ALL) - set(rec.prop("SupportedFeatures"))
    assert reasons, "sway leaves some features unsupported"
    for feature, reason in reasons.items():
        assert reason.startswith(f"{feature}: "), reason
        name, message = rec.error("StartSession", "a{sv}", ({"features": [feature]},))
        assert name == "org.guidedaccess.GuidedAccess1.Error.UnsupportedFeature", (name, message)
        assert message == reason
    rec.call("StartSession", "a{sv}", ({},))
    feature = sorted(reasons)[0]
    name, message = rec.error("ConfigureForSession", "asb", ([feature], True))
    assert name == "org.guidedaccess.GuidedAccess1.Error.UnsupportedFeature"
    assert message == reasons[feature]
    rec.call("EndSession")
    # busctl, a client we did not write, reads the same a{ss}.
    rc, out, err = ga_env.busctl("get-property", "org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                                 "org.guidedaccess.GuidedAccess1", "UnsupportedReasons")
    assert rc == 0, err
    assert out.startswith(f"a{{ss}} {len(reasons)} "), out
