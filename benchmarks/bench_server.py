"""Does ``teibatch serve --simulate-gpu`` reach its configured capacity, and at what CPU cost?

Starts ``python -m teibatch.server --simulate-gpu RATE`` as a subprocess on a free loopback port,
keeps it saturated with concurrent ``/embed`` requests (each ``--batch`` documents of about
``--words`` words) for ``--duration`` seconds after a warm-up, then prints the tokens/s the server
embedded (from its ``/teibatch/stats``), the ratio to the configured rate, and the CPU seconds the
server process used per wall second (from ``/proc``). All traffic goes to 127.0.0.1; the run is
bounded by ``--duration`` and stops the server at the end.

Run::

    .venv/bin/python benchmarks/bench_server.py --rate 50000 --duration 10

Exit code 1 when the achieved rate is not within ``--tolerance`` (default 10%) of the capacity
the model allows (``rate`` less the per-batch overhead), so CI can run it as a check.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _documents(count: int, words: int) -> list[str]:
    vocabulary = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
                  "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]
    return [" ".join(vocabulary[(i * 7 + j * 3) % len(vocabulary)] + str(j % 10) for j in range(words))
            for i in range(count)]


async def _load(url: str, docs: list[str], batch: int, concurrency: int, until: float) -> int:
    """Send /embed requests from ``concurrency`` workers until ``until``; the number answered 200."""
    ok = 0
    bodies = [orjson.dumps({"inputs": docs[i:i + batch]}) for i in range(0, len(docs) - batch + 1, batch)]

    async def worker(session: aiohttp.ClientSession, offset: int) -> None:
        nonlocal ok
        i = offset
        while time.monotonic() < until:
            async with session.post(f"{url}/embed", data=bodies[i % len(bodies)],
                                    headers={"content-type": "application/json"}) as response:
                await response.read()
                if response.status == 200:
                    ok += 1
            i += 1

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session, k) for k in range(concurrency)))
    return ok


async def _stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/teibatch/stats") as response:
        result: dict[str, Any] = orjson.loads(await response.read())
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50_000.0, help="--simulate-gpu tokens/s")
    parser.add_argument("--overhead", type=float, default=0.002, help="--batch-overhead-s")
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds (after warm-up)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=12, help="requests in flight")
    parser.add_argument("--batch", type=int, default=32, help="documents per request")
    parser.add_argument("--words", type=int, default=60, help="words per document")
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready.json"
        server = subprocess.Popen(
            [sys.executable, "-m", "teibatch.server", "--port", "0", "--ready-file", str(ready),
             "--simulate-gpu", str(args.rate), "--batch-overhead-s", str(args.overhead),
             "--max-batch-tokens", str(args.max_batch_tokens)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not ready.exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    print("the server did not start", file=sys.stderr)
                    return 2
                time.sleep(0.05)
            url = orjson.loads(ready.read_bytes())["url"]
            docs = _documents(args.batch * 50, args.words)
            start = time.monotonic()
            end = start + args.warmup + args.duration

            async def run() -> tuple[int, dict[str, Any], dict[str, Any], float, float, float]:
                load = asyncio.create_task(_load(url, docs, args.batch, args.concurrency, end))
                await asyncio.sleep(args.warmup)
                before, cpu_before, t_before = await _stats(url), _cpu_seconds(server.pid), time.monotonic()
                await asyncio.sleep(args.duration)
                after, cpu_after, t_after = await _stats(url), _cpu_seconds(server.pid), time.monotonic()
                return await load, before, after, cpu_after - cpu_before, t_after - t_before, 0.0

            client_cpu_start = time.process_time()
            answered, before, after, server_cpu, wall, _ = asyncio.run(run())
            client_cpu = time.process_time() - client_cpu_start
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)

    tokens = after["tokens_embedded"] - before["tokens_embedded"]
    inputs = after["inputs_embedded"] - before["inputs_embedded"]
    batches = after["batches"] - before["batches"]
    achieved = tokens / wall
    mean_batch = tokens / max(batches, 1)
    capacity = mean_batch / (args.overhead + mean_batch / args.rate)  # what the model allows at this batch size
    ratio = achieved / args.rate
    print(f"configured      {args.rate:>12,.0f} tokens/s  (overhead {args.overhead * 1000:.1f} ms/batch, "
          f"max_batch_tokens {args.max_batch_tokens})")
    print(f"model capacity  {capacity:>12,.0f} tokens/s  at the mean batch of {mean_batch:,.0f} tokens")
    print(f"achieved        {achieved:>12,.0f} tokens/s  = {ratio:.1%} of configured, "
          f"{achieved / capacity:.1%} of capacity")
    print(f"measured        {wall:.1f} s, {inputs:,} inputs, {batches:,} batches, {answered:,} requests answered")
    print(f"server CPU      {server_cpu:.2f} s = {server_cpu / wall:.1%} of one core")
    print(f"client CPU      {client_cpu:.2f} s (load generator, whole run)")
    violations = {k: v for k, v in after["violations"].items() if v}
    if violations:
        print(f"violations      {violations}")
    return 0 if abs(achieved / capacity - 1) <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
