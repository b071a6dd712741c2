"""A synthetic application log: bursts, very long lines and invalid UTF-8, written to stdout."""

from __future__ import annotations

import random
import sys
import time

SERVICES = ["api", "db", "cache", "auth", "worker"]
EVENTS = [
    "request served in {ms} ms",
    "connection pool at {n}/64",
    "cache miss for key user:{n}",
    "retrying job {n} after timeout",
    "login failed for user {n}",
    "slow query took {ms} ms",
]


def main(
    lines: int = 20000, burst: int = 2000, pause: float = 0.5, seed: int = 7, error_every: int = 0
) -> None:
    """`error_every`: a line of a new error template at each multiple of it (line numbers from 1)."""
    rng = random.Random(seed)
    out = sys.stdout.buffer
    for i in range(lines):
        svc = rng.choice(SERVICES)
        msg = rng.choice(EVENTS).format(ms=rng.randint(1, 900), n=rng.randint(1, 9999))
        line = f"2026-11-29T12:{i // 60 % 60:02d}:{i % 60:02d} {svc} INFO {msg}".encode()
        if i % 997 == 0:
            line += b" payload=" + b"x" * 5000  # a very long line
        if i % 1499 == 0:
            line += b" bad bytes \xff\xfe\xc3"  # invalid UTF-8
        if error_every and (i + 1) % error_every == 0:
            line = f"2026-11-29T12:00:00 disk{(i + 1) // error_every} ERROR write failed".encode()
        out.write(line + b"\n")
        if (i + 1) % burst == 0:
            out.flush()
            time.sleep(pause)
    out.flush()


if __name__ == "__main__":
    main(*(int(a) if i != 2 else float(a) for i, a in enumerate(sys.argv[1:])))
