"""The Markdown table and ``results.json``."""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from peerbench.probe import ProbeResult
from peerbench.runner import Row

PACKAGES = ("teibatch", "ray", "httpx", "langchain-huggingface", "langchain-openai", "langchain-classic",
            "llama-index-core", "llama-index-embeddings-text-embeddings-inference", "huggingface_hub", "openai")
HEADER = ("contestant", "wall s", "docs/s", "busy share", "client CPU s", "CPU s / 1M vectors", "peak MiB",
          "embedded / lost / failed", "limit violations", "resumes after a kill", "skips unchanged documents", "notes")


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _violations(row: Row) -> str:
    parts = [f"{kind} {n}" for kind, n in row.stats.violations.items() if n]
    parts += [f"{status}×{n}" for status, n in row.stats.statuses.items() if status in ("413", "422", "429") and n]
    return ", ".join(parts) or "none"


def _notes(row: Row) -> str:
    m, counts = row.measurement, row.counts
    notes = []
    if m.status != "done":
        notes.append(f"crashed: {m.error}" if m.status == "crashed" else f"stopped: {m.error}")
    if counts.lost:
        notes.append(f"lost {counts.lost}")
    if counts.wrong:
        notes.append(f"wrong vectors {counts.wrong}")
    if counts.duplicates:
        notes.append(f"duplicates {counts.duplicates}")
    if row.stats.statuses.get("400"):
        notes.append(f"400×{row.stats.statuses['400']} (empty input)")
    return "; ".join(notes).replace("|", "/")


def _cell(text: str) -> str:
    return text.replace("|", "/")


def table(rows: list[Row], probes: dict[str, ProbeResult]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        m, c = row.measurement, row.counts
        probe = probes.get(row.contestant.family)
        label = row.contestant.label + (" (tuned)" if row.contestant.tuned else "")
        if row.corpus != "full":
            label += f" [{row.corpus}]"
        cells = [label, f"{m.wall_s:.1f}", f"{c.embedded / m.wall_s:.0f}" if m.wall_s else "0",
                 f"{row.stats.busy_share:.3f}", f"{m.cpu_s:.1f}",
                 f"{m.cpu_s / c.embedded * 1e6:,.0f}" if c.embedded else "-", f"{m.peak_mib:.0f}",
                 f"{c.embedded:,} / {c.lost + c.wrong:,} / {c.failed:,}", _violations(row),
                 probe.resumes if probe else "not tried", probe.skips if probe else "not tried", _notes(row)]
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return "\n".join(lines)


def write_results(path: Path, settings: dict[str, Any], rows: list[Row], probes: dict[str, ProbeResult],
                  features: dict[str, str]) -> None:
    path.write_text(json.dumps({
        "settings": settings,
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "packages": versions()},
        "rows": [r.to_json() for r in rows],
        "probes": {family: p.to_json() for family, p in probes.items()},
        "features": features,
    }, indent=1) + "\n")
