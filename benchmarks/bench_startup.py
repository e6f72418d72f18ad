"""How long does a small job take from the command line? The first-hour experience, split by phase.

Writes a 100-document corpus, runs ``teibatch run`` in a fresh process (a private local Ray, two
built-in servers) ``--repeat`` times, and prints the wall time of the command and, from the run
report, the split: planning, Ray start-up, servers start-up (with the handshake), embedding, total.
Baseline in the same run: the bare start-up with the run's imports, the cost no
run can avoid. Target: the whole command under 8 s on an idle 2-core machine.

    .venv/bin/python benchmarks/bench_startup.py
    .venv/bin/python benchmarks/bench_startup.py --documents 1000 --repeat 5

Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import yaml
from corpora import write_jsonl_corpus

# ray_start runs in the background while the servers start (fleet_up); ray_wait is what the run
# still waited for it after the servers were up; warm_up starts the senders and the first workers
# (only what of it did not overlap meeting the servers).
PHASES = ("plan_s", "ray_start_s", "fleet_up_s", "ray_wait_s", "warm_up_s", "embed_s", "total_s")


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    # A user's environment: no Ray address, Ray's default authentication, and Python caching the
    # bytecode it compiles (some sandboxes and CI images turn that off; users' machines do not).
    unset = ("RAY_ADDRESS", "RAY_AUTH_MODE", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    imports = [sys.executable, "-c", "import teibatch.cli, teibatch.pipeline.run"]
    import_s = statistics.median(timed(imports, env) for _ in range(3))
    rows = []
    for attempt in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="teibatch-bench-startup-") as tmp_name:
            tmp = Path(tmp_name)
            write_jsonl_corpus(tmp / "corpus", args.documents, 40, files=1)
            job = tmp / "job.yaml"
            job.write_text(yaml.safe_dump({"corpus": {"path": str(tmp / "corpus"), "id_field": "id"},
                                           "output": {"path": str(tmp / "out")}}))
            wall = timed([sys.executable, "-m", "teibatch", "run", str(job), "-q"], env)
            (report,) = (tmp / "out" / "runs").iterdir()
            timings = orjson.loads(report.read_bytes())["timings"]
            rows.append((wall, [timings.get(p, 0.0) for p in PHASES]))
            print(f"run {attempt + 1}: {wall:.2f}s  " + "  ".join(f"{p} {t:.2f}" for p, t in zip(PHASES, rows[-1][1],
                                                                                               strict=True)))
    walls = [w for w, _ in rows]
    medians = [statistics.median(r[1][i] for r in rows) for i in range(len(PHASES))]
    print(f"\n{args.documents} documents, median of {len(rows)}: command {statistics.median(walls):.2f}s "
          f"(import baseline {import_s:.2f}s)")
    print("| phase | seconds |\n|---|---|")
    print(f"| python + imports (baseline) | {import_s:.2f} |")
    for phase, value in zip(PHASES, medians, strict=True):
        print(f"| {phase.removesuffix('_s')} | {value:.2f} |")
    print(f"| whole command | {statistics.median(walls):.2f} |")
    print(f"target < 8 s: {'ok' if statistics.median(walls) < 8 else 'OVER'}")


if __name__ == "__main__":
    main()
