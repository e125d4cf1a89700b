"""One fleet instance as a process, for tests/test_fleet.py: an engine on a
manual clock synced through Redis by ``RedisFleet.sync_once``, driven by one
command per line on stdin (``call STATUS``, ``sync``, ``advance MS``, ``state``,
``quit``), one answer per line on stdout.

    python fleet_node.py NAME QUORUM REDIS_URL
"""

from __future__ import annotations

import sys

import redis
import retrywise
from retrywise.fleet import RedisFleet
from test_fleet import POLICY, call  # type: ignore[import-not-found]  # run as a script from tests/


def main(name: str, quorum: str, url: str) -> None:
    engine = retrywise.Engine(POLICY, seed=7, manual_clock=True)
    sync = RedisFleet(engine.fleet(instance=name, quorum=int(quorum)), url)
    for line in sys.stdin:
        cmd = line.split()
        if cmd == ["quit"]:
            break
        if cmd[0] == "call":
            reply = call(engine, int(cmd[1]))
        elif cmd[0] == "advance":
            engine.advance_clock(int(cmd[1]))
            reply = "ok"
        elif cmd[0] == "state":
            reply = engine.breaker_state("up")
        elif cmd[0] == "sync":
            try:
                r = sync.sync_once()
                reply = " ".join(f"{k}={v}" for k, v in r.items() if v)
            except redis.RedisError as e:
                reply = f"error {type(e).__name__}"
        else:
            reply = f"unknown command {line!r}"
        print(reply, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
