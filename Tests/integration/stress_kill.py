#!/usr/bin/python3
"""Long kill -9 stress for guidedaccessd (not collected by pytest).

    /usr/bin/python3 Tests/integration/stress_kill.py --kills 200 [--seed N] [--drivers 2]

A private session bus with real dconf and a private HOME/XDG_* (as the
integration tests), guidedaccessd --user on it, a baseline of user-set and
unset keys; then `--kills` times: busctl one-shot loops of StartSession /
ConfigureForSession / EndSession with calls in flight, kill -9 at a random
point, restart, EndSession if a session is active, and every mapped key
compared with the baseline (`dconf read`). Exits 0 when no key was ever left
wrong, 1 otherwise (with the seed to reproduce it and the daemon's log).
"""

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gadaemon  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--drivers", type=int, default=2, help="concurrent busctl loops (calls in flight)")
    parser.add_argument("--max-delay", type=float, default=0.4, help="longest run before a kill, seconds")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"stress_kill: {args.kills} kills, seed {seed}, {args.drivers} drivers, daemon {gadaemon.DAEMON_BINARY}")

    env = gadaemon.GAEnv(prefix="/tmp/ga-stress-")
    started = time.monotonic()
    try:
        daemon = env.start_daemon()
        env.gsettings_set(gadaemon.MAGNIFIER, "mag-factor", "3.0")
        env.gsettings_set(gadaemon.DESKTOP_IFACE, "enable-animations", "true")
        env.gsettings_set(gadaemon.A11Y_APPS, "screen-reader-enabled", "false")
        env.gsettings_set(gadaemon.DESKTOP_IFACE, "text-scaling-factor", "1.25")
        baseline = env.snapshot()

        def log(line):
            if args.verbose:
                print(line, flush=True)

        def progress(line):
            log(line)
            n = int(line.split()[1].rstrip(":"))
            if not args.verbose and n % 25 == 0:
                print(f"  {n} kills, {time.monotonic() - started:.1f} s", flush=True)

        stats = gadaemon.kill_loop(env, daemon, args.kills, random.Random(seed), baseline, log=progress,
                                   drivers=args.drivers, delay=(0.02, args.max_delay))
    except (AssertionError, RuntimeError, TimeoutError) as error:
        print(f"FAIL (seed {seed}): {type(error).__name__}: {error}")
        for title, text in env.logs():
            print(f"----- {title} (last 6000 chars)\n{text[-6000:]}")
        return 1
    finally:
        env.stop()
    calls = ", ".join(f"{member} {'ok' if good else 'failed'}: {count}"
                      for (member, good), count in sorted(stats["calls"].items()))
    print(f"PASS: {stats['kills']} kills in {time.monotonic() - started:.1f} s, "
          f"{stats['session_active_after_restart']} with a session active after restart "
          f"({stats['keys_on_after_restart']} with keys on); no key left wrong")
    print(f"calls: {calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
