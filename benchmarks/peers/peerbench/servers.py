"""Built-in TEI servers as simulated GPUs, with TEI 1.9's default limits, and what they counted.

Each contestant gets fresh servers (``LocalProvider`` from ``teibatch.fleet``): ``--simulate-gpu
RATE`` (a batch is answered after 2 ms + tokens / RATE seconds, one batch at a time per server),
``--max-client-batch-size 32``, ``--max-concurrent-requests 512``, ``--payload-limit 2000000``,
``--max-input-length 512`` and an API key. Their own counters (``GET /teibatch/stats``) say how busy
they were and which limits clients broke.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from teibatch.fleet import LocalProvider

MODEL_ID = "teibatch/hashing-384"
DIMENSION = 384
TEI_DEFAULTS = ("--max-client-batch-size", "32", "--max-concurrent-requests", "512",
                "--payload-limit", "2000000", "--max-input-length", "512")
REFUSAL_STATUSES = ("400", "413", "422", "429")


@dataclass
class FleetStats:
    """What the servers counted while one contestant ran."""

    busy_shares: list[float]
    inputs_embedded: int
    requests: int
    statuses: dict[str, int]
    violations: dict[str, int]
    texts: dict[str, int] = field(default_factory=dict)   # digest -> count, with --record-texts

    @property
    def busy_share(self) -> float:
        """Mean over the servers of model-busy seconds / serving span; a server never used counts 0."""
        return sum(self.busy_shares) / len(self.busy_shares) if self.busy_shares else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"busy_share": round(self.busy_share, 4), "busy_shares": [round(s, 4) for s in self.busy_shares],
                "inputs_embedded": self.inputs_embedded, "requests": self.requests, "statuses": self.statuses,
                "violations": self.violations}


class Fleet:
    """``count`` fresh servers for the length of a ``with`` block."""

    def __init__(self, count: int, rate: float, *, record_texts: bool = False, dimension: int = DIMENSION) -> None:
        args = ["--simulate-gpu", str(rate), *TEI_DEFAULTS, "--dimension", str(dimension)]
        args += ["--record-texts"] if record_texts else []
        model = MODEL_ID if dimension == DIMENSION else f"teibatch/hashing-{dimension}"
        self.provider = LocalProvider(count, model_id=model, server_args=args)
        self.urls: list[str] = []

    @property
    def api_key(self) -> str:
        return self.provider.api_key

    @property
    def server_pids(self) -> set[int]:
        return {p.popen.pid for p in self.provider._processes}

    def __enter__(self) -> Fleet:
        try:
            self.urls = [e.url for e in self.provider.up()]
        except BaseException:
            self.provider.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.provider.down()

    def reset(self) -> None:
        """Zero every server's counters (between the runs of a probe)."""
        for url in self.urls:
            httpx.delete(f"{url}/teibatch/stats", timeout=10).raise_for_status()

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait until no server holds inputs in flight (a killed client's requests still run to their end)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stats = [httpx.get(f"{url}/teibatch/stats", timeout=10).json() for url in self.urls]
            if all(s["inflight_inputs"] == 0 and s["queue_size"] == 0 for s in stats):
                return
            time.sleep(0.1)

    def inputs_embedded(self) -> int:
        return sum(int(httpx.get(f"{url}/teibatch/stats", timeout=10).json()["inputs_embedded"]) for url in self.urls)

    def stats(self) -> FleetStats:
        shares, statuses, violations, texts = [], {}, {}, {}
        embedded = requests = 0
        for url in self.urls:
            raw = httpx.get(f"{url}/teibatch/stats", timeout=30).json()
            span = float(raw["serving_span_seconds"])
            shares.append(float(raw["model_busy_seconds"]) / span if span > 0 else 0.0)
            embedded += int(raw["inputs_embedded"])
            requests += int(raw["requests"]["total"])
            for status, n in raw["requests"]["by_status"].items():
                statuses[status] = statuses.get(status, 0) + int(n)
            for kind, n in raw["violations"].items():
                violations[kind] = violations.get(kind, 0) + int(n)
            for digest, n in raw.get("texts", {}).items():
                texts[digest] = texts.get(digest, 0) + int(n)
        return FleetStats(shares, embedded, requests, dict(sorted(statuses.items())), violations, texts)
