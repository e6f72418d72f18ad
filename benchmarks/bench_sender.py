"""One sender's ceiling: how many short 384-d vectors a second one sender process moves, and its CPU per vector.

Not a test: it prints numbers. In a run every request to the servers is a sender's
(``pipeline/senders/``), and one sender serves up to four servers on one event loop, so its ceiling
bounds what a run gets from fast GPUs. This measures that loop alone, with servers faster than it:

* ``--servers`` *canned* servers, each its own process: an aiohttp app that answers
  ``/v1/embeddings`` at once with a body prepared per input count (unit vectors of ``--dims``,
  base64, as TEI answers ``encoding_format: base64``). They tokenize nothing and embed nothing: what
  they cost is HTTP, about a tenth of the sender's CPU per request;
* the sender, given the servers' limits as a real run's would be (32 texts a request, 512 inputs in
  flight per server), two ways:

  - **in-process**: one :class:`~teibatch.pipeline.senders.core.SenderCore` in this process, given
    the corpus in the chunks shard tasks send (``chunk_size``), all of them at once; its CPU is this
    process's (``time.process_time``);
  - **Ray actor**: the sender as a run has it, a ``SenderActor`` on a private local Ray, and this
    process as one shard task would be (``senders/sending.embedded_in_order``: chunks out over Ray,
    vectors back through Ray's object store); the sender's CPU is its process's (``psutil``), the
    caller's this process's.

Printed per way: vectors/s (wall) and CPU µs per vector, the least of ``--repeats`` runs. The canned
servers run in their own processes, not counted. ``bench_cpu.py`` counts whole runs.

    .venv/bin/python benchmarks/bench_sender.py                       # 300,000 texts, 2 servers
    .venv/bin/python benchmarks/bench_sender.py --texts 20000 --repeats 1 --skip-ray

Only 127.0.0.1 is used; the servers are stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import ray
from corpora import synthetic_text

from teibatch.endpoint import Endpoint
from teibatch.pipeline.ray_runtime import start_local_ray
from teibatch.pipeline.senders.actor import start_senders, stop_senders
from teibatch.pipeline.senders.core import SenderCore
from teibatch.pipeline.senders.plans import SenderPlan, ServerPlan
from teibatch.pipeline.senders.sending import embedded_in_order
from teibatch.tei import ROUTE_OPENAI_BASE64, ClientLimits, EmbedOptions

WORDS = 28  # about 32 tokens a text, as bench_cpu.py's documents
BATCH = 32
INFLIGHT = 512
PAYLOAD = 2_000_000

CANNED_SERVER = textwrap.dedent('''
    import asyncio, base64, sys
    import numpy as np, orjson
    from aiohttp import web

    dimension = int(sys.argv[1])
    row = base64.b64encode(np.full(dimension, 1 / np.sqrt(dimension), dtype="<f4").tobytes()).decode()
    bodies = {}

    async def embeddings(request):
        count = len(orjson.loads(await request.read())["input"])
        if count not in bodies:
            data = [{"object": "embedding", "embedding": row, "index": i} for i in range(count)]
            bodies[count] = orjson.dumps({"object": "list", "data": data, "model": "canned",
                                          "usage": {"prompt_tokens": count, "total_tokens": count}})
        return web.Response(body=bodies[count], content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_post("/v1/embeddings", embeddings)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
''')


@dataclass
class Measured:
    vectors: int
    wall_s: float
    cpu_s: float  # the sender's
    caller_cpu_s: float | None = None  # with the Ray actor: this process's, the shard task's side

    @property
    def per_second(self) -> float:
        return self.vectors / self.wall_s

    @property
    def cpu_us_per_vector(self) -> float:
        return self.cpu_s / self.vectors * 1e6


@contextlib.contextmanager
def canned_servers(count: int, dimension: int) -> Iterator[list[Endpoint]]:
    """``count`` canned servers on 127.0.0.1, each in its own process; stopped on exit."""
    processes: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            processes.append(subprocess.Popen([sys.executable, "-c", CANNED_SERVER, str(dimension)],
                                              stdout=subprocess.PIPE, text=True))
        ports = [int(process.stdout.readline()) for process in processes if process.stdout is not None]
        if len(ports) != count:
            raise RuntimeError("a canned server did not start")
        yield [Endpoint(f"http://127.0.0.1:{port}") for port in ports]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def sender_plan(endpoints: list[Endpoint], dimension: int) -> SenderPlan:
    limits = ClientLimits(max_batch_size=BATCH, max_inflight_inputs=INFLIGHT, payload_limit=PAYLOAD)
    return SenderPlan(tuple(ServerPlan(endpoint, limits) for endpoint in endpoints), route=ROUTE_OPENAI_BASE64,
                      embed=EmbedOptions(), dimension=dimension, model_id="canned")


async def send_all(plan: SenderPlan, texts: list[str]) -> Measured:
    """Every text through one sender, in chunks of its chunk size, all chunks at once (oldest first)."""
    core = SenderCore(plan)
    try:
        await core.connect()
        size = plan.chunk_size
        chunks = [texts[start:start + size] for start in range(0, len(texts), size)]
        wall, cpu = time.perf_counter(), time.process_time()
        results = await asyncio.gather(*(core.embed(chunk, priority=float(i)) for i, chunk in enumerate(chunks)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await core.close()
    done = sum(int(result.ok.sum()) for result in results)
    if done != len(texts):
        raise RuntimeError(f"{len(texts) - done} of {len(texts)} texts came back without a vector")
    return Measured(done, wall, cpu)


def send_through_ray(plan: SenderPlan, texts: list[str]) -> Measured:
    """Every text through one ``SenderActor``, sent from this process as a shard task sends its texts."""
    (sender,), _ = start_senders([plan])
    try:
        ray.get(sender.actor.warm.remote())
        process = _sender_process()
        before = process.cpu_times()
        wall, cpu = time.perf_counter(), time.process_time()
        done = sum(int(result.ok.sum()) for _, result in embedded_in_order(texts, [sender]))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        after = process.cpu_times()
    finally:
        stop_senders([sender.actor])
    if done != len(texts):
        raise RuntimeError(f"{len(texts) - done} of {len(texts)} texts came back without a vector")
    return Measured(done, wall, (after.user + after.system) - (before.user + before.system), cpu)


def _sender_process() -> psutil.Process:
    """The process of the one sender actor alive (Ray names it after the actor's class)."""
    found = [p for p in psutil.process_iter(["cmdline"]) if "ray::SenderActor" in " ".join(p.info["cmdline"] or [])]
    if len(found) != 1:
        raise RuntimeError(f"expected one sender process, found {len(found)}")
    return found[0]


def _row(way: str, runs: list[Measured]) -> str:
    best = min(runs, key=lambda run: run.cpu_us_per_vector)
    caller = f"{best.caller_cpu_s / best.vectors * 1e6:.1f}" if best.caller_cpu_s is not None else "–"
    each = "; ".join(f"{run.per_second:,.0f}, {run.cpu_us_per_vector:.1f}" for run in runs)
    return f"| {way} | {best.per_second:,.0f} | {best.cpu_us_per_vector:.1f} | {caller} | {each} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=300_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--servers", type=int, default=2, help="canned servers (a sender serves up to 4)")
    parser.add_argument("--repeats", type=int, default=3, help="runs each way; the least CPU per vector is shown")
    parser.add_argument("--skip-ray", action="store_true", help="only the in-process sender")
    args = parser.parse_args()
    texts = [synthetic_text(i, WORDS) for i in range(args.texts)]
    print(f"# bench_sender on {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    with canned_servers(args.servers, args.dims) as endpoints:
        plan = sender_plan(endpoints, args.dims)
        in_process = [asyncio.run(send_all(plan, texts)) for _ in range(args.repeats)]
        through_ray = []
        if not args.skip_ray:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            start_local_ray()
            try:
                through_ray = [send_through_ray(plan, texts) for _ in range(args.repeats)]
            finally:
                ray.shutdown()
    print(f"one sender, {args.servers} canned servers, {args.texts:,} texts of ~32 tokens, {args.dims}-d base64, "
          f"chunks of {plan.chunk_size:,}")
    print("| sender | vectors/s (wall) | sender CPU µs per vector | caller CPU µs per vector "
          "| each run: vectors/s, µs |")
    print("|---|---:|---:|---:|---|")
    print(_row("in-process (SenderCore)", in_process))
    if through_ray:
        print(_row("Ray actor, chunks from a task", through_ray))
    return 0


if __name__ == "__main__":
    sys.exit(main())
