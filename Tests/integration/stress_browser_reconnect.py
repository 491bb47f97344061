"""Stress of the browser layer's reconnecting (not collected by pytest):
with a session that needs the browser, devtools_fake.py sends garbage on
the live WebSocket again and again; each time the service must drop the
connection, open a new one (/json/version, then the WebSocket) and show the
session's look in every page on it, within a second. Counts the reconnects
that took longer (a handshake whose answer was never seen waits for the 2 s
open timeout) and fails at once if the service dies.

    /usr/bin/python3 Tests/integration/stress_browser_reconnect.py [--cycles 300] [--pages 2]

GUIDEDACCESSD overrides the binary, as for the integration tests.
"""

import argparse
import sys
import time

import gadaemon
from devtools_fake import FakeDevTools, frame


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--pages", type=int, default=2)
    args = parser.parse_args()
    env = gadaemon.GAEnv()
    fake = FakeDevTools(pages=args.pages)
    slow = []
    try:
        env.stand_for_no_desktop()
        daemon = env.start_daemon(config=env.write_config(fake.config()))
        rc, _, err = env.busctl_call("StartSession", *gadaemon.busctl_options(features=["invert-colors"]))
        assert rc == 0, err
        pages = [target for target, _ in fake.pages]

        def shown_on_latest():
            latest = fake.websockets()[-1].number
            return all(any(m.conn == latest and m.target == page and m.method == "Runtime.evaluate"
                           and "invert(1)" in m.params.get("expression", "") for m in fake.messages)
                       for page in pages)

        for cycle in range(1, args.cycles + 1):
            before = len(fake.websockets())
            started = time.monotonic()
            fake.inject(frame(0x2, b"garbage"))
            quick = fake.wait(lambda: len(fake.websockets()) > before and shown_on_latest(), 1.0)
            if not quick:
                slow.append(cycle)
                fake.wait(lambda: len(fake.websockets()) > before and shown_on_latest(), 5.0)
                print(f"cycle {cycle}: reconnected and shown after {time.monotonic() - started:.2f} s", flush=True)
            if not daemon.alive():
                print(f"cycle {cycle}: guidedaccessd died\n{daemon.log()[-6000:]}")
                return 1
        print(f"{args.cycles} reconnects, {len(slow)} slower than 1 s: {slow}")
        lines = [line for line in daemon.log().splitlines() if "no WebSocket from" in line or "no answer from" in line]
        for line in lines:
            print(line)
        return 1 if slow else 0
    finally:
        fake.close()
        env.stop()


if __name__ == "__main__":
    sys.exit(main())
