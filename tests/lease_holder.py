"""A process that holds an application's lease and "commits" while it may, for
the lease tests: ``python -m tests.lease_holder LEASE_URI TTL NAME``.

It prints ``held <generation>`` once it has the lease, then every 0.1 s checks the
lease and creates one commit object, ``<app>/commits/<NAME>-<n>``, as a batch
commit would after its check. A lost lease ends it with one ``error:`` line."""

from __future__ import annotations

import sys
import time

from jobs import lease
from jobs.warehouse import Location


def main() -> int:
    location, ttl_s, name = Location.parse(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    try:
        held = lease.take(location, f"run of {name}", name, ttl_s)
    except lease.LeaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"held {held.generation}", flush=True)
    for n in range(1_000_000):
        time.sleep(0.1)
        try:
            held.check()
        except lease.LeaseError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        (location.parent / "commits" / f"{name}-{n:06d}").create(b"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
