"""The screen reader guidedaccessd starts, timed on a real headless sway
(Tests/desktop/sway.py, as a non-root test user) with speech heard as sound
recorded from a PipeWire null sink (Tests/desktop/speech.py):

- turn-on: ConfigureForSession(['screen-reader'], true) reply → first sound,
  for a cold start (a new desktop per run: Orca and speech-dispatcher not
  running) and a warm one (a second session in the same desktop);
- the reference, in the same desktop: `orca --replace` started by hand with
  the same environment → first sound (what Orca itself costs);
- EndSession while Orca reads a long window title: reply → Orca gone, and
  reply → last sound (speech-dispatcher's queue is cancelled);
- the reference: Orca stopped by hand (SIGTERM) while it reads the same
  title, nothing cancelled → last sound (what the customer would hear);
- system mode with the session agent (1.2), cold, in a desktop of its own:
  guidedaccessd --system as root on a private bus standing in for the system
  bus (Backend=memory, `[Agent] AllowUsers=` the test user), the agent
  (guidedaccessd --agent) as the test user in the desktop; root's
  ConfigureForSession(['screen-reader'], true) on that bus → first sound,
  compared with user mode's cold figure of the same run.

    /usr/bin/python3 Benchmarks/screen_reader_latency.py [RUNS]   (default 5)

Prints one line per run and the medians; the issue's targets are reported,
not asserted."""

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "Tests" / "desktop"))

import sway  # noqa: E402
import speech  # noqa: E402
from gnomeshell import BUS_CONFIG  # noqa: E402
from test_screen_reader import Kiosk, wait_until  # noqa: E402

TITLE = ("Welcome to the museum cafe. Choose a drink, then a cake, then pay at the counter "
         "with a card or with cash, and take your receipt")
LABEL = "Order now"


def turn_on(desk, kiosk):
    on, _ = kiosk.call("ConfigureForSession", "['screen-reader']", "true")
    return on, desk.speech.recording.wait_for_sound(on, timeout=10) - on


def end_while_reading(desk, kiosk):
    """Focus the window so Orca reads its long title; EndSession once it
    speaks it: (reply → Orca gone, reply → last sound)."""
    desk.keys("-s", "4000")
    desk.speech.log.wait_for("Welcome to the museum", after=time.time() - 1, timeout=10)
    time.sleep(0.3)  # well into the sentence
    end, _ = kiosk.call("EndSession")
    gone = wait_until(lambda: not speech.screen_readers(desk.env) and time.time(), 5, "Orca did not exit") - end
    last = desk.speech.recording.last_sound(end, end + 6)
    return gone, (last - end) if last else 0.0


def quiet(desk, seconds=0.5, timeout=10):
    """Waits until nothing has sounded for `seconds`."""
    deadline = time.monotonic() + timeout
    while True:
        now = time.time()
        if desk.speech.recording.last_sound(now - seconds, now) is None:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"still sound after {timeout} s")
        time.sleep(0.1)


def by_hand(desk):
    """Orca started and stopped by hand: (start → first sound, SIGTERM
    while reading → last sound)."""
    quiet(desk)
    started = time.time()
    orca = desk.spawn("orca-by-hand", ["/usr/bin/orca", "--replace"])
    first = desk.speech.recording.wait_for_sound(started, timeout=10) - started
    desk.speech.log.wait_for("Screen reader on", after=started, timeout=10)
    desk.keys("-s", "4000")
    desk.speech.log.wait_for("Welcome to the museum", after=started, timeout=10)
    time.sleep(0.3)
    stopped = time.time()
    orca.send_signal(signal.SIGTERM)
    orca.wait(5)
    last = desk.speech.recording.last_sound(stopped, stopped + 8)
    return first, (last - stopped) if last else 0.0


def one_run():
    desk = sway.Desktop()
    try:
        desk.start_sway()
        desk.start_speech()
        desk.start_gtk_button(title=TITLE, label=LABEL)
        desk.start_daemon(binary=os.environ.get("GUIDEDACCESSD", sway.DAEMON_BINARY))
        kiosk = Kiosk(desk)
        kiosk.call("StartSession", "{}")
        _, cold = turn_on(desk, kiosk)
        gone, tail = end_while_reading(desk, kiosk)
        kiosk.call("StartSession", "{}")
        quiet(desk)
        _, warm = turn_on(desk, kiosk)
        kiosk.call("EndSession")
        wait_until(lambda: not speech.screen_readers(desk.env), 5, "Orca did not exit")
        hand_first, hand_tail = by_hand(desk)
        return dict(cold=cold, warm=warm, gone=gone, tail=tail, hand_first=hand_first, hand_tail=hand_tail)
    finally:
        desk.stop()


class SystemKiosk:
    """The kiosk's calls on the system bus (root, dbus-python)."""

    def __init__(self, address):
        import dbus.bus

        self.bus = dbus.bus.BusConnection(address)

    def call(self, method, signature="", *args):
        self.bus.call_blocking(sway.GA_NAME, "/org/guidedaccess/GuidedAccess1", "org.guidedaccess.GuidedAccess1",
                               method, signature, args, timeout=25)
        return time.time(), 0.0

    def agent(self):
        return self.bus.call_blocking(sway.GA_NAME, "/org/guidedaccess/GuidedAccess1",
                                      "org.freedesktop.DBus.Properties", "Get", "ss",
                                      ("org.guidedaccess.GuidedAccess1", "Agent"), timeout=25)


def one_agent_run():
    """System mode with the agent, cold: reply → first sound."""
    desk = sway.Desktop()
    try:
        desk.start_sway()
        desk.start_speech()
        desk.start_gtk_button(title=TITLE, label=LABEL)
        binary = desk.readable(os.environ.get("GUIDEDACCESSD", sway.DAEMON_BINARY))
        socket, config = desk.root / "system-bus.sock", desk.root / "system-bus.conf"
        config.write_text(BUS_CONFIG.format(type="system", socket=socket, servicedir=""))
        bus = desk._spawn_root("system-bus", [sway.TOOLS["dbus-daemon"], f"--config-file={config}", "--nofork",
                                              "--nopidfile", "--print-address=1"], env={"PATH": "/usr/bin:/bin"},
                               stdout=subprocess.PIPE)
        address = bus.stdout.readline().decode().strip()
        bus.stdout.close()
        os.chmod(socket, 0o777)
        (desk.root / "system.conf").write_text(
            f"[Service]\nBackend=memory\n[Agent]\nAllowUsers={desk.user.pw_name}\n")
        (desk.root / "state-system").mkdir()
        service = desk._spawn_root("guidedaccessd-system", [binary, "--system", "--address", address, "--state-dir",
                                                            desk.root / "state-system", "--config",
                                                            desk.root / "system.conf"],
                                   env={"PATH": "/usr/bin:/bin", "DBUS_SYSTEM_BUS_ADDRESS": address,
                                        "GUIDEDACCESS_JOURNAL_SOCKET": str(desk.root / "no-journald")})
        (desk.root / "agent.conf").write_text("")
        os.chmod(desk.root / "agent.conf", 0o644)
        desk.spawn("guidedaccess-agent", [binary, "--agent", "--config", desk.root / "agent.conf"],
                   env={**desk.env, "DBUS_SYSTEM_BUS_ADDRESS": address})
        kiosk = SystemKiosk(address)
        wait_until(lambda: service.poll() is None and kiosk.bus.name_has_owner(sway.GA_NAME) and kiosk.agent() != "",
                   20, "the agent did not register")
        kiosk.call("StartSession", "a{sv}", {})
        on, _ = kiosk.call("ConfigureForSession", "asb", ["screen-reader"], True)
        cold = desk.speech.recording.wait_for_sound(on, timeout=10) - on
        end, _ = kiosk.call("EndSession")
        gone = wait_until(lambda: not speech.screen_readers(desk.env) and time.time(), 5, "Orca did not exit") - end
        return dict(agent_cold=cold, agent_gone=gone)
    finally:
        desk.stop()


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    results = []
    for i in range(runs):
        r = one_run()
        r.update(one_agent_run())
        results.append(r)
        print(f"run {i + 1}: turn-on -> first sound cold {r['cold']:.2f} s, warm {r['warm']:.2f} s "
              f"(Orca by hand {r['hand_first']:.2f} s); EndSession -> Orca gone {r['gone']:.2f} s, "
              f"last sound {r['tail']:+.2f} s (Orca stopped by hand, nothing cancelled: {r['hand_tail']:+.2f} s); "
              f"system mode with the agent: first sound cold {r['agent_cold']:.2f} s, Orca gone {r['agent_gone']:.2f} s",
              flush=True)
    med = {key: statistics.median(r[key] for r in results) for key in results[0]}
    print(f"\nmedians over {runs} runs:")
    print(f"  ConfigureForSession reply -> first audible speech, cold: {med['cold']:.2f} s "
          f"(target <= 1.5 s: {'met' if med['cold'] <= 1.5 else 'MISSED'}); warm: {med['warm']:.2f} s")
    print(f"  reference, Orca started by hand -> first audible speech: {med['hand_first']:.2f} s "
          f"(service / by hand: {med['cold'] / med['hand_first']:.2f})")
    print(f"  system mode with the session agent, reply -> first audible speech, cold: {med['agent_cold']:.2f} s "
          f"({med['agent_cold'] - med['cold']:+.2f} s against user mode; target within 0.2 s: "
          f"{'met' if med['agent_cold'] - med['cold'] <= 0.2 else 'MISSED'}); EndSession -> Orca gone "
          f"{med['agent_gone']:.2f} s")
    print(f"  EndSession reply -> screen reader gone: {med['gone']:.2f} s (target <= 1 s: "
          f"{'met' if med['gone'] <= 1 else 'MISSED'})")
    print(f"  EndSession reply -> last sound: {med['tail']:+.2f} s (target <= 1 s: "
          f"{'met' if med['tail'] <= 1 else 'MISSED'}); Orca stopped by hand with nothing cancelled: "
          f"{med['hand_tail']:+.2f} s")


if __name__ == "__main__":
    main()
