"""A locked kiosk speaks (issue 23's acceptance): guidedaccessd in system
mode on a real systemd, the session agent in the kiosk user's session,
Orca heard through a sound server (conftest `agent_kiosk`: the agent root
filesystem, the package installed; user_session.prepare_agent_kiosk).

The administrator's set-up, nothing more: guidedaccessd.service enabled,
`[Service] Backend=dconf` and `[Agent] AllowUsers=tester`, the dconf
profile line from `guidedaccess-dconf-profile`, and, for every user,
`systemctl --global enable` of guidedaccess-agent.service and of the
kiosk's compositor (a headless sway with Xwayland, a test unit). The kiosk
user's login (linger: logind starts user@1000.service at boot) starts sway,
PipeWire (a null sink `speech`, the only sink) and the agent; no one tells
the agent WAYLAND_DISPLAY or DISPLAY: it finds them. speech-dispatcher
speaks through pulse; parec records the sink's monitor and the onset of
sound is the first 10 ms window whose RMS is above user_session.LOUD.

The caller is root with guidedaccessctl --system; the reply's time is taken
in the container as it exits. In order, on the one container:
1. the login starts the agent, which registers: the service reports sway
   and the screen reader, the agent's user is `tester`;
2. StartSession (screen-reader, large-text): Orca heard within 5 s of the
   reply; text-scaling-factor 1.5, not writable, `gsettings set` refused;
   EndSession: Orca's unit and processes gone, silent within 1 s of the
   reply, the key the user's own and writable again;
3. `kill -9` of the agent mid-session: Restart= brings it back, it
   registers, adopts the same Orca unit (name, pid, invocation) and the
   session's features are applied within 1 s of its registration;
4. the agent stopped: Orca goes on (its own unit); EndSession succeeds;
   the agent started again stops that Orca (frozen with SIGSTOP, so that
   it cannot quit by itself); 4b. not frozen, Orca quits by itself at
   EndSession (the service restores its key, Orca 43 watches it);
5. a power-off mid-session and a boot: at the login the session is resumed
   and Orca speaks again; EndSession silences it.
The figures are printed (-s) and in the run's summary.
"""

import re
import time

import user_session as us
from container_setup import FACTS, KIOSK_UID, KIOSK_USER

BUS_NAME = "org.guidedaccess.GuidedAccess1"
OBJECT = "/org/guidedaccess/GuidedAccess1"
AGENT = us.AGENT_UNIT
READERS = "guidedaccess-agent-screen-reader-*.service"
APP_SLICE = f"/user.slice/user-{KIOSK_UID}.slice/user@{KIOSK_UID}.service/app.slice/"
TEXT = ("org.gnome.desktop.interface", "text-scaling-factor")
FEATURES = ["--feature", "screen-reader", "--feature", "large-text"]
ORCA = "/usr/bin/orca"

# What a step leaves for the next.
RUN = {}


def fact(name, value):
    FACTS[f"agent: {name}"] = value
    print(f"\nagent: {name}: {value}")


# --- the caller, the service, the kiosk user's view ---------------------------


def ctl(ct, *args):
    """`guidedaccessctl --system ARGS` as root: (exit status, output, the
    time it exited, seconds since the epoch, taken in the container)."""
    out = ct.run(["sh", "-c", 'guidedaccessctl --system "$@"; s=$?; date +%s.%N; exit $s', "sh", *args],
                 check=False)
    text, stamp = out.stdout.strip().rsplit("\n", 1) if "\n" in out.stdout.strip() else ("", out.stdout.strip())
    return out.returncode, text + out.stderr, float(stamp)


def ctl_ok(ct, *args):
    status, text, when = ctl(ct, *args)
    assert status == 0, f"guidedaccessctl --system {' '.join(args)} exited {status}: {text}"
    return when


def prop(ct, name):
    return ct.run(["gdbus", "call", "--system", "--dest", BUS_NAME, "--object-path", OBJECT, "--method",
                   "org.freedesktop.DBus.Properties.Get", BUS_NAME, name]).stdout.strip()


def text_key(ct):
    """(value, writable) of text-scaling-factor as the kiosk user sees it."""
    value = ct.run(["gsettings", "get", *TEXT], user=KIOSK_USER).stdout.strip()
    writable = ct.run(["gsettings", "writable", *TEXT], user=KIOSK_USER).stdout.strip()
    return value, writable


def agent_state(ct):
    return us.unit(ct, AGENT, "ActiveState", "MainPID", "NRestarts", "ControlGroup")


def readers(ct):
    """[(unit, main pid, invocation)] of the screen reader units that run."""
    out = us.systemctl(ct, "list-units", "--plain", "--no-legend", "--state=active", READERS).stdout
    found = []
    for name in (line.split()[0] for line in out.splitlines()):
        state = us.unit(ct, name, "MainPID", "InvocationID", "ControlGroup")
        found.append((name, int(state["MainPID"]), state["InvocationID"], state["ControlGroup"]))
    return found


def reader_units(ct):
    """The screen reader units the user's manager has loaded, in any state
    (CollectMode=inactive-or-failed unloads one once it stopped)."""
    out = us.systemctl(ct, "list-units", "--all", "--plain", "--no-legend", READERS).stdout
    return [line.split()[0] for line in out.splitlines()]


def orcas(ct):
    """Orca's processes anywhere in the kiosk user's cgroup tree."""
    return [(pid, cgroup) for pid, cgroup, command in us.user_processes(ct, ORCA)]


def agent_log(ct, since=0.0):
    """The agent's journal (the kiosk user's) from SINCE: [(time, pid, message)]."""
    return [e for e in us.journal(ct, ["--user", "-u", AGENT], user=KIOSK_USER) if e[0] >= since]


def logged(ct, pattern, pid=None, since=0.0):
    """The first agent journal entry matching PATTERN (of PID), once there is one."""
    def found():
        return next((e for e in agent_log(ct, since) if re.search(pattern, e[2]) and pid in (None, e[1])), None)

    try:
        return us.wait_for(found, f"the agent's journal to say /{pattern}/", timeout=10, interval=0.1)
    except TimeoutError as error:
        tail = "\n".join(f"{t:.3f} [{p}] {m}" for t, p, m in agent_log(ct)[-15:])
        raise AssertionError(f"{error}; it says:\n{tail}")


def now(ct):
    return float(ct.run(["date", "+%s.%N"]).stdout)


def start_session(ct):
    """StartSession as root; returns (reply time, seconds to the first sound)."""
    reply = ctl_ok(ct, "start", *FEATURES)
    # Orca speaks once it runs, which Apply, then the reply, waits for.
    onset = us.wait_for_sound(ct, reply)
    return reply, onset - reply


def end_and_hear_silence(ct, what):
    """EndSession as root: Orca's units and processes gone, silent within 1 s
    of the reply, the key the user's own again; prints the figures."""
    reply = ctl_ok(ct, "end")
    us.wait_for(lambda: not reader_units(ct) and not orcas(ct), "no screen reader unit, no Orca", timeout=5,
                interval=0.05)
    gone = now(ct) - reply
    assert us.user_processes(ct, "speech-dispatcher") == []
    last, tail = us.last_sound(ct, reply, quiet_for=2.0)
    after = (last - reply) if last else None
    fact(f"{what}: EndSession reply → Orca's unit and processes gone (polled)", f"{gone:.2f} s")
    fact(f"{what}: EndSession reply → last sound", "none" if after is None else f"{after:.2f} s")
    assert after is None or after <= 1.0, f"sound {after:.2f} s after EndSession's reply"
    assert tail <= us.LOUD, f"the speaker is not silent 1-2 s after EndSession (RMS {tail})"
    assert text_key(ct) == ("1.0", "true")


# --- the steps ----------------------------------------------------------------


def test_1_the_login_starts_the_agent_which_registers(agent_kiosk):
    ct = agent_kiosk
    assert ct.run(["systemctl", "--global", "is-enabled", AGENT]).stdout.strip() == "enabled"
    assert ct.run(["systemctl", "is-enabled", "guidedaccessd.service"]).stdout.strip() == "enabled"
    assert ct.run(["systemctl", "is-active", f"user@{KIOSK_UID}.service"], check=False).stdout.strip() != "active"
    started = time.monotonic()
    seconds = us.enable_linger(ct)
    fact("login (linger) → the user's manager on its bus", f"{seconds:.2f} s")
    us.wait_for(lambda: "'tester'" in prop(ct, "Agent") and "screen-reader" in prop(ct, "SupportedFeatures"),
                "the agent registered, with the screen reader", timeout=20, interval=0.1)
    fact("login → the agent registered, the service reports the screen reader",
         f"{time.monotonic() - started:.2f} s")
    assert prop(ct, "Desktop") == "(<'sway'>,)"
    assert "large-text" in prop(ct, "SupportedFeatures")
    # Started by the user's manager from default.target, not by anyone else.
    state = agent_state(ct)
    assert state["ActiveState"] == "active" and state["NRestarts"] == "0", state
    assert state["ControlGroup"] == APP_SLICE + AGENT, state
    assert "default.target" in us.unit(ct, AGENT, "WantedBy")["WantedBy"]
    # Nobody gave the agent the displays: it found sway's socket and X socket.
    environment = us.systemctl(ct, "show-environment").stdout
    assert "WAYLAND_DISPLAY" not in environment and "DISPLAY=" not in environment, environment
    detected = logged(
        ct, r"desktop: (now )?sway \(detected; WAYLAND_DISPLAY=wayland-\d+, compositor sway, DISPLAY=:\d+\)")
    fact("the agent's detection", detected[2].split("] ", 1)[-1])
    assert "Default Sink: speech" in ct.run(["pactl", "info"], user=KIOSK_USER).stdout


def test_2_a_locked_kiosk_speaks_and_is_silent_after_its_end(agent_kiosk):
    ct = agent_kiosk
    us.start_recording(ct)
    assert text_key(ct) == ("1.0", "true")
    recording_since = now(ct)
    reply, onset = start_session(ct)
    fact("StartSession reply → Orca heard", f"{onset:.2f} s")
    assert onset <= 5.0
    _, before = us.sound(ct, recording_since)
    assert all(rms <= us.LOUD for t, rms in before if t < reply), "sound before the session started"
    [(unit, pid, invocation, cgroup)] = readers(ct)
    assert cgroup == APP_SLICE + unit, cgroup
    assert orcas(ct) == [(pid, APP_SLICE + unit)]
    environ = ct.run(["cat", f"/proc/{pid}/environ"]).stdout.split("\0")
    assert any(re.fullmatch(r"DISPLAY=:\d+", v) for v in environ), environ
    # Locked: the session's value, not writable, and the kiosk user cannot change it.
    assert text_key(ct) == ("1.5", "false")
    refused = ct.run(["gsettings", "set", *TEXT, "2.0"], user=KIOSK_USER, check=False)
    assert refused.returncode != 0 and "not writable" in refused.stderr, refused
    assert text_key(ct) == ("1.5", "false")
    end_and_hear_silence(ct, "session 1")


def test_3_kill_9_of_the_agent_adopts_the_same_orca(agent_kiosk):
    ct = agent_kiosk
    reply, onset = start_session(ct)
    fact("second session: StartSession reply → Orca heard", f"{onset:.2f} s")
    [before] = readers(ct)
    old = agent_state(ct)
    killed = now(ct)
    ct.run(["kill", "-9", old["MainPID"]])
    state = us.wait_unit(ct, AGENT, "restarted", lambda s: s.get("ActiveState") == "active"
                         and s.get("MainPID") not in ("0", old["MainPID"]), "ActiveState", "MainPID", "NRestarts")
    assert int(state["NRestarts"]) == int(old["NRestarts"]) + 1, state
    pid = int(state["MainPID"])
    registered = logged(ct, r"registered as the session agent", pid=pid, since=killed)
    adopted = logged(ct, rf"screen-reader: unit {re.escape(before[0])}, started before the service restarted, adopted",
                     pid=pid, since=killed)
    applied = logged(ct, r"applied: \[large-text, screen-reader\]", pid=pid, since=killed)
    fact("kill -9 of the agent → registered again", f"{registered[0] - killed:.2f} s")
    fact("the agent's registration → the session's features applied", f"{applied[0] - registered[0]:.3f} s")
    assert adopted[0] <= applied[0]
    assert applied[0] - registered[0] <= 1.0
    # The same Orca, the only one.
    assert readers(ct) == [before]
    assert orcas(ct) == [(before[1], before[3])]
    service = us.journal(ct, ["-u", "guidedaccessd"])
    assert any(f"session agent of {KIOSK_USER} (pid {pid})" in m and "registered" in m
               for t, _, m in service if t >= killed), "the service did not log the new agent's registration"
    assert text_key(ct) == ("1.5", "false")
    RUN["reader"] = before


def test_4_end_session_while_the_agent_is_stopped_then_its_start_stops_orca(agent_kiosk):
    """Orca follows its key by itself (test_4b): frozen, it cannot, and
    stays as an Orca that missed the end would; the agent's start stops it."""
    ct = agent_kiosk
    before = RUN["reader"]
    us.systemctl(ct, "stop", AGENT)
    # Orca runs in a unit of its own: stopping the agent leaves it.
    assert readers(ct) == [before]
    assert "'tester'" not in prop(ct, "Agent")
    ct.run(["kill", "-STOP", str(before[1])])
    status, text, reply = ctl(ct, "end")
    assert status == 0, text
    assert prop(ct, "SessionActive") == "(<false>,)"
    assert text_key(ct) == ("1.0", "true")
    # Nobody in the session to stop it.
    time.sleep(1.0)
    assert readers(ct) == [before]
    started = now(ct)
    us.systemctl(ct, "start", AGENT)
    us.wait_for(lambda: not reader_units(ct) and not orcas(ct), "the agent to stop the Orca it ran", timeout=10,
                interval=0.05)
    fact("agent started after an EndSession it missed → its (frozen) Orca's unit and processes gone",
         f"{now(ct) - started:.2f} s")
    logged(ct, rf"{re.escape(before[0])} outlived its session while the service was down; stopping it", since=started)
    assert us.user_processes(ct, "speech-dispatcher") == []
    last, tail = us.last_sound(ct, started, quiet_for=2.0)
    assert last is None or last - started <= 1.0, f"sound {last - started:.2f} s after the agent started"
    assert tail <= us.LOUD


def test_4b_orca_follows_its_key_when_the_agent_is_stopped(agent_kiosk):
    """The service restores screen-reader-enabled at EndSession; a running
    Orca watches it and quits (Orca 43), with no agent to stop it."""
    ct = agent_kiosk
    start_session(ct)
    [before] = readers(ct)
    us.systemctl(ct, "stop", AGENT)
    assert readers(ct) == [before]
    reply = ctl_ok(ct, "end")
    us.wait_for(lambda: not reader_units(ct) and not orcas(ct), "Orca to quit on its key", timeout=5, interval=0.05)
    fact("agent stopped: EndSession reply → Orca quit on its key, its unit gone", f"{now(ct) - reply:.2f} s")
    last, tail = us.last_sound(ct, reply, quiet_for=2.0)
    fact("agent stopped: EndSession reply → last sound", "none" if last is None else f"{last - reply:.2f} s")
    assert last is None or last - reply <= 1.0
    assert tail <= us.LOUD
    started = now(ct)
    us.systemctl(ct, "start", AGENT)
    logged(ct, r"applied: \[\]", since=started)
    assert not reader_units(ct) and not orcas(ct)


def test_5_a_session_resumes_speaking_after_a_power_off(agent_kiosk):
    ct = agent_kiosk
    reply, onset = start_session(ct)
    fact("third session: StartSession reply → Orca heard", f"{onset:.2f} s")
    # The recorder starts at the login too, so that the first words are
    # heard, in a new file (this one goes: nothing of it is taken for them).
    us.systemctl(ct, "enable", us.RECORDER_UNIT)
    ct.run(["rm", us.RECORDING])
    powered_off = now(ct)
    seconds = ct.reboot()
    fact("power-off mid-session and boot", f"{seconds:.1f} s to {ct.boot_state}")
    booted = now(ct)
    us.wait_for_recording(ct, since=powered_off)
    onset = us.wait_for_sound(ct, powered_off, timeout=20)
    us.wait_for(lambda: readers(ct), "the screen reader's unit", timeout=5, interval=0.05)
    registered = logged(ct, r"registered as the session agent", since=powered_off)
    applied = logged(ct, r"applied: \[large-text, screen-reader\]", since=powered_off)
    fact("boot → the agent registered (linger's login)", f"{registered[0] - booted:+.2f} s")
    fact("the agent's registration → Orca heard", f"{onset - registered[0]:.2f} s")
    assert applied[0] - registered[0] <= 1.0
    assert onset - registered[0] <= 5.0
    service = us.journal(ct, ["-b", "-u", "guidedaccessd"])
    assert any("resumed" in m for _, _, m in service), [m for _, _, m in service]
    [(unit, pid, _, cgroup)] = readers(ct)
    assert orcas(ct) == [(pid, cgroup)]
    assert text_key(ct) == ("1.5", "false")
    end_and_hear_silence(ct, "after the boot")


def test_6_a_session_whose_time_limit_passed_while_powered_off_ends_at_the_boot(agent_kiosk):
    ct = agent_kiosk
    ctl_ok(ct, "start", *FEATURES, "--time-limit", "8s")
    us.wait_for(lambda: readers(ct), "the screen reader's unit", timeout=10, interval=0.05)
    powered_off = now(ct)
    errors = ct.shutdown()
    assert not errors, errors
    time.sleep(9)  # the time limit passes while the kiosk is off
    seconds = ct.boot()
    fact("time limit passed while powered off: boot", f"{seconds:.1f} s")
    registered = logged(ct, r"registered as the session agent", since=powered_off)
    logged(ct, r"applied: \[\]", since=powered_off)
    assert "false" in prop(ct, "SessionActive")
    assert not reader_units(ct) and not orcas(ct)
    assert text_key(ct) == ("1.0", "true")
    service = us.journal(ct, ["-b", "-u", "guidedaccessd"])
    assert any("time limit" in m for _, _, m in service), [m for _, _, m in service]
    fact("time limit passed while powered off: agent registered, nothing started",
         f"{registered[0] - powered_off:.1f} s after the power-off")


def test_7_removing_the_package_mid_session_stops_the_agent_and_its_orca(agent_kiosk):
    ct = agent_kiosk
    # Test 6 has just booted the kiosk: sway's Wayland socket comes first,
    # Xwayland's X display (which Orca needs) a moment later, and until the
    # agent has seen it the screen reader is honestly not supported. A kiosk
    # app after a boot waits for SupportedFeatures the same way.
    us.wait_for(lambda: "screen-reader" in prop(ct, "SupportedFeatures"),
                "the agent to deliver the screen reader after the boot", timeout=15, interval=0.1)
    start_session(ct)
    assert readers(ct) and agent_state(ct)["ActiveState"] == "active"
    removed = ct.run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-y", "remove", "guidedaccess"],
                     timeout=120)
    assert "ending the session in progress" in removed.stdout, removed.stdout
    assert agent_state(ct)["ActiveState"] in ("inactive", "failed")
    us.wait_for(lambda: not reader_units(ct) and not orcas(ct), "no screen reader unit, no Orca", timeout=5,
                interval=0.05)
    assert text_key(ct) == ("1.0", "true")
