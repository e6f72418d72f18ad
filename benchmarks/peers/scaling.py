"""teibatch as the fleet and the corpus grow: busy share and client CPU per million vectors.

For each point of the grid this starts fresh built-in servers (simulated GPUs with TEI 1.9's
default limits, as in ``run.py``) and runs teibatch the way ``run.py`` does (``run_job`` on a job
file with ``servers.urls``, in its own measured process), then reads the servers' counters and
counts the ids in the output. The fleet's speed is fixed in all (``--fleet-rate`` tokens/s, split
evenly between its servers), so the client has the same work per second at every server count and
a 2-core machine can carry it: what changes from point to point is how many servers the work is
spread over, and how much of it there is.

Grid: every ``--servers`` count × every ``--documents`` size × every ``--dimensions``, plus
``--big`` documents at the largest server count (each dimension). Documents are short (median
``--median-tokens``) so that a million of them take minutes. Prints a Markdown table; writes
``scaling.json`` beside this file. Traffic goes only to 127.0.0.1.

    .venv/bin/python scaling.py                               # the whole grid (about 15 minutes on 2 idle cores)
    .venv/bin/python scaling.py --servers 2 --documents 10000 --big 0 --dimensions 384   # one point
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from peerbench.corpus import CorpusInfo, write_corpus
from peerbench.measure import Measurement, become_subreaper
from peerbench.registry import select
from peerbench.runner import Slot, launch
from peerbench.servers import Fleet, FleetStats

HERE = Path(__file__).resolve().parent
START_UP_ALLOWANCE_S = 120.0


@dataclass
class Point:
    servers: int
    documents: int
    dimension: int
    measurement: Measurement
    stats: FleetStats
    rows: int
    distinct: int

    @property
    def lost(self) -> int:
        return self.documents - self.distinct

    @property
    def duplicates(self) -> int:
        return self.rows - self.distinct

    @property
    def cpu_per_million(self) -> float:
        return self.measurement.cpu_s / self.distinct * 1e6 if self.distinct else 0.0

    def to_json(self) -> dict[str, Any]:
        m = self.measurement
        return {"servers": self.servers, "documents": self.documents, "dimension": self.dimension,
                "status": m.status, "error": m.error, "wall_s": round(m.wall_s, 2), "cpu_s": round(m.cpu_s, 2),
                "cpu_s_per_million_vectors": round(self.cpu_per_million, 1), "peak_mib": round(m.peak_mib, 1),
                "vectors": self.distinct, "lost": self.lost, "duplicates": self.duplicates,
                "servers_stats": self.stats.to_json()}


def output_ids(output: Path) -> tuple[int, int]:
    """Rows in the output's vectors parts, and distinct ids among them."""
    parts = output / "vectors"
    if not parts.is_dir():
        return 0, 0
    ids = ds.dataset(parts, format="parquet").to_table(columns=["id"]).column("id")
    return len(ids), len(ids.unique())


def run_point(corpus: CorpusInfo, servers: int, dimension: int, fleet_rate: float, slot: Slot) -> Point:
    """Fresh servers, one measured teibatch run, then what the servers counted and the output holds."""
    (contestant,) = select(["teibatch"])
    slot.fresh()
    with Fleet(servers, fleet_rate / servers, dimension=dimension) as fleet:
        limit_s = 3 * corpus.tokens / fleet_rate + START_UP_ALLOWANCE_S
        measurement = launch(contestant, fleet, corpus.path, slot, limit_s)
        stats = fleet.stats()
    rows, distinct = output_ids(slot.output)
    return Point(servers, corpus.documents, dimension, measurement, stats, rows, distinct)


def table(points: list[Point]) -> str:
    lines = ["| servers | documents | dimension | wall s | docs/s | busy share (lowest server) | client CPU s | "
             "CPU s / 1M vectors | peak MiB | lost / duplicates | limit violations |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        m, s = p.measurement, p.stats
        refused = sum(n for status, n in s.statuses.items() if status in ("413", "422", "429"))
        violations = sum(s.violations.values()) + refused
        status = "" if m.status == "done" else f" ({m.status}: {m.error})"
        lines.append(f"| {p.servers} | {p.documents:,} | {p.dimension} | {m.wall_s:.1f}{status} | "
                     f"{p.distinct / m.wall_s:,.0f} | {s.busy_share:.3f} ({min(s.busy_shares):.3f}) | "
                     f"{m.cpu_s:.1f} | {p.cpu_per_million:,.0f} | {m.peak_mib:,.0f} | {p.lost:,} / {p.duplicates:,} | "
                     f"{violations or 'none'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--documents", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--big", type=int, default=1_000_000,
                        help="documents of the extra points at the largest server count (0: none)")
    parser.add_argument("--dimensions", type=int, nargs="+", default=[384, 1024])
    parser.add_argument("--fleet-rate", type=float, default=200_000, help="tokens/s of the whole fleet")
    parser.add_argument("--median-tokens", type=int, default=32)
    parser.add_argument("--results", type=Path, default=HERE / "scaling.json")
    parser.add_argument("--workdir", type=Path, help="keep corpora, outputs and logs here (default: a temp folder)")
    args = parser.parse_args()
    grid = [(n, docs, dim) for docs in args.documents for n in args.servers for dim in args.dimensions]
    grid += [(max(args.servers), args.big, dim) for dim in args.dimensions] if args.big else []
    become_subreaper()
    started = time.monotonic()
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="teibatch-scaling-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpora: dict[int, CorpusInfo] = {}
        for servers, documents, dimension in grid:
            if documents not in corpora:
                corpora[documents] = write_corpus(work / f"corpus-{documents}", documents, bad=False,
                                                  median_tokens=args.median_tokens)
            corpus = corpora[documents]
            slot = Slot(work / "points" / f"{servers}-{documents}-{dimension}")
            point = run_point(corpus, servers, dimension, args.fleet_rate, slot)
            points.append(point)
            print(f"{servers} servers, {documents:,} documents, {dimension} dims: {point.measurement.status} in "
                  f"{point.measurement.wall_s:.1f} s, busy {point.stats.busy_share:.3f}, "
                  f"CPU {point.measurement.cpu_s:.1f} s ({point.cpu_per_million:,.0f} per 1M vectors), "
                  f"lost {point.lost}, duplicates {point.duplicates}", flush=True)
    elapsed = time.monotonic() - started
    print()
    print(table(points))
    settings = {"fleet_rate": args.fleet_rate, "median_tokens": args.median_tokens,
                "corpus_tokens": {str(d): c.tokens for d, c in corpora.items()}, "elapsed_s": round(elapsed, 1)}
    args.results.write_text(json.dumps({"settings": settings, "python": platform.python_version(),
                                        "points": [p.to_json() for p in points]}, indent=1) + "\n")
    print(f"\nresults: {args.results}  ({elapsed:.0f} s in all)")


if __name__ == "__main__":
    main()
