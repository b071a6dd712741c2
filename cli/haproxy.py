"""HAProxy as the drain sees it: its runtime API (a Unix socket, level admin) to mark a node, to
read its state and its requests in flight, and the ring itself, asked where a key goes now.

The ring is asked, not computed: a probe through the proxy's HTTP frontend carries the key in
`x-sinkd-route` (the frontend sets that header only from a bearer token, and the probe sends
none) and the answer's `x-sinkd-node` names the server HAProxy chose. So the drain moves each
session exactly where the proxy will send its tenant's next request, whatever HAProxy's hashing.
"""

from __future__ import annotations

import csv
import http.client
import io
import socket
import time
from pathlib import Path

from sinkd.cli.deployment import GRPC_BACKEND, HTTP_BACKEND, NODE_HEADER, ROUTE_HEADER
from sinkd.errors import DaemonUnavailable, DeadlineExceeded, FailedPrecondition

STATES = ("ready", "drain", "maint")


class RuntimeApi:
    def __init__(self, admin_socket: Path, timeout_s: float = 5.0) -> None:
        self.path = admin_socket
        self.timeout_s = timeout_s

    def command(self, line: str) -> str:
        """One command, its whole answer (the socket closes after it)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout_s)
            try:
                s.connect(str(self.path))
            except OSError as e:
                raise DaemonUnavailable(f"HAProxy's runtime API at {self.path}: {e}") from None
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def set_state(self, server: str, state: str) -> None:
        """ready, drain or maint, on the HTTP backend (the gRPC servers track it)."""
        if state not in STATES:
            raise ValueError(state)
        answer = self.command(f"set server {HTTP_BACKEND}/{server} state {state}").strip()
        if answer:  # silence is success
            raise FailedPrecondition(f"HAProxy refused {state} for {server}: {answer}")

    def stats(self) -> dict[tuple[str, str], dict[str, str]]:
        """`show stat`, by (backend, server)."""
        text = self.command("show stat").lstrip("# ")
        return {(r["pxname"], r["svname"]): r for r in csv.DictReader(io.StringIO(text))}

    def status(self, server: str) -> str:
        """The server's status on the HTTP backend: UP, DOWN, DRAIN, MAINT, ..."""
        return self.stats()[(HTTP_BACKEND, server)]["status"]

    def in_flight(self, server: str) -> int:
        """Requests the proxy has open to the node, both protocols."""
        rows = self.stats()
        return sum(int(rows[(b, server)]["scur"] or 0) for b in (HTTP_BACKEND, GRPC_BACKEND))

    def wait_idle(self, server: str, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while (n := self.in_flight(server)) > 0:
            if time.monotonic() > end:
                raise DeadlineExceeded(
                    f"{server} still has {n} requests in flight after {deadline_s:g} s"
                )
            time.sleep(0.1)


def where(proxy_http: str, key: str, timeout_s: float = 5.0) -> str:
    """The node the proxy sends this route key to now (a probe of /health, no token)."""
    host, _, port = proxy_http.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        conn.request("GET", "/health", headers={ROUTE_HEADER: key})
        answer = conn.getresponse()
        answer.read()
        node = answer.getheader(NODE_HEADER)
    except OSError as e:
        raise DaemonUnavailable(f"the proxy at {proxy_http}: {e}") from None
    finally:
        conn.close()
    if not node:
        raise DaemonUnavailable(
            f"the proxy at {proxy_http} sent the probe to no node ({answer.status}): none is up"
        )
    return node
