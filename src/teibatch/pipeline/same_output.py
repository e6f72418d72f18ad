"""Whether an existing output takes this job: its stored options against the job's, and what differs.

An output is made with one set of model options and reading options (:meth:`JobSpec.output_options`)
for good: vectors of two sets side by side in ``vectors/`` would mix in every search. A job with
other options is refused (:class:`OutputMismatch`, exit code 3) naming each option that differs, the
stored value and the job's. A manifest written before the options themselves were kept holds only
their digest: then the options a committed vectors part records in its schema are compared, and the
message says which options could not be.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from teibatch.errors import OutputMismatch
from teibatch.job import JobSpec
from teibatch.pipeline.progress import Reporter
from teibatch.sink import Manifest, OutputStore, part_metadata, remove_stale
from teibatch.sparse import KIND_AUTO, KIND_DENSE

NOT_RECORDED = object()
"""A stored value the manifest does not hold (an option newer than the output)."""
# Options kept only when on (:meth:`JobSpec.output_options`): their value when a manifest or a job lacks them.
OFF_VALUES: dict[str, Any] = {"output.keep_float": False}


def open_manifest(store: OutputStore, job: JobSpec, reporter: Reporter) -> Manifest:
    """The output's manifest; one made with other options is refused, unless it holds no vector at all.

    An output without a single vector (say every document was rejected because ``text_field`` named
    the wrong field) has nothing another set of options could make inconsistent: it is started afresh.
    A manifest that matches but predates the stored options gets them at its next save.
    """
    manifest = Manifest.load(store)
    fingerprint, options = job.output_fingerprint(), job.output_options()
    if manifest is None:
        return Manifest(fingerprint=fingerprint, job_name=job.name, options=options)
    if manifest.fingerprint == fingerprint:
        manifest.options = options
        return manifest
    if _auto_as_resolved(manifest, options):
        return manifest  # keeps its own options and fingerprint: the auto job still matches it
    if not any(entry.rows for entry in manifest.shards.values()):
        reporter.message(f"{store.url} holds no vectors yet; starting it afresh with this job's options",
                         event="output_restarted")
        fresh = Manifest(fingerprint=fingerprint, job_name=job.name, runs=list(manifest.runs), options=options)
        remove_stale(store, fresh, live=set())
        return fresh
    raise OutputMismatch(mismatch_message(store, manifest, job))


def _auto_as_resolved(manifest: Manifest, options: Mapping[str, Any]) -> bool:
    """Whether the job differs from the output only in giving ``chunking.max_tokens`` as the number the
    output's ``auto`` became (its manifest's info keeps it): the same chunks, so the same output."""
    if manifest.options is None or not manifest.info:
        return False
    resolved = manifest.info.get("chunking", {}).get("max_tokens")
    changed = _differences(manifest.options, options)
    return bool(changed) and resolved is not None and all(
        (key, stored, new) == ("chunking.max_tokens", "auto", resolved) for key, stored, new in changed)


def check_vector_kind(store: OutputStore, manifest: Manifest, kind: str) -> None:
    """Refuse sparse vectors (``kind``) into an output of dense ones, or the other way round.

    ``model.kind`` is not among the fingerprinted options (outputs written before it existed keep
    their fingerprint, and ``auto`` is known only once the servers are met); the kind of an output's
    vectors is in its manifest's info (no ``kind``: dense), checked here before any server starts when
    the job names a kind, and again once the servers have shown theirs.
    """
    stored = manifest.info.get("kind", KIND_DENSE) if manifest.info else None
    if kind == KIND_AUTO or stored in (None, kind) or not any(entry.rows for entry in manifest.shards.values()):
        return
    raise OutputMismatch(
        f"{store.url} holds {stored} vectors (job {manifest.job_name!r}): model.kind: stored {_value(stored)}, "
        f"this job {_value(kind)}. Mixing them would give inconsistent vectors: run with --set model.kind={stored} "
        "against servers of the output's model, write to a new output.path, or delete the old output first")


def mismatch_message(store: OutputStore, manifest: Manifest, job: JobSpec) -> str:
    """Why ``job`` cannot write to the output of ``manifest``: each option that differs, and what to do."""
    options = job.output_options()
    head = (f"{store.url} holds vectors made with other model options or reading options (job "
            f"{manifest.job_name!r})")
    if manifest.options is not None:
        changed = _differences(manifest.options, options)
        found = f": {_describe(changed)}" if changed else ""
    else:
        recorded, source = _recorded_in_parts(store, manifest, job)
        changed = _differences(recorded, {key: value for key, value in options.items() if key in recorded})
        unknown = ", ".join(key for key in options if key not in recorded)
        found = ". Its manifest, written by an earlier teibatch, keeps only a digest of them"
        if source is None:
            found += f", and no committed vectors part records them: compare {unknown} with the job that wrote it"
        elif changed:
            found += f"; {source} records {_describe(changed)} (not recorded, so not compared: {unknown})"
        else:
            found += (f"; {source} records the same {', '.join(recorded)} as this job, so what differs is "
                      f"among {unknown}")
    settings = " ".join(f"--set {key}={_value(stored)}" for key, stored, _ in changed if stored is not NOT_RECORDED)
    stored_values = f"run with the stored values ({settings}), " if settings else ""
    return (f"{head}{found}. Mixing them would give inconsistent vectors: {stored_values}write to a new "
            "output.path, or delete the old output first")


def _differences(stored: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, stored value, job's value)`` for each option of ``new`` that ``stored`` holds otherwise or lacks,
    then each chunking option ``stored`` holds and ``new`` lacks (an output chunked, a job that is not: null),
    and each of :data:`OFF_VALUES` one of them holds on and the other lacks (off)."""
    changed = [(key, old, value) for key, value in new.items()
               if (old := stored.get(key, OFF_VALUES.get(key, NOT_RECORDED))) != value]
    return changed + [(key, value, OFF_VALUES.get(key)) for key, value in stored.items()
                      if (key.startswith("chunking.") or key in OFF_VALUES) and key not in new
                      and value != OFF_VALUES.get(key)]


def _describe(changed: list[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{key}: stored {_value(stored)}, this job {_value(new)}" for key, stored, new in changed)


def _value(value: Any) -> str:
    """A value as the job file (YAML) writes it: ``true``, ``null``, ``"BAAI/bge-small-en-v1.5"``, ``["title"]``."""
    return "not recorded" if value is NOT_RECORDED else orjson.dumps(value).decode()


def _recorded_in_parts(store: OutputStore, manifest: Manifest, job: JobSpec) -> tuple[dict[str, Any], str | None]:
    """The output options one committed vectors part records in its schema (by job-file key), and its name.

    A part records the vector options (with the model id the servers reported), the vector type and
    the kept fields; the model id is compared only when the job names one (``model.id: null`` takes
    whatever the servers serve). The id and text fields are not recorded anywhere.
    """
    for shard_id, entry in sorted(manifest.shards.items()):
        if not entry.rows:
            continue
        relative = entry.vectors_part(shard_id)
        found = part_metadata(store, relative)
        if found is None:
            continue
        metadata, kept = found
        recorded = {f"model.{key}": value for key, value in metadata.get("options", {}).items() if key != "model"}
        if job.model.id is not None and "model_id" in metadata:
            recorded["model.id"] = metadata["model_id"]
        if "vector_type" in metadata:
            recorded["output.vector_type"] = metadata["vector_type"]
        recorded["corpus.keep_fields"] = list(kept)
        return recorded, relative
    return {}, None
