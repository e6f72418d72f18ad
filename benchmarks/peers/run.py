"""teibatch against its peers: the same corpus, the same simulated GPUs, each contestant as its docs show.

For each contestant this starts fresh built-in TEI servers (``--simulate-gpu RATE`` with TEI 1.9's
default limits and an API key), runs the contestant in its own process under a time limit on a
deterministic corpus with a few bad documents, reads the servers' own counters, and checks every
vector the contestant wrote. A contestant that crashes or loses documents is run again on the corpus
with the bad documents removed (an extra row), so its speed is measured too. Then each library's
resume and skip features are tried on a small clean corpus (see ``peerbench/probe.py``).

Prints a Markdown table and writes ``results.json`` beside this file. Traffic goes only to 127.0.0.1.

    .venv/bin/python run.py                      # everything (28 minutes on 2 idle cores)
    .venv/bin/python run.py --quick              # smoke run: small corpus, no probes (about 3 minutes)
    .venv/bin/python run.py --only teibatch --only asyncio:budget --documents 5000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from peerbench.corpus import write_corpus
from peerbench.measure import become_subreaper
from peerbench.probe import ProbeResult, probe
from peerbench.registry import CONTESTANTS, FEATURES, select
from peerbench.report import table, write_results
from peerbench.runner import DEFAULT_STALL_S, Row, Slot, expected_for, run_row

HERE = Path(__file__).resolve().parent
DEFAULT_DOCUMENTS = 10_000
QUICK = {"documents": 400, "servers": 2, "probe_documents": 200, "stall_s": 20.0}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=DEFAULT_DOCUMENTS,
                        help=f"documents in the corpus (default {DEFAULT_DOCUMENTS:,})")
    parser.add_argument("--servers", type=int, default=8, help="simulated GPUs (default 8)")
    parser.add_argument("--rate", type=float, default=25_000, help="tokens/s of each simulated GPU (default 25,000)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="a family or family:variant (repeatable): " + ", ".join(c.key for c in CONTESTANTS))
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: {QUICK['documents']} documents, {QUICK['servers']} servers, no probes")
    parser.add_argument("--probe", action=argparse.BooleanOptionalAction, default=None,
                        help="try each library's resume/skip features (default: on, off with --quick)")
    parser.add_argument("--probe-documents", type=int, default=640, help="documents of the probes' corpus")
    parser.add_argument("--rerun-clean", action=argparse.BooleanOptionalAction, default=True,
                        help="run a contestant that crashed or lost documents again without the bad documents")
    parser.add_argument("--stall-s", type=float, default=DEFAULT_STALL_S,
                        help="stop a contestant once the servers embedded nothing for this long (default 90)")
    parser.add_argument("--results", type=Path, default=HERE / "results.json")
    parser.add_argument("--workdir", type=Path, help="keep corpora, outputs and logs here (default: a temp folder)")
    args = parser.parse_args()
    if args.quick:
        args.documents, args.servers = QUICK["documents"], QUICK["servers"]
        args.probe_documents, args.stall_s = QUICK["probe_documents"], QUICK["stall_s"]
    if args.probe is None:
        args.probe = not args.quick
    return args


def main() -> None:
    args = parse_args()
    contestants = select(args.only)
    become_subreaper()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="teibatch-peers-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        full = write_corpus(work / "corpus", args.documents)
        clean = write_corpus(work / "corpus-clean", args.documents, bad=False)
        expected_full, expected_clean = expected_for(full), expected_for(clean)
        print(f"corpus: {full.documents:,} documents ({len(full.bad_ids)} bad), {full.tokens:,} tokens to embed; "
              f"{args.servers} servers at {args.rate:,.0f} tokens/s each", flush=True)
        rows: list[Row] = []
        for contestant in contestants:
            row = run_row(contestant, full, expected_full, Slot(work / "rows" / contestant.key.replace(":", "-")),
                          servers=args.servers, rate=args.rate, label="full", stall_s=args.stall_s)
            rows.append(row)
            _progress(row)
            if args.rerun_clean and _needs_clean_rerun(row):
                again = run_row(contestant, clean, expected_clean,
                                Slot(work / "rows" / (contestant.key.replace(":", "-") + "-clean")),
                                servers=args.servers, rate=args.rate, label="bad documents removed",
                                stall_s=args.stall_s)
                rows.append(again)
                _progress(again)
        probes: dict[str, ProbeResult] = {}
        if args.probe:
            for contestant in contestants:
                if contestant.probe:
                    result = probe(contestant, work / "probes" / contestant.family, args.probe_documents,
                                   servers=args.servers, rate=args.rate)
                    probes[contestant.family] = result
                    print(f"probe {contestant.family}: resumes: {result.resumes}; skips: {result.skips}", flush=True)
        settings = {"documents": args.documents, "servers": args.servers, "rate": args.rate, "quick": args.quick,
                    "probe_documents": args.probe_documents if args.probe else None,
                    "corpus_tokens": full.tokens, "bad_documents": full.bad_ids,
                    "elapsed_s": round(time.monotonic() - started, 1)}
        print()
        print(table(rows, probes))
        write_results(args.results, settings, rows, probes, {c.family: FEATURES[c.family] for c in contestants})
        print(f"\nresults: {args.results}  ({settings['elapsed_s']:.0f} s in all)")


def _needs_clean_rerun(row: Row) -> bool:
    """Crashed, or lost or mangled documents; a hang before any document was embedded is not the corpus's doing."""
    status = row.measurement.status
    if status == "done":
        return bool(row.counts.lost or row.counts.wrong)
    return status == "crashed" or row.stats.inputs_embedded > 0


def _progress(row: Row) -> None:
    m, c = row.measurement, row.counts
    print(f"{row.contestant.key} [{row.corpus}]: {m.status} in {m.wall_s:.1f} s, embedded {c.embedded:,}, "
          f"lost {c.lost:,}, wrong {c.wrong:,}, failed {c.failed:,}, busy {row.stats.busy_share:.3f}"
          + (f" ({m.error})" if m.error else ""), flush=True)


if __name__ == "__main__":
    main()
