"""guidedaccessd: sessions — start, end and restore, owners and take-over,
authorization, time limits, properties and signal order.
Contract: docs/dbus-api.md, docs/settings-mapping.md."""

import re
import time

import dbus
import pytest

from gadaemon import (
    assert_keys,
    A11Y_APPS, A11Y_IFACE, DBUS_ERROR, DESKTOP_IFACE, FEATURES, GA_ERROR, IFACE, KEY_PATHS, MAGNIFIER, NOBODY, P,
    PROPERTIES, busctl_features, busctl_options, expected_values, pump,
)

UNSET = {path: None for path in KEY_PATHS}


def start(rec, **options):
    rec.call("StartSession", "a{sv}", (dbus.Dictionary(options, signature="sv"),))


def configure(rec, features, enabled):
    rec.call("ConfigureForSession", "asb", (dbus.Array(features, signature="s"), enabled))


def gdbus_error(stderr):
    match = re.search(r"GDBus\.Error:([A-Za-z0-9_.]+): (.*)", stderr)
    assert match, f"no D-Bus error in gdbus output: {stderr!r}"
    return match.group(1), match.group(2)


def ok(result):
    rc, out, err = result
    assert rc == 0, err
    return out


def merged_changes(events):
    changed = {}
    for event in events:
        if event[0] == "PropertiesChanged":
            changed.update(event[1])
    return changed


def assert_properties_then_session_changed_then_reply(events, member, changes, session_changed):
    """events: PropertiesChanged (one or more, together carrying exactly
    `changes`), then SessionChanged, then the reply — nothing else."""
    kinds = [e[0] for e in events]
    assert kinds[-1] == "reply", f"{member} did not succeed: {events}"
    assert kinds[-2:] == ["SessionChanged", "reply"] and set(kinds[:-2]) == {"PropertiesChanged"}, (
        f"expected PropertiesChanged..., SessionChanged, reply; got {events}")
    assert events[-2] == session_changed
    assert merged_changes(events) == changes
    assert all(e[2] == [] for e in events[:-2]), events


# ---------------------------------------------------------------- start, end, restore


def test_properties_outside_a_session(ga_env, gad, rec):
    props = rec.props()
    assert {k: props[k] for k in ("SessionActive", "SessionOwner", "SessionDeadline", "EnabledFeatures")} == {
        "SessionActive": False, "SessionOwner": "", "SessionDeadline": 0, "EnabledFeatures": []}


def test_start_session_without_features_changes_no_key(ga_env, gad, rec):
    start(rec)
    assert rec.prop("SessionActive") is True
    assert_keys(ga_env.snapshot(), UNSET)


def test_session_owner_is_the_callers_unique_name(ga_env, gad, rec):
    start(rec)
    assert rec.prop("SessionOwner") == rec.unique_name


def test_configure_outside_a_session_is_not_in_session_and_changes_no_key(ga_env, gad, rec):
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")
    before = ga_env.snapshot()
    name, message = rec.error("ConfigureForSession", "asb", (["zoom"], True))
    assert name == GA_ERROR + "NotInSession", message
    assert_keys(ga_env.snapshot(), before)
    assert rec.prop("EnabledFeatures") == []


def test_end_session_outside_a_session_is_not_in_session(ga_env, gad, rec):
    name, message = rec.error("EndSession")
    assert name == GA_ERROR + "NotInSession", message


def test_end_session_unsets_keys_that_were_unset_before(ga_env, gad, rec):
    start(rec, features=dbus.Array(FEATURES, signature="s"))
    assert ga_env.snapshot() != UNSET
    rec.call("EndSession")
    assert_keys(ga_env.snapshot(), UNSET)  # dconf read prints nothing for each


def test_end_session_puts_back_values_the_user_set_before(ga_env, gad, rec):
    ga_env.gsettings_set(MAGNIFIER, "mag-factor", "3.0")
    ga_env.gsettings_set(DESKTOP_IFACE, "enable-animations", "true")     # set to its default: still "set"
    ga_env.gsettings_set(DESKTOP_IFACE, "text-scaling-factor", "1.25")
    ga_env.gsettings_set(A11Y_APPS, "screen-reader-enabled", "false")
    before = ga_env.snapshot()
    assert before[P(MAGNIFIER, "mag-factor")] == 3.0
    start(rec, features=dbus.Array(FEATURES, signature="s"))
    during = ga_env.snapshot()
    assert_keys(during, {**before, **expected_values(FEATURES)})
    rec.call("EndSession")
    after = ga_env.snapshot()
    assert_keys(after, before)
    assert ga_env.gsettings_get(MAGNIFIER, "mag-factor") == 3.0


def test_end_session_leaves_alone_keys_the_session_never_wrote(ga_env, gad, rec):
    start(rec, features=dbus.Array(["zoom"], signature="s"))
    # The user (or anything else) changes a key the session does not hold.
    ga_env.gsettings_set(A11Y_IFACE, "high-contrast", "true")
    rec.call("EndSession")
    assert_keys(ga_env.snapshot(), {**UNSET, P(A11Y_IFACE, "high-contrast"): True})


def test_end_session_by_the_owner_makes_properties_idle(ga_env, gad, rec):
    start(rec, features=dbus.Array(["zoom", "grayscale"], signature="s"))
    rec.call("EndSession")
    props = rec.props()
    assert (props["SessionActive"], props["SessionOwner"], props["SessionDeadline"], props["EnabledFeatures"]) == (
        False, "", 0, [])


def test_gdbus_starts_a_session_with_features(ga_env, gad, rec):
    out = ok(ga_env.gdbus_call("StartSession", "{'features': <['zoom']>}"))
    assert out.strip() == "()"
    assert rec.prop("EnabledFeatures") == ["zoom"]
    assert_keys(ga_env.snapshot(), {**UNSET, **expected_values(["zoom"])})


def test_gdbus_ends_a_session_and_restores(ga_env, gad, rec):
    ok(ga_env.gdbus_call("StartSession", "{'features': <['invert-colors', 'large-text']>}"))
    ok(ga_env.gdbus_call("EndSession"))
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)


# ---------------------------------------------------------------- signals and properties


def test_start_session_signals_properties_changed_then_session_changed_before_reply(ga_env, gad, rec):
    rec.clear()
    events = rec.call_recorded("StartSession", "a{sv}", (dbus.Dictionary({}, signature="sv"),))
    assert_properties_then_session_changed_then_reply(
        events, "StartSession", {"SessionActive": True, "SessionOwner": rec.unique_name},
        ("SessionChanged", True, "started"))


def test_start_session_with_features_announces_enabled_features(ga_env, gad, rec):
    rec.clear()
    events = rec.call_recorded("StartSession", "a{sv}", (
        dbus.Dictionary({"features": dbus.Array(["zoom", "grayscale"], signature="s")}, signature="sv"),))
    assert_properties_then_session_changed_then_reply(
        events, "StartSession",
        {"SessionActive": True, "SessionOwner": rec.unique_name, "EnabledFeatures": ["grayscale", "zoom"]},
        ("SessionChanged", True, "started"))


def test_end_session_signals_properties_changed_then_session_changed_ended_before_reply(ga_env, gad, rec):
    start(rec, features=dbus.Array(["zoom"], signature="s"))
    rec.clear()
    events = rec.call_recorded("EndSession")
    assert_properties_then_session_changed_then_reply(
        events, "EndSession", {"SessionActive": False, "SessionOwner": "", "EnabledFeatures": []},
        ("SessionChanged", False, "ended"))


def test_configure_announces_only_enabled_features_before_reply(ga_env, gad, rec):
    start(rec)
    rec.clear()
    events = rec.call_recorded("ConfigureForSession", "asb", (["zoom"], True))
    assert events == [("PropertiesChanged", {"EnabledFeatures": ["zoom"]}, []), ("reply", "ConfigureForSession", [])]


def test_enabled_features_are_sorted(ga_env, gad, rec):
    start(rec)
    configure(rec, ["zoom", "screen-reader", "grayscale", "invert-colors"], True)
    assert rec.prop("EnabledFeatures") == ["grayscale", "invert-colors", "screen-reader", "zoom"]


def test_turning_on_a_feature_that_is_on_emits_nothing_and_changes_no_key(ga_env, gad, rec):
    start(rec, features=dbus.Array(["zoom"], signature="s"))
    before = ga_env.snapshot()
    rec.clear()
    events = rec.call_recorded("ConfigureForSession", "asb", (["zoom"], True))
    rec.settle(0.3)
    assert rec.events == [("reply", "ConfigureForSession", [])], events
    assert_keys(ga_env.snapshot(), before)


def test_turning_off_a_feature_that_is_off_emits_nothing_and_changes_no_key(ga_env, gad, rec):
    start(rec, features=dbus.Array(["zoom"], signature="s"))
    before = ga_env.snapshot()
    rec.clear()
    rec.call_recorded("ConfigureForSession", "asb", (["grayscale"], False))
    rec.settle(0.3)
    assert rec.events == [("reply", "ConfigureForSession", [])]
    assert_keys(ga_env.snapshot(), before)


@pytest.mark.parametrize("prop,value", [
    ("SessionActive", dbus.Boolean(True, variant_level=1)),
    ("EnabledFeatures", dbus.Array(["zoom"], signature="s", variant_level=1)),
    ("Backend", dbus.String("memory", variant_level=1)),
])
def test_properties_are_read_only(ga_env, gad, rec, prop, value):
    name, message = rec.error("Set", "ssv", (IFACE, prop, value), interface=PROPERTIES)
    assert name == DBUS_ERROR + "PropertyReadOnly", message
    assert rec.prop("SessionActive") is False


def test_introspection_declares_the_api(ga_env, gad, rec):
    out = ok(ga_env.busctl("introspect", "org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1", IFACE))
    members = {}
    for line in out.splitlines()[1:]:
        fields = line.split()
        members[fields[0].lstrip(".")] = (fields[1], fields[2], fields[3])
    assert members == {
        "StartSession": ("method", "a{sv}", "-"),
        "EndSession": ("method", "-", "-"),
        "ConfigureForSession": ("method", "asb", "-"),
        "RegisterRestrictions": ("method", "a(sss)", "-"),
        "UnregisterRestrictions": ("method", "as", "-"),
        "SetRestrictionState": ("method", "ss", "-"),
        "GetRestrictionState": ("method", "s", "s"),
        "ListRestrictions": ("method", "-", "a(ssss)"),
        "RegisterAgent": ("method", "-", "-"),
        "PageCall": ("method", "s", "s"),
        "PageLeft": ("method", "sss", "-"),
        "AttachBrowser": ("method", "h", "-"),
        "SessionChanged": ("signal", "bs", "-"),
        "RestrictionChanged": ("signal", "ss", "-"),
        "SessionActive": ("property", "b", "false"),
        "SessionOwner": ("property", "s", '""'),
        "SessionOwnerOrigin": ("property", "s", '""'),
        "SessionDeadline": ("property", "t", "0"),
        "EnabledFeatures": ("property", "as", "0"),
        "SupportedFeatures": ("property", "as", "8"),  # busctl: count, then the items
        "UnsupportedReasons": ("property", "a{ss}", "0"),  # every feature is supported
        "Backend": ("property", "s", '"gsettings"'),
        "Desktop": ("property", "s", '"gnome-shell"'),
        "Agent": ("property", "s", '""'),
        "Version": ("property", "s", members.get("Version", ("", "", ""))[2]),
    }


# ---------------------------------------------------------------- owners, take-over, authorization


def test_session_owner_is_empty_when_the_owner_is_gone(ga_env, gad, rec):
    ok(ga_env.busctl_call("StartSession", *busctl_options()))
    assert rec.prop("SessionActive") is True
    assert rec.prop("SessionOwner") == ""


def test_session_owner_becomes_empty_when_the_owner_leaves(ga_env, gad, rec):
    owner = ga_env.connect(mainloop=False)
    owner.call_blocking("org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1", IFACE,
                        "StartSession", "a{sv}", ({},), timeout=10)
    assert rec.prop("SessionOwner") == str(owner.get_unique_name())
    # StartSession's own signals, queued on the recorder's connection, are
    # taken before the count starts (a busy machine showed them after it).
    rec.settle()
    rec.clear()
    owner.close()
    assert pump(lambda: any(e[0] == "PropertiesChanged" for e in rec.events), 3), "no PropertiesChanged"
    rec.settle()
    assert rec.events == [("PropertiesChanged", {"SessionOwner": ""}, [])]
    assert rec.prop("SessionActive") is True


def test_start_session_by_the_connected_owner_is_session_busy(ga_env, gad, rec):
    start(rec)
    name, message = rec.error("StartSession", "a{sv}", ({},))
    assert name == GA_ERROR + "SessionBusy", message
    assert "change its features with ConfigureForSession, or end it with EndSession" in message, message


def test_start_session_by_another_client_is_session_busy(ga_env, gad, rec, errmon):
    start(rec)
    name, message = errmon.busctl_error(gad, "StartSession", *busctl_options())
    assert name == GA_ERROR + "SessionBusy", message
    assert rec.prop("SessionOwner") == rec.unique_name


def test_configure_by_a_connection_that_is_not_the_owner_is_not_authorized(ga_env, gad, rec, errmon):
    start(rec)  # the owner stays connected, so busctl cannot take over
    before = ga_env.snapshot()
    name, message = errmon.busctl_error(gad, "ConfigureForSession", *busctl_features(["zoom"], True))
    assert name == GA_ERROR + "NotAuthorized", message
    assert_keys(ga_env.snapshot(), before)
    assert rec.prop("EnabledFeatures") == []


def test_start_session_by_another_uid_is_not_authorized(ga_env, gad, rec, errmon):
    name, message = errmon.busctl_error(gad, "StartSession", *busctl_options(features=["zoom"]), prefix=NOBODY)
    assert name == GA_ERROR + "NotAuthorized", message
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)


def test_configure_by_another_uid_is_not_authorized(ga_env, gad, rec, errmon):
    ok(ga_env.busctl_call("StartSession", *busctl_options()))  # owner gone: a take-over would be possible...
    name, message = errmon.busctl_error(gad, "ConfigureForSession", *busctl_features(["zoom"], True), prefix=NOBODY)
    assert name == GA_ERROR + "NotAuthorized", message  # ...but not for another uid
    assert rec.prop("EnabledFeatures") == []
    assert_keys(ga_env.snapshot(), UNSET)


def test_end_session_by_another_uid_is_not_authorized(ga_env, gad, rec, errmon):
    start(rec, features=dbus.Array(["zoom"], signature="s"))
    before = ga_env.snapshot()
    name, message = errmon.busctl_error(gad, "EndSession", prefix=NOBODY)
    assert name == GA_ERROR + "NotAuthorized", message
    assert rec.prop("SessionActive") is True
    assert_keys(ga_env.snapshot(), before)


def test_takeover_configure_by_the_same_identity_succeeds_once_the_owner_is_gone(ga_env, gad, rec):
    ok(ga_env.busctl_call("StartSession", *busctl_options()))
    ok(ga_env.busctl_call("ConfigureForSession", *busctl_features(["zoom", "screen-reader"], True)))
    assert rec.prop("EnabledFeatures") == ["screen-reader", "zoom"]
    assert_keys(ga_env.snapshot(), {**UNSET, **expected_values(["zoom", "screen-reader"])})


def test_takeover_start_session_with_empty_options_resumes(ga_env, gad, rec):
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom"])))
    rec.clear()
    ok(ga_env.busctl_call("StartSession", *busctl_options()))
    rec.settle()
    assert [e for e in rec.events if e[0] == "SessionChanged"] == [("SessionChanged", True, "resumed")]
    assert rec.prop("EnabledFeatures") == ["zoom"]
    assert_keys(ga_env.snapshot(), {**UNSET, **expected_values(["zoom"])})


def test_takeover_start_session_with_options_is_invalid_args(ga_env, gad, rec, errmon):
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["zoom"])))
    before = ga_env.snapshot()
    name, message = errmon.busctl_error(gad, "StartSession", *busctl_options(features=["grayscale"]))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "call StartSession with none to take it over, then ConfigureForSession" in message, message
    assert rec.prop("EnabledFeatures") == ["zoom"]
    assert_keys(ga_env.snapshot(), before)


def test_takeover_end_session_by_the_same_identity_restores(ga_env, gad, rec):
    ok(ga_env.busctl_call("StartSession", *busctl_options(features=["grayscale", "large-text"])))
    ok(ga_env.busctl_call("EndSession"))
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)


def test_takeover_by_another_executable_is_not_authorized(ga_env, gad, rec):
    ok(ga_env.busctl_call("StartSession", *busctl_options()))  # owner: uid 0 running busctl, gone
    rc, out, err = ga_env.gdbus_call("ConfigureForSession", "['zoom']", "true")  # uid 0 running gdbus
    assert rc != 0, out
    name, message = gdbus_error(err)
    assert name == GA_ERROR + "NotAuthorized", message
    assert rec.prop("EnabledFeatures") == []
    assert_keys(ga_env.snapshot(), UNSET)


def test_end_session_by_an_operator_ends_anyones_session(ga_env, gad, rec):
    # In user mode with no [Operators] group the bus's user (root) is an
    # operator: busctl may end the session of a still-connected owner.
    start(rec, features=dbus.Array(["zoom"], signature="s"))
    rec.clear()
    ok(ga_env.busctl_call("EndSession"))
    rec.settle()
    assert rec.prop("SessionActive") is False
    assert ("SessionChanged", False, "ended-by-operator") in rec.events, rec.events
    assert_keys(ga_env.snapshot(), UNSET)


# ---------------------------------------------------------------- time limit


def test_time_limit_ends_the_session_by_itself_and_restores(ga_env, gad, rec):
    start(rec, **{"time-limit": dbus.UInt64(2), "features": dbus.Array(["zoom", "invert-colors"], signature="s")})
    assert ga_env.snapshot() != UNSET
    rec.clear()
    assert rec.wait_for(("SessionChanged", False, "time-limit"), 6), rec.events
    assert rec.prop("SessionActive") is False
    assert_keys(ga_env.snapshot(), UNSET)


def test_time_limit_end_announces_properties_then_session_changed(ga_env, gad, rec):
    start(rec, **{"time-limit": dbus.UInt64(1), "features": dbus.Array(["zoom"], signature="s")})
    rec.clear()
    assert rec.wait_for(("SessionChanged", False, "time-limit"), 5), rec.events
    rec.settle()
    signals = rec.signals()
    assert [e[0] for e in signals] == ["PropertiesChanged"] * (len(signals) - 1) + ["SessionChanged"], signals
    assert merged_changes(signals) == {
        "SessionActive": False, "SessionOwner": "", "SessionDeadline": 0, "EnabledFeatures": []}


def test_time_limit_sets_session_deadline_in_microseconds(ga_env, gad, rec):
    before = time.time()
    start(rec, **{"time-limit": dbus.UInt64(2)})
    after = time.time()
    deadline = rec.prop("SessionDeadline") / 1e6
    assert before + 2 - 0.5 <= deadline <= after + 2 + 0.5, (deadline, before + 2)


def test_time_limit_from_gdbus(ga_env, gad, rec):
    ok(ga_env.gdbus_call("StartSession", "{'time-limit': <uint64 2>, 'features': <['grayscale']>}"))
    assert rec.wait_for(("SessionChanged", False, "time-limit"), 6), rec.events
    assert_keys(ga_env.snapshot(), UNSET)


def test_time_limit_above_31_days_is_invalid_args(ga_env, gad, rec):
    name, message = rec.error("StartSession", "a{sv}", ({"time-limit": dbus.UInt64(2678401)},))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "2678401" in message, message
    assert rec.prop("SessionActive") is False


def test_time_limit_of_31_days_is_accepted(ga_env, gad, rec):
    start(rec, **{"time-limit": dbus.UInt64(2678400)})
    assert rec.prop("SessionActive") is True


OWNER_SCRIPT = """
import dbus, dbus.bus, sys
bus = dbus.bus.BusConnection(sys.argv[1])
bus.call_blocking("org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1",
                  "org.guidedaccess.GuidedAccess1", "StartSession", "a{sv}",
                  ({"features": dbus.Array(["zoom"], signature="s")},), timeout=10)
"""


def test_takeover_makes_the_caller_the_owner(ga_env, gad, rec):
    # The owner: another python3 process of the same uid, which exits; this
    # process (same uid, same executable) takes the session over.
    rc, out, err = ga_env.run(["/usr/bin/python3", "-c", OWNER_SCRIPT, ga_env.address])
    assert rc == 0, err
    assert rec.prop("SessionOwner") == ""
    rec.clear()
    events = rec.call_recorded("ConfigureForSession", "asb", (["grayscale"], True))
    assert merged_changes(events) == {"SessionOwner": rec.unique_name, "EnabledFeatures": ["grayscale", "zoom"]}, events
    assert rec.prop("SessionOwner") == rec.unique_name
