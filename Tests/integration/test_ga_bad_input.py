"""guidedaccessd: bad input gets a clear error naming the offending value,
changes nothing, and the service stays up (Ping afterwards).
Contract: docs/dbus-api.md (Errors, Error order)."""

import dbus
import pytest

from gadaemon import (
    DBUS_ERROR, GA_ERROR, IFACE, KEY_PATHS, NOBODY, PEER, PROPERTIES, assert_keys, busctl_features, busctl_options,
)

UNSET = {path: None for path in KEY_PATHS}


def start(rec, **options):
    rec.call("StartSession", "a{sv}", (dbus.Dictionary(options, signature="sv"),))


def assert_alive_and_unchanged(ga_env, gad, rec, session_active):
    assert gad.alive(), "guidedaccessd died"
    rec.call("Ping", interface=PEER)
    assert rec.prop("SessionActive") is session_active
    assert_keys(ga_env.snapshot(), UNSET)


@pytest.mark.parametrize("member,args", [
    ("ConfigureForSession", ["s", "zoom"]),
    ("ConfigureForSession", ["bas", "true", "1", "zoom"]),
    ("StartSession", ["s", "features"]),
    ("StartSession", ["a{ss}", "1", "features", "zoom"]),
    ("RegisterRestrictions", ["a(ss)", "1", "a.b", "T"]),
    ("SetRestrictionState", ["s", "a.b"]),
    ("GetRestrictionState", ["u", "7"]),
    ("EndSession", ["s", "now"]),
], ids=lambda v: v if isinstance(v, str) else v[0])
def test_wrong_signature_from_busctl_is_invalid_args(ga_env, gad, rec, errmon, member, args):
    name, message = errmon.busctl_error(gad, member, *args)
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert args[0] in message, f"the message does not name the signature sent ({args[0]}): {message}"
    assert_alive_and_unchanged(ga_env, gad, rec, False)


def test_unknown_feature_is_unknown_feature_naming_it(ga_env, gad, rec):
    start(rec)
    name, message = rec.error("ConfigureForSession", "asb", (["zoom", "warp-drive"], True))
    assert name == GA_ERROR + "UnknownFeature", message
    assert "warp-drive" in message, message
    assert rec.prop("EnabledFeatures") == []  # all or nothing
    assert_alive_and_unchanged(ga_env, gad, rec, True)


def test_unknown_feature_in_start_session_starts_no_session(ga_env, gad, rec):
    name, message = rec.error("StartSession", "a{sv}", ({"features": dbus.Array(["zoom", "Zoom"], signature="s")},))
    assert name == GA_ERROR + "UnknownFeature", message
    assert "Zoom" in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, False)


def test_unknown_feature_from_busctl_is_unknown_feature(ga_env, gad, rec, errmon):
    name, message = errmon.busctl_error(gad, "StartSession", *busctl_options(features=["telepathy"]))
    assert name == GA_ERROR + "UnknownFeature", message
    assert "telepathy" in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, False)


def test_unknown_option_key_is_invalid_args_naming_it(ga_env, gad, rec):
    name, message = rec.error("StartSession", "a{sv}", ({"color": dbus.String("red")},))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "color" in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, False)


@pytest.mark.parametrize("key,value", [
    ("time-limit", dbus.String("2")),
    ("time-limit", dbus.Int32(2)),
    ("features", dbus.String("zoom")),
    ("zoom-factor", dbus.Int32(4)),
    ("inhibit-sleep", dbus.String("yes")),
], ids=["time-limit-s", "time-limit-i", "features-s", "zoom-factor-i", "inhibit-sleep-s"])
def test_option_of_the_wrong_type_is_invalid_args_naming_it(ga_env, gad, rec, key, value):
    name, message = rec.error("StartSession", "a{sv}", ({key: value},))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert key in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, False)


@pytest.mark.parametrize("key,value,shown", [
    ("zoom-factor", 40.0, "40"),
    ("zoom-factor", 0.5, "0.5"),
    ("text-scale", 3.5, "3.5"),
    ("text-scale", 0.9, "0.9"),
], ids=["zoom-40", "zoom-0.5", "text-3.5", "text-0.9"])
def test_out_of_range_factor_is_invalid_args_naming_it(ga_env, gad, rec, key, value, shown):
    name, message = rec.error("StartSession", "a{sv}", ({key: dbus.Double(value),
                                                         "features": dbus.Array(["zoom", "large-text"], signature="s")},))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert shown in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, False)


@pytest.mark.parametrize("key,value,shown", [
    ("zoom-factor", float("nan"), "nan"),
    ("zoom-factor", float("inf"), "inf"),
    ("text-scale", float("-inf"), "-inf"),
    ("time-limit", dbus.UInt64(2678401), "2678401"),
    ("time-limit", dbus.UInt64(2**64 - 1), str(2**64 - 1)),
], ids=["zoom-nan", "zoom-inf", "text-minus-inf", "time-limit-31-days-and-1-s", "time-limit-max"])
def test_a_number_that_is_no_number_or_out_of_range_is_invalid_args_naming_it(ga_env, gad, rec, key, value, shown):
    if isinstance(value, float):
        value = dbus.Double(value)
    name, message = rec.error("StartSession", "a{sv}", ({key: value,
                                                         "features": dbus.Array(["zoom", "large-text"], signature="s")},))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert key in message and shown in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, False)


def nested_arrays(depth):
    value, signature = dbus.UInt64(0), "t"
    for _ in range(depth):
        value, signature = dbus.Array([value], signature=signature), "a" + signature
    return value


def wide_arrays(width, depth):
    value, signature = "zoom", "s"
    for _ in range(depth):
        value, signature = dbus.Array([value] * width, signature=signature), "a" + signature
    return value


@pytest.mark.parametrize("key,make,named", [
    # Variants in variants, as deep as libdbus lets a message go.
    ("features", lambda: dbus.Array(["zoom"], signature="s", variant_level=60), "features"),
    ("time-limit", lambda: nested_arrays(30), "time-limit"),
    # Three at each of 5 levels: 363 values, more than options may hold.
    ("features", lambda: wide_arrays(3, 5), "64"),
], ids=["variants-60-deep", "arrays-30-deep", "3-wide-5-deep"])
def test_deeply_nested_options_are_invalid_args_and_the_service_stays_up(ga_env, gad, rec, key, make, named):
    name, message = rec.error("StartSession", "a{sv}", (dbus.Dictionary({key: make()}, signature="sv"),))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert named in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, False)


def test_zoom_factor_40_from_gdbus_is_invalid_args(ga_env, gad, rec):
    rc, out, err = ga_env.gdbus_call("StartSession", "{'zoom-factor': <40.0>, 'features': <['zoom']>}")
    assert rc != 0, out
    assert "GDBus.Error:org.freedesktop.DBus.Error.InvalidArgs" in err, err
    assert "40" in err.split("InvalidArgs", 1)[1], err
    assert_alive_and_unchanged(ga_env, gad, rec, False)


def test_empty_feature_list_is_invalid_args(ga_env, gad, rec):
    start(rec)
    name, message = rec.error("ConfigureForSession", "asb", (dbus.Array([], signature="s"), True))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert_alive_and_unchanged(ga_env, gad, rec, True)


def test_error_order_unknown_feature_before_not_in_session(ga_env, gad, rec):
    name, message = rec.error("ConfigureForSession", "asb", (["warp-drive"], True))
    assert name == GA_ERROR + "UnknownFeature", message


def test_error_order_arguments_before_authorization(ga_env, gad, rec, errmon):
    name, message = errmon.busctl_error(gad, "ConfigureForSession", *busctl_features(["warp-drive"], True),
                                        prefix=NOBODY)
    assert name == GA_ERROR + "UnknownFeature", message


def test_error_order_authorization_before_session_state(ga_env, gad, rec, errmon):
    name, message = errmon.busctl_error(gad, "ConfigureForSession", *busctl_features(["zoom"], True), prefix=NOBODY)
    assert name == GA_ERROR + "NotAuthorized", message  # not NotInSession


def test_unknown_method_is_unknown_method(ga_env, gad, rec):
    name, message = rec.error("StopEverything")
    assert name == DBUS_ERROR + "UnknownMethod", message
    assert_alive_and_unchanged(ga_env, gad, rec, False)


def test_unknown_property_is_unknown_property(ga_env, gad, rec):
    name, message = rec.error("Get", "ss", (IFACE, "Passcode"), interface=PROPERTIES)
    assert name == DBUS_ERROR + "UnknownProperty", message
    assert "Passcode" in message, message


def test_oversized_identifiers_in_many_calls_leave_the_service_up(ga_env, gad, rec):
    for size in (256, 1000, 10000, 100000):
        name, message = rec.error("RegisterRestrictions", "a(sss)", ([("x" * size, "T", "")],))
        assert name == DBUS_ERROR + "InvalidArgs", (size, message)
        name, message = rec.error("GetRestrictionState", "s", ("x" * size,))
        assert name in (GA_ERROR + "UnknownRestriction", DBUS_ERROR + "InvalidArgs"), (size, message)
    assert_alive_and_unchanged(ga_env, gad, rec, False)


@pytest.mark.parametrize("member", ["ConfigureForSession", "StartSession"])
def test_a_feature_named_twice_is_invalid_args_naming_it(ga_env, gad, rec, member):
    if member == "ConfigureForSession":
        start(rec)
        name, message = rec.error(member, "asb", (["zoom", "grayscale", "zoom"], True))
    else:
        name, message = rec.error(member, "a{sv}", ({"features": dbus.Array(["zoom", "zoom"], signature="s")},))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "'zoom'" in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, member == "ConfigureForSession")


def test_more_features_than_there_are_is_invalid_args_naming_the_count_and_the_bound(ga_env, gad, rec):
    start(rec)
    name, message = rec.error("ConfigureForSession", "asb", (["zoom"] * 9, True))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "'features'" in message and "9" in message and "8" in message, message
    assert_alive_and_unchanged(ga_env, gad, rec, True)


# An unadmitted caller (nobody) sends a list of features of MEGABYTES (its
# wire size, 12 bytes a name): as StartSession's option, or as the value of a
# read-only property (Properties.Set).
HUGE_CALL = """
import sys, dbus, dbus.bus
address, megabytes, member, name, path, interface = sys.argv[1:]
names = ["zoom"] * (int(megabytes) * 1000000 // 12)
bus = dbus.bus.BusConnection(address)
try:
    if member == "StartSession":
        bus.call_blocking(name, path, interface, member, "a{sv}",
                          ({"features": dbus.Array(names, signature="s")},), timeout=60)
    else:
        bus.call_blocking(name, path, "org.freedesktop.DBus.Properties", member, "ssv",
                          (interface, "Version", dbus.Array(names, signature="s", variant_level=1)), timeout=60)
except dbus.exceptions.DBusException as error:
    print(error.get_dbus_name())
    print(error.get_dbus_message())
"""


def memory_mib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.parametrize("member,megabytes,error,named", [
    ("StartSession", 9, "InvalidArgs", "'options'"),
    ("StartSession", 30, "InvalidArgs", "'options'"),
    ("Set", 30, "PropertyReadOnly", "Version"),
], ids=["StartSession-9MB", "StartSession-30MB", "Set-30MB"])
def test_a_huge_call_is_refused_before_decoding_and_its_memory_comes_back(ga_env, gad, rec, member, megabytes,
                                                                          error, named):
    import time

    from gadaemon import IFACE, NAME, PATH

    pid = gad.process.pid
    rec.call("Ping", interface=PEER)
    before, peak_before = memory_mib(pid, "VmRSS"), memory_mib(pid, "VmHWM")
    # Twice: glibc gives the first large block back whatever it is tuned to,
    # and keeps later ones in its heap unless it is.
    for call in (1, 2):
        rc, out, err = ga_env.run(["/usr/bin/python3", "-c", HUGE_CALL, ga_env.address, str(megabytes), member,
                                   NAME, PATH, IFACE], prefix=NOBODY, timeout=120)
        assert rc == 0, err
        name, message = out.splitlines()[:2]
        assert name == DBUS_ERROR + error, out
        assert named in message, message
        rec.call("Ping", interface=PEER)
        # libdbus holds the message while it is handled, with its read
        # buffer: under twice its size. Decoding it would take several times more.
        peak = memory_mib(pid, "VmHWM")
        assert peak - peak_before < 3 * megabytes, f"VmHWM {peak_before:.1f} MiB before, {peak:.1f} MiB after"
        deadline = time.monotonic() + 2
        while memory_mib(pid, "VmRSS") - before >= 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = memory_mib(pid, "VmRSS")
        assert after - before < 4, f"VmRSS {before:.1f} MiB before, {after:.1f} MiB after {megabytes} MB call {call}"
    assert_alive_and_unchanged(ga_env, gad, rec, False)
