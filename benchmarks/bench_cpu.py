"""Client CPU per million vectors, whole run: teibatch, the tuned asyncio loop and the one-process floor.

For each contestant, fresh built-in servers (the hashing model at ``--dims``, fast enough not to be
the bottleneck; with ``--real-gpu``, 2 servers simulating a GPU at 600,000 tokens/s each) and the
same deterministic corpus of short documents (40 tokens each by BERT's WordPiece). Contestants, each
run as a process of its own:

* **teibatch** — the CLI, ``teibatch run job.yaml`` (Ray, shard tasks, senders, Parquet);
* **loop** — ``benchmarks/peers``' tuned asyncio loop (``asyncio_loop`` variant ``budget``: one httpx
  client, per server exactly its in-flight budget in full batches, JSONL in, one Parquet file out);
* **floor** — with ``--floor PATH``, that script (one process, aiohttp, canned server of its own);
  it reports its own CPU (``time.process_time``, its server not counted). Without it, no floor row.

Client CPU is the CPU of every process of the contestant's tree, not the servers':

1. this script is a *child subreaper*, so processes the contestant leaves behind (Ray's daemons)
   become its children and are reaped here, their CPU included;
2. exact times of every process that was waited for, up to this script: the rise of
   ``getrusage(RUSAGE_CHILDREN)`` once the contestant and its orphans are reaped (the servers,
   still running, are not in it);
3. live sampling (every 0.1 s, each process's own user + system) of the processes whose accounting
   is lost: those under Ray's raylet, which ignores ``SIGCHLD`` so its workers' CPU never reaches a
   parent's account, and any still running after a grace period (then stopped). Such a process
   loses at most its last 0.1 s. A worker whose raylet ends before it is orphaned to this script
   and reaped here: its exact CPU is then in 2., and its samples are dropped (counted once).

The output is checked: one row per document, no duplicate id (the floor: its vector count).

A GPU's 600,000 tokens/s are the model's own tokens (WordPiece, as in bge-small and e5-small). The
built-in server counts tokens by its own rule, which gives these documents about 55 where WordPiece
gives 40, and it simulates a GPU in its own tokens; so ``--real-gpu`` counts a sample of the corpus
both ways (WordPiece: the tokenizer all-MiniLM-L6-v2 ships with, BERT's uncased vocabulary) and sets
each server's ``--simulate-gpu`` to the rate in its own tokens that embeds the corpus as fast as
600,000 WordPiece tokens/s do (~15,000 of these documents a second per server).

    .venv/bin/python benchmarks/bench_cpu.py --docs 100000 --dims 384 --floor PATH/floor.py
    .venv/bin/python benchmarks/bench_cpu.py --docs 100000 --real-gpu --json out.json

Only 127.0.0.1 is used; every server is stopped at the end of its contestant's run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow.parquet as pq
import yaml
from corpora import write_jsonl_corpus
from server_stats import batch_fill, busy_share, idle_waits

from teibatch.fleet import LocalProvider
from teibatch.server.backends.hf_tokenizer import HFTokenizer
from teibatch.server.backends.numpy_bert import model_dir
from teibatch.server.tokens import ApproxTokenizer

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
CONTESTANTS = ("teibatch", "loop", "floor")
WORDS = 28  # "doc N" + 28 words: about 32 tokens a document
FILES = 8
SAMPLE_S = 0.1
GRACE_S = 15.0
REAL_GPU_RATE = 600_000
"""One simulated GPU's speed, in the model's WordPiece tokens a second."""
RATE_SAMPLE_DOCS = 2_000
WORDPIECE_MODEL = "all-MiniLM-L6-v2"  # its tokenizer: BERT's uncased WordPiece, as bge-small's and e5-small's
REAL_GPU_SERVERS = 2
KEY_ENV = "BENCH_CPU_TEI_KEY"
PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Row:
    contestant: str
    docs: int
    dims: int
    wall_s: float
    cpu_s: float
    rows: int
    sampled_cpu_s: float = 0.0  # the part of cpu_s from live sampling (raylet's workers, leftovers)
    busy_mean: float | None = None
    busy_min: float | None = None
    ratio_to_floor: float | None = None
    idle_waits: list[str] = field(default_factory=list)  # per server: its longest waits between batches
    servers_cpu_s: float | None = None  # the servers' own CPU while this contestant ran (they share the machine)

    @property
    def docs_per_s(self) -> float:
        return self.docs / self.wall_s

    @property
    def cpu_per_million(self) -> float:
        return self.cpu_s / self.rows * 1e6


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Unaccounted:
    """Samples the CPU of processes whose times never reach a parent's account (see the module's 3.)."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.lost: dict[int, float] = {}  # pid -> own CPU at its last sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> list[psutil.Process]:
        """Record the processes under a raylet; return every live descendant (servers excluded)."""
        tree = [p for p in psutil.Process().children(recursive=True) if p.pid not in self.exclude]
        under_raylet: set[int] = set()
        for process in tree:  # parents come before their children in psutil's walk
            with contextlib.suppress(psutil.Error):
                parent = process.ppid()
                if parent in under_raylet or psutil.Process(parent).name() == "raylet":
                    under_raylet.add(process.pid)
                    cpu = process.cpu_times()
                    self.lost[process.pid] = cpu.user + cpu.system
        return tree

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def __enter__(self) -> Unaccounted:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def running(process: psutil.Process) -> bool:
    """Alive and not a zombie waiting to be reaped (False for one that ended meanwhile)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap_leftovers(exclude: set[int], watch: Unaccounted) -> tuple[float, set[int]]:
    """Reap the contestant's orphans as they end; after :data:`GRACE_S`, count and stop the rest.

    Returns the sampled CPU of those still running at the end (stopped here, their exit not counted),
    and the processes reaped here: their exact CPU is in ``RUSAGE_CHILDREN``, sampled or not (a Ray
    worker whose raylet ended before it is orphaned to this script and reaped here).
    """
    deadline = time.monotonic() + GRACE_S
    reaped: set[int] = set()
    while True:
        mine = [p for p in psutil.Process().children() if p.pid not in exclude]
        for process in mine:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(process.pid, os.WNOHANG)[0]:
                    reaped.add(process.pid)
        alive = [p for p in watch.sample() if running(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(SAMPLE_S)
    left = 0.0
    for process in alive:
        with contextlib.suppress(psutil.Error):
            cpu = process.cpu_times()
            if process.pid not in watch.lost:
                left += cpu.user + cpu.system
            process.kill()
    return left, reaped


def measure(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, float]:
    """Wall and client CPU seconds of ``command`` and every process it starts (servers already running excluded).

    The third figure is the part of the CPU that came from live sampling.
    """
    exclude = {p.pid for p in psutil.Process().children(recursive=True)}
    before = children_cpu()
    started = time.monotonic()
    with Unaccounted(exclude) as watch:
        done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"{command[1]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        left, reaped_here = reap_leftovers(exclude, watch)
        reaped = children_cpu() - before
    for pid in {p.pid for p in psutil.Process().children() if p.pid not in exclude}:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # the leftovers just stopped: reaped after the count, not in it
    sampled = sum(cpu for pid, cpu in watch.lost.items() if pid not in reaped_here) + left  # none counted twice
    return wall, reaped + sampled, sampled


def parquet_rows(root: Path) -> int:
    """Rows under ``root``, checked: no id twice."""
    ids = [i for path in sorted(root.rglob("*.parquet")) for i in pq.read_table(path, columns=["id"])["id"].to_pylist()]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{len(ids) - len(set(ids))} duplicate ids under the output")
    return len(ids)


def server_stats(urls: list[str], key: str) -> list[dict[str, Any]]:
    return [httpx.get(f"{url}/teibatch/stats", headers={"authorization": f"Bearer {key}"}, timeout=10).json()
            for url in urls]


def busy(urls: list[str], key: str) -> tuple[float, float, list[str], float]:
    """Mean and lowest busy share of the servers (model-busy seconds over their span of serving), per
    server its three longest idle waits between batches (``longest_idle_gaps``), and the servers' CPU
    seconds so far (``process_cpu_seconds``, summed)."""
    every = server_stats(urls, key)
    shares = [busy_share(stats) for stats in every]
    waits = [f"{url}: {idle_waits(stats)}; {batch_fill(stats)}" for url, stats in zip(urls, every, strict=True)]
    return sum(shares) / len(shares), min(shares), waits, sum(float(s["process_cpu_seconds"]) for s in every)


@dataclass(frozen=True)
class StandInRate:
    """The ``--simulate-gpu`` rate (the built-in server's tokens/s) of a GPU doing ``REAL_GPU_RATE`` WordPiece
    tokens/s on the corpus."""

    server_tokens: float  # per document, by the built-in server's rule
    wordpiece_tokens: float  # per document, by WordPiece

    @property
    def simulate_gpu(self) -> float:
        return REAL_GPU_RATE * self.server_tokens / self.wordpiece_tokens

    @property
    def docs_per_s(self) -> float:
        """One simulated GPU's documents a second (before its fixed time per batch)."""
        return REAL_GPU_RATE / self.wordpiece_tokens


def stand_in_rate(corpus: Path, docs: int) -> StandInRate:
    """Count about ``RATE_SAMPLE_DOCS`` documents spread over ``corpus`` (of ``docs``) both ways (module doc)."""
    try:
        import tokenizers

        wordpiece = HFTokenizer(tokenizers.Tokenizer.from_file(str(model_dir(WORDPIECE_MODEL) / "tokenizer.json")))
    except ImportError as exc:
        raise SystemExit(f"--real-gpu counts WordPiece tokens with {WORDPIECE_MODEL}'s tokenizer: {exc}") from exc
    every = max(1, docs // RATE_SAMPLE_DOCS)  # spread over the corpus: the numbers in its texts grow
    texts: list[str] = []
    for path in sorted(corpus.glob("*.jsonl")):
        with open(path, "rb") as handle:
            texts += [json.loads(line)["text"] for number, line in enumerate(handle) if number % every == 0]
    return StandInRate(*(sum(map(rule.count, texts)) / len(texts) for rule in (ApproxTokenizer(), wordpiece)))


@contextlib.contextmanager
def servers(dims: int, rate: StandInRate | None) -> Iterator[LocalProvider]:
    args = ["--dimension", str(dims)]
    if rate is not None:
        args += ["--simulate-gpu", f"{rate.simulate_gpu:.0f}"]
    provider = LocalProvider(REAL_GPU_SERVERS, server_args=args)
    provider.up()
    try:
        yield provider
    finally:
        provider.down()


def client_env(key: str) -> dict[str, str]:
    env = {**os.environ, KEY_ENV: key, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    env["PYTHONPATH"] = os.pathsep.join([str(PEERS), *sys.path])
    return env


def teibatch_command(urls: list[str], corpus: Path, out: Path) -> list[str]:
    job = out.parent / "job.yaml"
    job.write_text(yaml.safe_dump({
        "corpus": {"path": str(corpus), "id_field": "id"},
        "servers": {"provider": "static", "urls": urls, "api_key_env": KEY_ENV},
        "output": {"path": str(out)}}))
    return [sys.executable, "-m", "teibatch", "run", str(job)]


def loop_command(urls: list[str], corpus: Path, out: Path) -> list[str]:
    config = out.parent / "loop.json"
    config.write_text(json.dumps({
        "urls": urls, "api_key_env": KEY_ENV, "corpus": str(corpus), "output": str(out), "variant": "budget",
        "model": "hashing", "state": str(out.parent / "state"), "result": str(out.parent / "result.json")}))
    return [sys.executable, str(PEERS / "contestants" / "asyncio_loop.py"), str(config)]


def run_client(name: str, docs: int, dims: int, corpus: Path, work: Path, rate: StandInRate | None) -> Row:
    """One contestant against fresh servers: wall, client CPU, rows checked, busy share."""
    out = work / name / "out"
    out.mkdir(parents=True)
    with servers(dims, rate) as provider:
        urls = [e.url for e in provider.up()]
        build = teibatch_command if name == "teibatch" else loop_command
        started_cpu = sum(float(s["process_cpu_seconds"]) for s in server_stats(urls, provider.api_key))
        wall, cpu, sampled = measure(build(urls, corpus, out), client_env(provider.api_key), PEERS)
        mean, lowest, waits, servers_cpu = busy(urls, provider.api_key)
    rows = parquet_rows(out)
    if rows != docs:
        raise SystemExit(f"{name} wrote {rows} rows for {docs} documents")
    return Row(name, docs, dims, wall, cpu, rows, sampled, busy_mean=mean, busy_min=lowest, idle_waits=waits,
               servers_cpu_s=servers_cpu - started_cpu)


def run_floor(floor: Path, docs: int, dims: int, corpus: Path, work: Path) -> Row:
    """The floor script, aiohttp: its own CPU figure (its canned server not counted), its vector count."""
    report = work / "floor.jsonl"
    started = time.monotonic()
    subprocess.run([sys.executable, str(floor), "--documents", str(docs), "--dimension", str(dims),
                    "--client", "aiohttp", "--corpus", str(corpus), "--json", str(report)],
                   check=True, capture_output=True, cwd=work)
    wall = time.monotonic() - started
    result = json.loads(report.read_text().splitlines()[-1])
    if result["vectors"] != docs:
        raise SystemExit(f"floor embedded {result['vectors']} vectors for {docs} documents")
    return Row("floor", docs, dims, wall, float(result["cpu_s"]), int(result["vectors"]))


def bench(docs: int, dims: int, contestants: list[str], floor: Path | None,
          real_gpu: bool) -> tuple[list[Row], StandInRate | None]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="teibatch-bench-cpu-") as tmp_name:
        work = Path(tmp_name)
        corpus = work / "corpus"
        write_jsonl_corpus(corpus, docs, WORDS, files=FILES)
        rate = stand_in_rate(corpus, docs) if real_gpu else None
        for name in contestants:
            if name != "floor":
                rows.append(run_client(name, docs, dims, corpus, work, rate))
            elif floor is not None:
                rows.append(run_floor(floor, docs, dims, corpus, work))
    by_name = {row.contestant: row for row in rows}
    if "floor" in by_name:
        for row in rows:
            row.ratio_to_floor = row.cpu_per_million / by_name["floor"].cpu_per_million
    return rows, rate


def print_table(rows: list[Row], real_gpu: bool) -> None:
    print("| contestant | docs | dims | wall s | docs/s | client CPU-s | CPU-s per 1M vectors "
          "| ratio to floor (aiohttp) " + ("| busy share mean (min) | servers' CPU-s |" if real_gpu else "|"))
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if real_gpu else ""))
    for row in rows:
        ratio = f"{row.ratio_to_floor:.2f}" if row.ratio_to_floor is not None else "–"
        cpu = f"{row.cpu_s:.1f}" + (f" ({row.sampled_cpu_s:.1f} sampled)" if row.sampled_cpu_s else "")
        line = (f"| {row.contestant} | {row.docs:,} | {row.dims} | {row.wall_s:.1f} | {row.docs_per_s:,.0f} | "
                f"{cpu} | {row.cpu_per_million:.1f} | {ratio} |")
        if real_gpu:
            line += (f" {row.busy_mean:.3f} ({row.busy_min:.3f}) |" if row.busy_mean is not None else " – |")
            line += f" {row.servers_cpu_s:.1f} |" if row.servers_cpu_s is not None else " – |"
        print(line)
    for row in rows:
        if real_gpu and row.idle_waits:
            print(f"\n{row.contestant}: the servers' longest idle waits between batches (from their first batch)")
            print("\n".join(f"  {line}" for line in row.idle_waits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--contestants", default=",".join(CONTESTANTS), help="comma-separated, of: "
                        + ", ".join(CONTESTANTS))
    parser.add_argument("--floor", type=Path, help="the one-process floor script; without it, no floor row")
    parser.add_argument("--real-gpu", action="store_true",
                        help=f"{REAL_GPU_SERVERS} servers simulating a GPU at {REAL_GPU_RATE:,} WordPiece tokens/s "
                             "each")
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    contestants = [c.strip() for c in args.contestants.split(",") if c.strip()]
    unknown = set(contestants) - set(CONTESTANTS)
    if unknown:
        parser.error(f"unknown contestants: {', '.join(sorted(unknown))}")
    if args.docs % FILES:
        parser.error(f"--docs must be a multiple of {FILES} (the corpus is {FILES} equal files)")
    if sys.platform == "linux":  # orphans (Ray's daemons) become this script's children, their CPU counted
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if "floor" in contestants and args.floor is None:
        print("floor not given (--floor PATH): no floor row, no ratio to floor")
    rows, rate = bench(args.docs, args.dims, contestants, args.floor, args.real_gpu)
    print(f"\nclient CPU per million vectors, {args.docs:,} short documents, {args.dims} dims")
    if rate is not None:
        print(f"{REAL_GPU_SERVERS} simulated GPUs at {REAL_GPU_RATE:,} WordPiece tokens/s each "
              f"(documents of {rate.wordpiece_tokens:.1f} WordPiece tokens, {rate.server_tokens:.1f} by the "
              f"server's rule: --simulate-gpu {rate.simulate_gpu:,.0f}), {rate.docs_per_s:,.0f} documents/s each")
    print_table(rows, args.real_gpu)
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "docs_per_s": r.docs_per_s,
                                          "cpu_per_million": r.cpu_per_million} for r in rows], indent=2))


if __name__ == "__main__":
    main()
