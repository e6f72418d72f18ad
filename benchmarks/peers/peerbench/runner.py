"""Run one contestant on fresh servers and count what it did; the harness's environment for it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peerbench.corpus import CorpusInfo
from peerbench.measure import Measurement, run_measured
from peerbench.registry import Contestant
from peerbench.servers import DIMENSION, MODEL_ID, Fleet, FleetStats
from peerbench.verify import Counts, Expected, count

HERE = Path(__file__).resolve().parent.parent
API_KEY_ENV = "TEI_API_KEY"
DEFAULT_STALL_S = 90.0
STALL_POLL_S = 2.0
# Nothing a contestant runs may call home: no usage statistics, no telemetry, no tracing.
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "HF_HUB_DISABLE_TELEMETRY": "1",
             "DO_NOT_TRACK": "1", "LANGCHAIN_TRACING_V2": "false", "TOKENIZERS_PARALLELISM": "false",
             "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
DROP_ENV = ("RAY_ADDRESS", "HF_HUB_OFFLINE", "OPENAI_API_KEY", "OPENAI_BASE_URL", "HF_TOKEN", API_KEY_ENV)


@dataclass
class Row:
    """One line of the table."""

    contestant: Contestant
    corpus: str                    # "full" or "bad documents removed"
    documents: int
    measurement: Measurement
    stats: FleetStats
    counts: Counts
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        m = self.measurement
        return {"contestant": self.contestant.key, "label": self.contestant.label, "tuned": self.contestant.tuned,
                "corpus": self.corpus, "documents": self.documents, "status": m.status, "error": m.error,
                "wall_s": round(m.wall_s, 2), "cpu_s": round(m.cpu_s, 2), "peak_mib": round(m.peak_mib, 1),
                "docs_per_s": round(self.counts.embedded / m.wall_s, 1) if m.wall_s > 0 else 0.0,
                "servers": self.stats.to_json(), "counts": self.counts.to_json(), **self.extra}


def contestant_env(api_key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
    env.update(QUIET_ENV)
    env["PYTHONPATH"] = str(HERE) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[API_KEY_ENV] = api_key
    return env


def time_limit(contestant: Contestant, corpus: CorpusInfo, rate: float) -> float:
    """Three times what one server needs for the corpus, plus per-request and start-up allowances."""
    one_server_s = corpus.tokens / rate
    per_request_s = corpus.documents * (0.01 if contestant.per_document else 0.001)
    return 3 * one_server_s + 3 * per_request_s + (120 if contestant.ray else 60)


@dataclass
class Slot:
    """A contestant's folders: config, log, result file, output, and the state kept between probe runs."""

    root: Path

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def fresh(self) -> Slot:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        self.state.mkdir()
        return self


def launch(contestant: Contestant, fleet: Fleet, corpus: Path, slot: Slot, limit_s: float, *, features: bool = False,
           stop_when: Callable[[float], str | None] | None = None, log_name: str = "log.txt") -> Measurement:
    """Run the contestant once against ``fleet`` (in its own process, measured)."""
    config = {"urls": fleet.urls, "api_key_env": API_KEY_ENV, "corpus": str(corpus), "output": str(slot.output),
              "variant": contestant.variant, "features": features, "model": MODEL_ID, "state": str(slot.state),
              "result": str(slot.root / "result.json")}
    config_path = slot.root / "config.json"
    config_path.write_text(json.dumps(config, indent=1))
    command = [sys.executable, "-m", f"contestants.{contestant.module}", str(config_path)]
    return run_measured(command, cwd=HERE, env=contestant_env(fleet.api_key), limit_s=limit_s,
                        log=slot.root / log_name, result=slot.root / "result.json", exclude=fleet.server_pids,
                        stop_when=stop_when)


def run_row(contestant: Contestant, corpus: CorpusInfo, expected: Expected, slot: Slot, *, servers: int, rate: float,
            label: str, stall_s: float = DEFAULT_STALL_S) -> Row:
    """Fresh servers, one measured run of ``contestant`` on ``corpus``, then what its output holds."""
    slot.fresh()
    with Fleet(servers, rate) as fleet:
        measurement = launch(contestant, fleet, corpus.path, slot, time_limit(contestant, corpus, rate),
                             stop_when=StallWatch(fleet, stall_s))
        stats = fleet.stats()
    counts = count(slot.output, expected)
    if measurement.status == "stalled":
        measurement.error = f"the servers embedded nothing for {stall_s:.0f} s"
    return Row(contestant, label, corpus.documents, measurement, stats, counts)


class StallWatch:
    """Stop a contestant whose servers embedded nothing for ``stall_s`` (a hang, not a slow run)."""

    def __init__(self, fleet: Fleet, stall_s: float) -> None:
        self.fleet = fleet
        self.stall_s = stall_s
        self.embedded = -1
        self.since = 0.0
        self.checked = 0.0

    def __call__(self, elapsed: float) -> str | None:
        if elapsed - self.checked < STALL_POLL_S:
            return None
        self.checked = elapsed
        embedded = self.fleet.inputs_embedded()
        if embedded != self.embedded:
            self.embedded, self.since = embedded, elapsed
        return "stalled" if elapsed - self.since > self.stall_s else None


def expected_for(corpus: CorpusInfo) -> Expected:
    return Expected.of(corpus.path, DIMENSION)
