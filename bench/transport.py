"""What one streamed token costs in grpcio alone: CPU per message, server and client, no engine.

    python bench/transport.py [--tokens 1200] [--period-ms 8.7] [--rounds 3]
        -> bench/results/transport.json

A server in its own process streams sinkd's `GenerateEvent`s, one per token, handed over from a
producer thread at a decode's cadence, as the engine thread hands them to an RPC thread; the
client here reads them as sinkd's client does (on the iterating thread). Each server's CPU is
counted by thread from /proc, the producer's own thread left out: what is left is the transport's
(the RPC thread, grpc's pollers). On two cores busy with a decode every such millisecond is taken
from the decode (bench/README.md, "overhead.py" and "peer.py"), so this is the floor of what serving a stream
over Python gRPC costs one session. Three servers: grpc's synchronous server (sinkd's: a thread
pool, a generator per stream), its asyncio server yielding from an async generator, and the asyncio
server writing with `context.write`.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import statistics
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from common import table, write

from sinkd.daemon.rpc.client import CHANNEL_OPTIONS
from sinkd.proto.v1 import sinkd_pb2 as pb
from sinkd.proto.v1 import sinkd_pb2_grpc as pb_grpc


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


class Producer:
    """Hands `n` tokens to `put` at a fixed period (sleeping between: no CPU of its own to speak
    of), then None; its thread id is left out of the count."""

    def __init__(self, n: int, period_s: float, put: Any) -> None:
        self.n, self.period_s, self.put = n, period_s, put
        self.tid = 0
        self.cpu0: dict[int, float] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.cpu0 = thread_cpu()
        self.thread.start()

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        due = time.perf_counter()
        for i in range(self.n):
            due += self.period_s
            time.sleep(max(0.0, due - time.perf_counter()))
            self.put(i)
        self.put(None)

    def transport_cpu(self) -> float:
        after = thread_cpu()
        return sum(t - self.cpu0.get(tid, 0.0) for tid, t in after.items() if tid != self.tid)


def event(i: int) -> pb.GenerateEvent:
    return pb.GenerateEvent(token=pb.Token(id=i, text=" word", index=i, latency_ms=8.7))


class SyncServicer(pb_grpc.SessionsServicer):
    def __init__(self, n: int, period_s: float, result: Any) -> None:
        self.n, self.period_s, self.result = n, period_s, result

    def Generate(self, request: Any, context: Any) -> Any:
        events: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        producer = Producer(self.n, self.period_s, events.put)
        producer.start()
        while (i := events.get()) is not None:
            yield event(i)
        self.result.put(producer.transport_cpu())


class AioServicer(pb_grpc.SessionsServicer):
    def __init__(self, n: int, period_s: float, result: Any, write: bool) -> None:
        self.n, self.period_s, self.result, self.write = n, period_s, result, write

    async def Generate(self, request: Any, context: Any) -> Any:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[int | None] = asyncio.Queue()
        producer = Producer(
            self.n, self.period_s, lambda i: loop.call_soon_threadsafe(events.put_nowait, i)
        )
        producer.start()
        while (i := await events.get()) is not None:
            if self.write:
                await context.write(event(i))
            else:
                yield event(i)
        self.result.put(producer.transport_cpu())


def serve(kind: str, address: str, n: int, period_s: float, ready: Any, result: Any) -> None:
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(8))
        pb_grpc.add_SessionsServicer_to_server(SyncServicer(n, period_s, result), server)
        server.add_insecure_port(address)
        server.start()
        ready.set()
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        servicer = AioServicer(n, period_s, result, write=kind == "aio-write")
        pb_grpc.add_SessionsServicer_to_server(servicer, server)
        server.add_insecure_port(address)
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def one_run(kind: str, n: int, period_s: float) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    address = f"unix:{tempfile.mkdtemp()}/t.sock"
    ready, result = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=serve, args=(kind, address, n, period_s, ready, result))
    proc.start()
    try:
        if not ready.wait(60):
            raise RuntimeError(f"the {kind} server did not start")
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        stub = pb_grpc.SessionsStub(channel)  # type: ignore[no-untyped-call]
        t0, c0 = time.perf_counter(), os.times()
        got = sum(1 for _ in stub.Generate(pb.GenerateRequest(max_tokens=n)))
        wall, c1 = time.perf_counter() - t0, os.times()
        server_cpu = result.get(timeout=60)
        channel.close()
    finally:
        proc.terminate()
        proc.join(10)
    if got != n:
        raise RuntimeError(f"{kind}: {got} of {n} messages arrived")
    return {
        "server_ms_per_token": 1000 * server_cpu / n,
        "client_ms_per_token": 1000 * (sum(c1[:2]) - sum(c0[:2])) / n,
        "tokens_per_s": n / wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=1200)
    p.add_argument("--period-ms", type=float, default=8.7)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    kinds = ["sync", "aio", "aio-write"]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for r in range(a.rounds):  # interleaved, the order turned each round
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            runs[kind].append(one_run(kind, a.tokens, a.period_ms / 1000))
    medians = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in runs.items()}
    table(
        f"CPU per streamed token, ms ({a.tokens} tokens, one per {a.period_ms} ms, median of"
        f" {a.rounds} rounds)",
        ["server", "server threads", "client", "both"],
        [[k, m["server_ms_per_token"], m["client_ms_per_token"],
          m["server_ms_per_token"] + m["client_ms_per_token"]] for k, m in medians.items()],
    )  # fmt: skip
    print(f"wrote {write('transport', {'runs': runs, 'medians': medians})}")


if __name__ == "__main__":
    main()
