"""guidedaccessd: features and the GSettings keys they write (user mode, real
dconf on a private bus). Keys are read with the real `dconf read` and
compared as whole dicts of every mapped key (None = unset).
Contract: docs/dbus-api.md, docs/settings-mapping.md."""

import pytest

from conftest import start_guidedaccessd
from gadaemon import (
    assert_keys,
    A11Y_APPS, DESKTOP_IFACE, FEATURES, KEY_PATHS, MAGNIFIER, P, Recorder, expected_values,
)

import dbus

UNSET = {path: None for path in KEY_PATHS}


def start(rec, **options):
    rec.call("StartSession", "a{sv}", (dbus.Dictionary(options, signature="sv"),))


def configure(rec, features, enabled):
    rec.call("ConfigureForSession", "asb", (dbus.Array(features, signature="s"), enabled))


def with_values(base, values):
    result = dict(base)
    result.update(values)
    return result


def test_fresh_environment_has_every_mapped_key_unset(ga_env, gad):
    # The baseline the other tests rely on (and proof that the daemon's start
    # writes nothing).
    assert_keys(ga_env.snapshot(), UNSET)


@pytest.mark.parametrize("feature", FEATURES)
def test_feature_on_changes_exactly_its_mapped_keys(ga_env, gad, rec, feature):
    start(rec)
    before = ga_env.snapshot()
    configure(rec, [feature], True)
    assert_keys(ga_env.snapshot(), with_values(before, expected_values([feature])))


@pytest.mark.parametrize("feature", FEATURES)
def test_feature_off_puts_its_keys_back_and_touches_no_other(ga_env, gad, rec, feature):
    start(rec)
    before = ga_env.snapshot()
    configure(rec, [feature], True)
    assert_keys(ga_env.snapshot(), with_values(before, expected_values([feature])))
    configure(rec, [feature], False)
    # The mapping is a pure function of the set of features: with the set
    # empty again, the keys are as they were before the feature went on
    # (here: unset, not written with a default).
    assert_keys(ga_env.snapshot(), before)


def test_invert_colors_off_while_zoom_on_keeps_magnifier_at_zoom_factor(ga_env, gad, rec):
    start(rec, **{"zoom-factor": dbus.Double(4.0)})
    before = ga_env.snapshot()
    configure(rec, ["zoom", "invert-colors"], True)
    configure(rec, ["invert-colors"], False)
    after = ga_env.snapshot()
    assert after[P(MAGNIFIER, "mag-factor")] == 4.0
    assert_keys(after, with_values(before, expected_values(["zoom"], zoom_factor=4.0)))


def test_zoom_off_while_invert_colors_on_keeps_magnifier_at_1(ga_env, gad, rec):
    start(rec, **{"zoom-factor": dbus.Double(4.0)})
    before = ga_env.snapshot()
    configure(rec, ["zoom", "invert-colors"], True)
    configure(rec, ["zoom"], False)
    after = ga_env.snapshot()
    assert after[P(MAGNIFIER, "mag-factor")] == 1.0
    assert_keys(after, with_values(before, expected_values(["invert-colors"])))


def test_zoom_off_while_grayscale_on_keeps_magnifier_at_1(ga_env, gad, rec):
    start(rec)
    before = ga_env.snapshot()
    configure(rec, ["zoom", "grayscale"], True)
    configure(rec, ["zoom"], False)
    assert_keys(ga_env.snapshot(), with_values(before, expected_values(["grayscale"])))


def test_zoom_factor_option_sets_mag_factor(ga_env, gad, rec):
    start(rec, **{"zoom-factor": dbus.Double(6.5), "features": dbus.Array(["zoom"], signature="s")})
    assert_keys(ga_env.snapshot(), with_values(UNSET, expected_values(["zoom"], zoom_factor=6.5)))


def test_text_scale_option_sets_text_scaling_factor(ga_env, gad, rec):
    start(rec, **{"text-scale": dbus.Double(2.25)})
    configure(rec, ["large-text"], True)
    assert ga_env.snapshot()[P(DESKTOP_IFACE, "text-scaling-factor")] == 2.25


def test_start_session_features_option_sets_all_their_keys(ga_env, gad, rec):
    start(rec, features=dbus.Array(FEATURES, signature="s"))
    assert_keys(ga_env.snapshot(), with_values(UNSET, expected_values(FEATURES)))
    assert rec.prop("EnabledFeatures") == FEATURES


def test_keys_are_written_when_the_reply_arrives(ga_env, gad, rec):
    # Read by a separate process right after the reply, with no wait: a
    # caller that got the reply may rely on the setting being in place.
    start(rec)
    configure(rec, ["screen-reader"], True)
    assert ga_env.dconf_read(P(A11Y_APPS, "screen-reader-enabled")) is True


def test_effective_values_seen_by_gsettings(ga_env, gad, rec):
    start(rec, features=dbus.Array(["reduce-motion", "grayscale"], signature="s"))
    assert ga_env.gsettings_get(DESKTOP_IFACE, "enable-animations") is False
    assert ga_env.gsettings_get(MAGNIFIER, "color-saturation") == 0.0
    assert ga_env.gsettings_get(MAGNIFIER, "mag-factor") == 1.0
    assert ga_env.gsettings_get(A11Y_APPS, "screen-magnifier-enabled") is True


def test_supported_features_lists_all_eight_on_gnome_43(ga_env, gad, rec):
    assert rec.prop("SupportedFeatures") == FEATURES


def test_backend_property_is_gsettings(ga_env, gad, rec):
    assert rec.prop("Backend") == "gsettings"


def test_version_property_is_a_version_string(ga_env, gad, rec):
    version = rec.prop("Version")
    assert isinstance(version, str) and version and version[0].isdigit(), version


def test_memory_backend_toggles_features_without_touching_dconf(ga_env):
    config = ga_env.write_config("[Service]\nBackend=memory\n")
    start_guidedaccessd(ga_env, config=config)
    rec = Recorder(ga_env)
    assert rec.prop("Backend") == "memory"
    start(rec, features=dbus.Array(["zoom"], signature="s"))
    configure(rec, ["invert-colors", "screen-reader", "reduce-motion"], True)
    assert rec.prop("EnabledFeatures") == ["invert-colors", "reduce-motion", "screen-reader", "zoom"]
    configure(rec, ["zoom"], False)
    assert rec.prop("EnabledFeatures") == ["invert-colors", "reduce-motion", "screen-reader"]
    assert_keys(ga_env.snapshot(), UNSET)
    rec.call("EndSession")
    assert rec.prop("EnabledFeatures") == []
    assert_keys(ga_env.snapshot(), UNSET)
