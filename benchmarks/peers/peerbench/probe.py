"""Try each library's resume and skip features on a small clean corpus, counting what the servers get.

On one set of servers (with ``--record-texts``, counters zeroed before each run), the family's probe
variant runs with its library's resume/skip feature switched on where it has one:

1. run 1 on the corpus, to the end;
2. run 2, same corpus, same output and state: how many documents did the servers embed again?
3. run 3 after 3 documents got one more sentence: were exactly those sent, and are their vectors new?
4. in a fresh output, on servers 4 times slower (so the kill lands mid-run): a run killed (SIGKILL,
   whole process tree) once the servers have embedded half the corpus, then the same run again: how
   many documents did the rerun send, and is the output complete and right?

"Skips unchanged documents" is *yes* when run 2 sent (almost) nothing and run 3 sent the 3 changed
documents and (almost) nothing else, with their new vectors written; "resumes after a kill" is *yes*
when the rerun sent less than 90% of the corpus and the output then held every document, right.
"Almost": a few inputs per server for connection probes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerbench.corpus import CorpusInfo, write_corpus
from peerbench.registry import Contestant
from peerbench.runner import Slot, StallWatch, expected_for, launch, time_limit
from peerbench.servers import Fleet
from peerbench.verify import count
from teibatch.server.metrics import text_digest

CHANGED = frozenset({7, 101, 333})
KILL_SLOWDOWN = 4
PROBE_STALL_S = 45.0
SEED = 29


@dataclass
class ProbeResult:
    resumes: str
    skips: str
    runs: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"resumes": self.resumes, "skips": self.skips, "runs": self.runs}


def probe(contestant: Contestant, root: Path, documents: int, *, servers: int, rate: float) -> ProbeResult:
    """The four steps above for one contestant; ``root`` is a scratch folder."""
    shutil.rmtree(root, ignore_errors=True)
    args_documents = documents
    corpus_path = root / "corpus"
    corpus = write_corpus(corpus_path, documents, seed=SEED, bad=False)
    documents = corpus.documents  # the records at the bad documents' places are left out
    good = expected_for(corpus).texts
    changed = sorted(i for i in CHANGED if f"doc-{i:07d}" in good)
    limit = time_limit(contestant, corpus, rate)
    tolerance = 2 * servers + 2
    runs: list[dict[str, Any]] = []
    with Fleet(servers, rate, record_texts=True) as fleet:

        def once(slot: Slot, name: str, **kwargs: Any) -> tuple[str, int, dict[str, int]]:
            fleet.wait_idle()
            fleet.reset()
            if name == "1":  # later runs may rightly send nothing for a while: only the time limit stops them
                kwargs.setdefault("stop_when", StallWatch(fleet, PROBE_STALL_S))
            measurement = launch(contestant, fleet, corpus_path, slot, limit, features=True,
                                 log_name=f"log-{name}.txt", **kwargs)
            stats = fleet.stats()
            runs.append({"run": name, "status": measurement.status, "error": measurement.error,
                         "wall_s": round(measurement.wall_s, 2), "inputs_sent": stats.inputs_embedded})
            return measurement.status, stats.inputs_embedded, stats.texts

        slot = Slot(root / "run").fresh()
        status, _, _ = once(slot, "1")
        if status != "done":
            return ProbeResult(f"not tried: run 1 {status}", f"not tried: run 1 {status}", runs)
        status2, sent2, _ = once(slot, "2-same")
        shutil.rmtree(corpus_path)
        changed_corpus = write_corpus(corpus_path, args_documents, seed=SEED, bad=False, changed=frozenset(changed))
        status3, sent3, texts3 = once(slot, "3-changed")
        skips = _skips(changed_corpus, changed, slot, status2, sent2, status3, sent3, texts3, documents, tolerance)

    # The kill test on slower servers, so the kill lands in the middle of the work, not after it.
    limit = time_limit(contestant, changed_corpus, rate / KILL_SLOWDOWN)
    with Fleet(servers, rate / KILL_SLOWDOWN, record_texts=True) as fleet:
        kill_slot = Slot(root / "kill").fresh()
        half = documents // 2
        status_k, sent_k, _ = once(kill_slot, "4-killed",
                                   stop_when=lambda _: "killed" if fleet.inputs_embedded() >= half else None)
        status_r, sent_r, _ = once(kill_slot, "5-rerun")
        resumes = _resumes(changed_corpus, kill_slot, status_k, sent_k, status_r, sent_r, documents)
    return ProbeResult(resumes, skips, runs)


def _skips(corpus: CorpusInfo, changed: list[int], slot: Slot, status2: str, sent2: int, status3: str, sent3: int,
           texts3: dict[str, int], documents: int, tolerance: int) -> str:
    if status2 != "done" or status3 != "done":
        return f"no: run 2 {status2}, run 3 {status3}"
    if sent2 > tolerance:
        return f"no: run 2 sent {sent2} of {documents} again"
    expected = expected_for(corpus)
    changed_ids = [f"doc-{i:07d}" for i in changed]
    resent = sum(1 for i in changed_ids if texts3.get(text_digest(expected.texts[i])))
    counts = count(slot.output, expected)
    if resent < len(changed_ids):
        return (f"by id only: run 2 sent {sent2}; run 3 sent {resent} of {len(changed_ids)} changed documents "
                f"({counts.wrong} stale vectors kept)")
    if sent3 > len(changed_ids) + tolerance:
        return f"partly: run 2 sent {sent2}; run 3 sent {sent3} for {len(changed_ids)} changed documents"
    return f"yes: run 2 sent {sent2}; run 3 sent {sent3} for {len(changed_ids)} changed documents"


def _resumes(corpus: CorpusInfo, slot: Slot, status_k: str, sent_k: int, status_r: str, sent_r: int,
             documents: int) -> str:
    if status_k != "killed":
        return f"not tried: the run ended ({status_k}) before half was embedded"
    if status_r != "done":
        return f"no: the rerun {status_r}"
    counts = count(slot.output, expected_for(corpus))
    complete = counts.embedded == documents and not counts.wrong
    if sent_r >= 0.9 * documents:
        return f"no: killed after {sent_k} embedded, the rerun sent {sent_r} of {documents}"
    if not complete:
        return (f"no: the rerun sent {sent_r} of {documents} but the output holds {counts.embedded} right vectors "
                f"({counts.wrong} wrong, {counts.lost} missing)")
    return f"yes: killed after {sent_k} embedded, the rerun sent {sent_r} of {documents}; output complete"
