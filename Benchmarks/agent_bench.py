"""The session agent's costs, run by scripts/bench-agent, on private buses
(Tests/integration's GAEnv standing in for the system bus, agents.AgentSession
for the kiosk user's session), release builds (GUIDEDACCESSD):

- Apply round trip (service → agent → reply) for a feature with no program
  (large-text): ConfigureForSession(['large-text'], on/off) in system mode,
  Backend=memory, `[Service] Desktop=sway`, timed by one client, first with
  no agent registered, then with one (same service, same run). Every call
  then waits for the agent's Apply; the difference of the medians is that
  round trip (both medians are printed).
- The agent idle: context switches of all its threads over 10 s, with the
  system service on the bus (registered) and without one (waiting for it).
- VmRSS and Private_Dirty of the agent and of the service, after one session.

    GUIDEDACCESSD=… /usr/bin/python3 Benchmarks/agent_bench.py [COUNT]   (400)
"""

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "Tests" / "integration"))
sys.path.insert(0, str(HERE))

import dbus  # noqa: E402
from agents import AgentSession  # noqa: E402
from configure_latency import percentile  # noqa: E402
from gadaemon import GAEnv, pump  # noqa: E402

NAME, PATH, IFACE = "org.guidedaccess.GuidedAccess1", "/org/guidedaccess/GuidedAccess1", "org.guidedaccess.GuidedAccess1"


def call(bus, method, signature="", args=(), iface=IFACE):
    return bus.call_blocking(NAME, PATH, iface, method, signature, args, timeout=25.0)


def prop(bus, name):
    return call(bus, "Get", "ss", (IFACE, name), iface="org.freedesktop.DBus.Properties")


def configure_times(bus, count, feature="large-text"):
    call(bus, "StartSession", "a{sv}", (dbus.Dictionary({}, signature="sv"),))
    try:
        for i in range(20):  # warm-up
            call(bus, "ConfigureForSession", "asb", ([feature], i % 2 == 0))
        times = []
        for i in range(count):
            started = time.perf_counter()
            call(bus, "ConfigureForSession", "asb", ([feature], i % 2 == 0))
            times.append((time.perf_counter() - started) * 1000.0)
        return times
    finally:
        call(bus, "EndSession")


def switches(pid):
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in open(f"/proc/{pid}/task/{task}/status"):
                if "ctxt_switches" in line:
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def idle_switches(pid, seconds=10):
    before = switches(pid)
    time.sleep(seconds)
    return switches(pid) - before


def memory(pid):
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    rss = int(status["VmRSS"].split()[0])
    dirty = 0
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Private_Dirty:"):
            dirty = int(line.split()[1])
    return rss, dirty


def agent_pid(agent):
    """The agent's own pid (setpriv execs it: the Popen's pid)."""
    return agent.process.pid


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    env = GAEnv(prefix="/tmp/ga-bench-agent-")
    session = None
    try:
        config = env.write_config("[Service]\nBackend=memory\nDesktop=sway\n[Agent]\nAllowUsers=nobody\n")
        # The agent waiting for a system service that is not there.
        session = AgentSession(env.address)
        agent = session.agent().start()
        agent.wait_for_log("registering when one appears")
        time.sleep(1)
        waiting = idle_switches(agent_pid(agent))
        daemon = env.start_daemon(config=config, args=("--system",),
                                  extra_env={"DBUS_SYSTEM_BUS_ADDRESS": env.address,
                                             "GUIDEDACCESS_JOURNAL_SOCKET": str(env.root / "no-journald")})
        bus = dbus.bus.BusConnection(env.address)
        assert pump(lambda: prop(bus, "Agent") == "nobody", 15), "the agent did not register"
        with_agent = configure_times(bus, count)
        agent.stop()
        assert pump(lambda: prop(bus, "Agent") == "", 15), "the agent did not leave"
        without_agent = configure_times(bus, count)
        # Again with an agent, for its memory after a session and its idle.
        agent = session.agent().start()
        assert pump(lambda: prop(bus, "Agent") == "nobody", 15), "the agent did not register again"
        configure_times(bus, 50)
        time.sleep(1)
        registered = idle_switches(agent_pid(agent))
        service_idle = idle_switches(daemon.process.pid)
        agent_rss, agent_dirty = memory(agent_pid(agent))
        service_rss, service_dirty = memory(daemon.process.pid)
    finally:
        if session:
            session.stop()
        env.stop()

    p50_with, p50_without = percentile(with_agent, 50), percentile(without_agent, 50)
    apply_rt = p50_with - p50_without
    print(f"ConfigureForSession(large-text) system mode, n={count}: with the agent p50 {p50_with:.3f} ms "
          f"p90 {percentile(with_agent, 90):.3f}; without p50 {p50_without:.3f} ms p90 {percentile(without_agent, 90):.3f}")
    print(f"  Apply round trip (difference of the medians): {apply_rt:.3f} ms "
          f"(target p50 <= 2 ms: {'met' if apply_rt <= 2 else 'MISSED'})")
    print(f"agent idle 10 s: {waiting} context switches waiting for the service, {registered} registered "
          f"(target 0: {'met' if waiting == 0 and registered == 0 else 'MISSED'}); the service beside it: {service_idle}")
    print(f"memory: agent VmRSS {agent_rss} KiB (Private_Dirty {agent_dirty}), service VmRSS {service_rss} KiB "
          f"(Private_Dirty {service_dirty}) (target agent <= service: {'met' if agent_rss <= service_rss else 'MISSED'})")


if __name__ == "__main__":
    main()
