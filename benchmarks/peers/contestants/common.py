"""Glue every contestant shares: the config, the corpus reader, the Parquet writer, the result file.

The harness passes a JSON config (``urls``, ``api_key_env``, ``corpus``, ``output``, ``variant``,
``features``, ``result``, ``model``); the API key itself is only in the environment variable named
by ``api_key_env``. :func:`main` runs a contestant and writes ``{"status": "done"}`` or
``{"status": "crashed", "error": "<Type>: <first line>"}`` to the result file, so the table can say
why a contestant stopped; a crash still exits non-zero with its traceback on stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from peerbench.corpus import read_documents

__all__ = ["Config", "main", "read_documents", "write_vectors"]

MAX_ERROR_CHARS = 200


class Config:
    """The contestant's config, read from the JSON file named on the command line."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.urls: list[str] = raw["urls"]
        self.api_key: str = os.environ[raw["api_key_env"]]
        self.corpus = Path(raw["corpus"])
        self.output = Path(raw["output"])
        self.variant: str = raw["variant"]
        self.features: bool = raw.get("features", False)   # the library's resume/skip feature on (probe runs)
        self.model: str = raw["model"]
        self.state = Path(raw["state"])                     # a folder that survives between runs of a probe
        self.vectors = self.output / "vectors"


@contextmanager
def ray_data_session(config: Config) -> Iterator[None]:
    """A private local Ray for a Ray Data contestant, with Ray Data's checkpointing on when the probe asks.

    With checkpointing on, Ray Data adds a filter actor of 1 CPU: on 2 cores it would leave the read
    task waiting forever, so the probe's runs declare 2 more CPUs than the machine has.
    """
    import ray
    from ray.data.checkpoint import CheckpointConfig

    extra = {"num_cpus": (os.cpu_count() or 2) + 2} if config.features else {}
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **extra)
    try:
        if config.features:
            ray.data.DataContext.get_current().checkpoint_config = CheckpointConfig(
                id_column="id", checkpoint_path=str(config.state / "checkpoint"), delete_checkpoint_on_success=False)
        yield
    finally:
        ray.shutdown()


def write_vectors(config: Config, ids: Sequence[str], vectors: Sequence[Any], name: str = "part-0") -> None:
    """Write ids and vectors to ``<output>/vectors/<name>.parquet``, pairing them with ``zip`` as scripts do."""
    pairs = list(zip(ids, vectors, strict=False))
    embedding = pa.array([np.asarray(v, dtype=np.float32) for _, v in pairs], type=pa.list_(pa.float32()))
    config.vectors.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array([i for i, _ in pairs], pa.string()), "embedding": embedding}),
                   config.vectors / f"{name}.parquet")


def _validation_errors(exc: BaseException) -> str | None:
    """A pydantic ``ValidationError`` as ``field: message (got ...)``, without echoing its input (it may hold a key)."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ != "ValidationError" or not callable(errors):
        return None
    parts = []
    for error in errors():
        got = error.get("input")
        if isinstance(got, dict) and "error" in got:
            what = f"the server's error answer {got['error']!r}"
        else:
            what = type(got).__name__
        loc = ".".join(str(x) for x in error.get("loc", ())) or "value"
        parts.append(f"{loc}: {error.get('msg', '')} (got {what})")
    return "; ".join(parts)


def _one_line(exc: BaseException, secret: str = "") -> str:
    """``Type: message`` on one line, the root error of a Ray task rather than Ray's wrapper.

    Server addresses are written ``<server>`` (ports change every run) and file paths as their last
    part, so a table built from these lines holds no machine paths.
    """
    name, text = type(exc).__name__, str(exc)
    # A Ray task's error arrives wrapped, with the remote traceback in its text: take its last
    # "SomeError: message" line that is not one of Ray's own wrappers.
    raised = [m for m in _RAISED.finditer(re.sub(r"\x1b\[[0-9;]*m", "", text)) if not m.group(1).startswith("ray.")]
    if name.startswith(("RayTaskError", "UserCodeException", "RayActorError")) and raised:
        name, text = raised[-1].group(1).rsplit(".", 1)[-1], raised[-1].group(2)
    text = _validation_errors(exc) or text
    if secret:
        text = text.replace(secret, "<key>")
    lines = [line.strip() for line in text.strip().splitlines()
             if line.strip() and not line.strip().startswith("For more information")]
    message = re.sub(r"\x1b\[[0-9;]*m", "", " / ".join(lines))
    message = re.sub(r"https?://127\.0\.0\.1:\d+", "<server>", message)
    message = re.sub(r"(?<![\w:/])(/[^\s/\"']+)+/([^\s/\"']+)", r"\2", message)
    return f"{name}: {message}"[:MAX_ERROR_CHARS]


_RAISED = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Invalid)): (.+)$", re.MULTILINE)


def main(run: Callable[[Config], None]) -> None:
    """Run ``run`` with the config named in ``sys.argv[1]``; record how it ended in the result file."""
    raw = json.loads(Path(sys.argv[1]).read_text())
    result = Path(raw["result"])
    try:
        run(Config(raw))
    except BaseException as exc:
        secret = os.environ.get(raw["api_key_env"], "")
        result.write_text(json.dumps({"status": "crashed", "error": _one_line(exc, secret)}))
        traceback.print_exc()
        sys.exit(1)
    result.write_text(json.dumps({"status": "done"}))
