"""guidedaccessd: custom restrictions (RegisterRestrictions,
UnregisterRestrictions, SetRestrictionState, GetRestrictionState,
ListRestrictions), their limits and their reset at the end of a session.
Contract: docs/dbus-api.md."""

import dbus
import pytest

from gadaemon import DBUS_ERROR, GA_ERROR, NOBODY, PEER, Recorder, busctl_options

SAMPLE = [
    ("org.example.kiosk.print", "Printing", "The print button"),
    ("com.example.app.buy", "Buying", ""),
    ("net.example.a-b_c.9", "Other", "Detail text"),
]


def restrictions(entries):
    return dbus.Array([dbus.Struct(e, signature="sss") for e in entries], signature="(sss)")


def register(rec, entries):
    rec.call("RegisterRestrictions", "a(sss)", (restrictions(entries),))


def listed(rec):
    return [tuple(r) for r in rec.call("ListRestrictions")]


def start(rec):
    rec.call("StartSession", "a{sv}", (dbus.Dictionary({}, signature="sv"),))


def alive(rec):
    rec.call("Ping", interface=PEER)
    return True


def test_list_restrictions_is_sorted_by_identifier_and_all_allow(ga_env, gad, rec):
    register(rec, SAMPLE)
    assert listed(rec) == sorted((i, t, d, "allow") for i, t, d in SAMPLE)


def test_busctl_registers_restrictions(ga_env, gad, rec):
    rc, out, err = ga_env.busctl_call("RegisterRestrictions", "a(sss)", "2", "b.two", "Two", "", "a.one", "One", "d")
    assert rc == 0, err
    rc, out, err = ga_env.busctl_call("ListRestrictions")
    assert rc == 0, err
    assert out.strip() == 'a(ssss) 2 "a.one" "One" "d" "allow" "b.two" "Two" "" "allow"'


def test_registering_again_updates_texts_and_keeps_state(ga_env, gad, rec):
    register(rec, SAMPLE)
    start(rec)
    rec.call("SetRestrictionState", "ss", ("com.example.app.buy", "deny"))
    register(rec, [("com.example.app.buy", "Purchases", "new detail")])
    assert ("com.example.app.buy", "Purchases", "new detail", "deny") in listed(rec)
    assert len(listed(rec)) == 3


def test_set_restriction_state_emits_restriction_changed_before_reply(ga_env, gad, rec):
    register(rec, SAMPLE)
    start(rec)
    rec.clear()
    events = rec.call_recorded("SetRestrictionState", "ss", ("com.example.app.buy", "deny"))
    assert events == [("RestrictionChanged", "com.example.app.buy", "deny"), ("reply", "SetRestrictionState", [])]


def test_get_restriction_state_reports_the_state_set(ga_env, gad, rec):
    register(rec, SAMPLE)
    start(rec)
    rec.call("SetRestrictionState", "ss", ("org.example.kiosk.print", "deny"))
    assert rec.call("GetRestrictionState", "s", ("org.example.kiosk.print",)) == "deny"
    assert rec.call("GetRestrictionState", "s", ("com.example.app.buy",)) == "allow"
    assert ("org.example.kiosk.print", "Printing", "The print button", "deny") in listed(rec)


def test_setting_the_same_state_again_emits_nothing(ga_env, gad, rec):
    register(rec, SAMPLE)
    start(rec)
    rec.call("SetRestrictionState", "ss", ("com.example.app.buy", "deny"))
    rec.clear()
    rec.call_recorded("SetRestrictionState", "ss", ("com.example.app.buy", "deny"))
    rec.settle(0.3)
    assert rec.events == [("reply", "SetRestrictionState", [])]


def test_end_session_resets_denied_restrictions_then_properties_then_session_changed(ga_env, gad, rec):
    register(rec, SAMPLE)
    start(rec)
    rec.call("SetRestrictionState", "ss", ("org.example.kiosk.print", "deny"))
    rec.call("SetRestrictionState", "ss", ("net.example.a-b_c.9", "deny"))
    rec.call("SetRestrictionState", "ss", ("com.example.app.buy", "allow"))  # no change
    rec.clear()
    events = rec.call_recorded("EndSession")
    kinds = [e[0] for e in events]
    assert kinds == ["RestrictionChanged", "RestrictionChanged", "PropertiesChanged", "SessionChanged", "reply"], events
    assert sorted(events[:2]) == [("RestrictionChanged", "net.example.a-b_c.9", "allow"),
                                  ("RestrictionChanged", "org.example.kiosk.print", "allow")]
    assert events[2] == ("PropertiesChanged", {"SessionActive": False, "SessionOwner": ""}, [])
    assert events[3] == ("SessionChanged", False, "ended")
    assert [r[3] for r in listed(rec)] == ["allow"] * 3


def test_the_reset_of_an_ended_session_never_follows_the_next_sessions_deny(ga_env, gad, rec):
    # EndSession, StartSession and SetRestrictionState pipelined on one
    # connection: the end's "allow" resets go out before the new session's
    # "deny", so the last signal tells the state there is.
    from gadaemon import pump

    register(rec, SAMPLE[:1])
    start(rec)
    rec.call("SetRestrictionState", "ss", (SAMPLE[0][0], "deny"))
    rec.clear()
    rec.call_async("EndSession")
    rec.call_async("StartSession", "a{sv}", (dbus.Dictionary({}, signature="sv"),))
    rec.call_async("SetRestrictionState", "ss", (SAMPLE[0][0], "deny"))
    replies = lambda: [e[:2] for e in rec.events if e[0] in ("reply", "error")]  # noqa: E731
    assert pump(lambda: len(replies()) == 3, 10), rec.events
    assert sorted(replies()) == [("reply", "EndSession"), ("reply", "SetRestrictionState"), ("reply", "StartSession")]
    rec.settle(0.3)
    changes = [e for e in rec.events if e[0] == "RestrictionChanged"]
    assert changes == [("RestrictionChanged", SAMPLE[0][0], "allow"), ("RestrictionChanged", SAMPLE[0][0], "deny")]
    assert rec.call("GetRestrictionState", "s", (SAMPLE[0][0],)) == "deny"


def test_restriction_state_is_allow_outside_a_session(ga_env, gad, rec):
    register(rec, SAMPLE)
    start(rec)
    rec.call("SetRestrictionState", "ss", ("com.example.app.buy", "deny"))
    rec.call("EndSession")
    assert rec.call("GetRestrictionState", "s", ("com.example.app.buy",)) == "allow"


def test_set_restriction_state_outside_a_session_is_not_in_session(ga_env, gad, rec):
    register(rec, SAMPLE)
    name, message = rec.error("SetRestrictionState", "ss", ("com.example.app.buy", "deny"))
    assert name == GA_ERROR + "NotInSession", message
    assert rec.call("GetRestrictionState", "s", ("com.example.app.buy",)) == "allow"


def test_set_restriction_state_to_an_unknown_state_is_invalid_args(ga_env, gad, rec):
    register(rec, SAMPLE)
    start(rec)
    name, message = rec.error("SetRestrictionState", "ss", ("com.example.app.buy", "maybe"))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "maybe" in message, message


def test_get_state_of_an_unknown_restriction_is_unknown_restriction(ga_env, gad, rec):
    name, message = rec.error("GetRestrictionState", "s", ("org.example.nothing",))
    assert name == GA_ERROR + "UnknownRestriction", message
    assert "org.example.nothing" in message, message


def test_set_state_of_an_unknown_restriction_is_unknown_restriction(ga_env, gad, rec):
    start(rec)
    name, message = rec.error("SetRestrictionState", "ss", ("org.example.nothing", "deny"))
    assert name == GA_ERROR + "UnknownRestriction", message
    assert "org.example.nothing" in message, message


def test_set_restriction_state_by_another_uid_is_not_authorized(ga_env, gad, rec, errmon):
    register(rec, SAMPLE)
    start(rec)
    name, message = errmon.busctl_error(gad, "SetRestrictionState", "ss", "com.example.app.buy", "deny", prefix=NOBODY)
    assert name == GA_ERROR + "NotAuthorized", message
    assert rec.call("GetRestrictionState", "s", ("com.example.app.buy",)) == "allow"


def test_register_restrictions_by_another_uid_is_not_authorized(ga_env, gad, rec, errmon):
    name, message = errmon.busctl_error(gad, "RegisterRestrictions", "a(sss)", "1", "a.b", "T", "", prefix=NOBODY)
    assert name == GA_ERROR + "NotAuthorized", message
    assert listed(rec) == []


def test_unregister_removes_the_batch_without_a_signal(ga_env, gad, rec):
    register(rec, SAMPLE)
    rec.clear()
    rec.call("UnregisterRestrictions", "as", (["com.example.app.buy", "org.example.kiosk.print"],))
    rec.settle(0.3)
    assert rec.signals() == []
    assert [r[0] for r in listed(rec)] == ["net.example.a-b_c.9"]


def test_unregister_with_an_unknown_identifier_removes_none(ga_env, gad, rec):
    register(rec, SAMPLE)
    name, message = rec.error("UnregisterRestrictions", "as", (["com.example.app.buy", "org.example.nothing"],))
    assert name == GA_ERROR + "UnknownRestriction", message
    assert "org.example.nothing" in message, message
    assert len(listed(rec)) == 3


def test_unregister_naming_an_identifier_twice_is_invalid_args_naming_it_and_removes_none(ga_env, gad, rec):
    register(rec, SAMPLE)
    name, message = rec.error("UnregisterRestrictions", "as",
                              (["org.example.kiosk.print", "com.example.app.buy", "org.example.kiosk.print"],))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "'org.example.kiosk.print'" in message, message
    assert len(listed(rec)) == 3


def test_unregister_with_100000_copies_of_one_identifier_is_invalid_args_before_decoding(ga_env, gad, rec):
    register(rec, SAMPLE)
    name, message = rec.error("UnregisterRestrictions", "as",
                              (dbus.Array(["com.example.app.buy"] * 100000, signature="s"),))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "'identifiers'" in message and "100000" in message and "256" in message, message
    assert len(listed(rec)) == 3
    assert alive(rec)


def test_no_log_line_is_longer_than_a_few_kib(ga_env, gad, rec):
    # The longest lists the API allows, logged: 256 identifiers of 255 bytes.
    identifiers = [f"{i:03}." + "x" * 251 for i in range(256)]
    register(rec, [(i, "T", "d" * 1000) for i in identifiers])
    rec.call("UnregisterRestrictions", "as", (identifiers,))
    lines = gad.log().splitlines()
    assert max(len(line.encode()) for line in lines) <= 4096 + 200, max(lines, key=len)[:200]
    assert any("unregistered restrictions" in line and "bytes cut]" in line for line in lines)


def test_registering_what_is_registered_writes_no_journal(ga_env, gad, rec):
    import os

    journal = ga_env.state_dir / "journal.json"

    def written():
        status = os.stat(journal)
        return status.st_ino, status.st_mtime_ns, status.st_ctime_ns

    register(rec, SAMPLE)
    before = written()
    register(rec, SAMPLE)
    register(rec, SAMPLE[:1])
    assert written() == before, "the journal was written again for a batch that changed nothing"
    register(rec, [("org.example.kiosk.print", "Printing", "Another detail")])
    assert written() != before  # a change is journaled
    assert listed(rec)[2] == ("org.example.kiosk.print", "Printing", "Another detail", "allow")


def test_unregister_an_empty_list_is_invalid_args(ga_env, gad, rec):
    name, message = rec.error("UnregisterRestrictions", "as", (dbus.Array([], signature="s"),))
    assert name == DBUS_ERROR + "InvalidArgs", message


# ---------------------------------------------------------------- limits and bad input


def test_identifier_of_255_characters_is_accepted(ga_env, gad, rec):
    identifier = "a" * 255
    register(rec, [(identifier, "Long", "")])
    assert listed(rec) == [(identifier, "Long", "", "allow")]


@pytest.mark.parametrize("identifier", ["a" * 256, "org/example/slash", "", "has space", "caf\u00e9"],
                         ids=["256-chars", "slash", "empty", "space", "non-ascii"])
def test_invalid_identifier_is_invalid_args_and_registers_nothing(ga_env, gad, rec, identifier):
    name, message = rec.error("RegisterRestrictions", "a(sss)", (restrictions([("ok.one", "T", ""), (identifier, "T", "")]),))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert listed(rec) == []
    assert alive(rec)


@pytest.mark.parametrize("text,detail", [("", ""), ("x" * 201, ""), ("T", "d" * 1001), ("\u00e9" * 101, "")],
                         ids=["empty-text", "text-201-bytes", "detail-1001-bytes", "text-202-utf8-bytes"])
def test_invalid_text_or_detail_is_invalid_args(ga_env, gad, rec, text, detail):
    name, message = rec.error("RegisterRestrictions", "a(sss)", (restrictions([("a.b", text, detail)]),))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert listed(rec) == []


def test_text_of_200_bytes_and_detail_of_1000_bytes_are_accepted(ga_env, gad, rec):
    register(rec, [("a.b", "\u00e9" * 100, "d" * 1000)])
    assert listed(rec) == [("a.b", "\u00e9" * 100, "d" * 1000, "allow")]


def test_register_an_empty_list_is_invalid_args(ga_env, gad, rec):
    name, message = rec.error("RegisterRestrictions", "a(sss)", (restrictions([]),))
    assert name == DBUS_ERROR + "InvalidArgs", message


def test_duplicate_identifier_in_a_batch_is_invalid_args_and_registers_none(ga_env, gad, rec):
    name, message = rec.error("RegisterRestrictions", "a(sss)",
                              (restrictions([("a.one", "T", ""), ("a.two", "T", ""), ("a.one", "U", "")]),))
    assert name == DBUS_ERROR + "InvalidArgs", message
    assert "a.one" in message, message
    assert listed(rec) == []


def test_a_batch_of_257_restrictions_is_limit_exceeded(ga_env, gad, rec):
    name, message = rec.error("RegisterRestrictions", "a(sss)",
                              (restrictions([(f"r.{i:03}", "T", "") for i in range(257)]),))
    assert name == GA_ERROR + "LimitExceeded", message
    assert listed(rec) == []


def test_one_batch_of_10000_restrictions_is_limit_exceeded_and_the_service_stays_up(ga_env, gad, rec):
    name, message = rec.error("RegisterRestrictions", "a(sss)",
                              (restrictions([(f"r.{i:05}", "T", "") for i in range(10000)]),))
    assert name == GA_ERROR + "LimitExceeded", message
    assert "10000" in message and "256" in message, message
    assert listed(rec) == []
    assert alive(rec)


def test_the_257th_restriction_is_limit_exceeded(ga_env, gad, rec):
    register(rec, [(f"r.{i:03}", "T", "") for i in range(256)])
    name, message = rec.error("RegisterRestrictions", "a(sss)", (restrictions([("r.extra", "T", "")]),))
    assert name == GA_ERROR + "LimitExceeded", message
    # Updating one that exists adds none: still fine at the limit.
    register(rec, [("r.000", "Updated", "")])
    rows = listed(rec)
    assert len(rows) == 256 and rows[0] == ("r.000", "Updated", "", "allow")


def test_10000_registrations_in_batches_stop_at_256_and_the_service_stays_up(ga_env, gad, rec):
    outcomes = []
    for batch in range(100):
        entries = [(f"bulk.b{batch:03}.r{i:03}", f"Text {i}", "") for i in range(100)]
        try:
            register(rec, entries)
            outcomes.append("ok")
        except dbus.exceptions.DBusException as error:
            outcomes.append(error.get_dbus_name())
    assert outcomes == ["ok", "ok"] + [GA_ERROR + "LimitExceeded"] * 98
    assert len(listed(rec)) == 200
    register(rec, [(f"bulk.last.r{i:03}", "T", "") for i in range(56)])
    assert len(listed(rec)) == 256
    assert alive(rec)


def test_restrictions_survive_a_restart_of_the_service(ga_env, gad, rec):
    register(rec, SAMPLE)
    gad.restart_after_kill9()
    assert listed(Recorder(ga_env)) == sorted((i, t, d, "allow") for i, t, d in SAMPLE)


def test_restrictions_outlive_the_client_that_registered_them(ga_env, gad, rec):
    rc, out, err = ga_env.busctl_call("RegisterRestrictions", "a(sss)", "1", "a.one", "One", "")
    assert rc == 0, err
    assert listed(rec) == [("a.one", "One", "", "allow")]


def test_denied_restriction_survives_a_restart_inside_the_session(ga_env, gad, rec):
    register(rec, SAMPLE)
    rc, out, err = ga_env.busctl_call("StartSession", *busctl_options())
    assert rc == 0, err
    rc, out, err = ga_env.busctl_call("SetRestrictionState", "ss", "com.example.app.buy", "deny")
    assert rc == 0, err
    gad.restart_after_kill9()
    again = Recorder(ga_env)
    assert again.call("GetRestrictionState", "s", ("com.example.app.buy",)) == "deny"
    again.call("EndSession")
    assert again.call("GetRestrictionState", "s", ("com.example.app.buy",)) == "allow"


def test_anyone_may_list_restrictions(ga_env, gad, rec):
    register(rec, SAMPLE[:1])
    rc, out, err = ga_env.busctl_call("ListRestrictions", prefix=NOBODY)
    assert rc == 0, err
    assert out.strip() == 'a(ssss) 1 "org.example.kiosk.print" "Printing" "The print button" "allow"'


def test_anyone_may_get_a_restriction_state(ga_env, gad, rec):
    register(rec, SAMPLE[:1])
    rc, out, err = ga_env.busctl_call("GetRestrictionState", "s", "org.example.kiosk.print", prefix=NOBODY)
    assert (rc, out.strip()) == (0, 's "allow"'), err


def test_unregister_by_another_uid_is_not_authorized(ga_env, gad, rec, errmon):
    register(rec, SAMPLE)
    name, message = errmon.busctl_error(gad, "UnregisterRestrictions", "as", "1", "com.example.app.buy", prefix=NOBODY)
    assert name == GA_ERROR + "NotAuthorized", message
    assert len(listed(rec)) == 3
