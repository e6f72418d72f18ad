"""``_manifest.json``: which shards are committed, and what the output was made with.

A shard is committed when, and only when, the manifest lists it; its parts may exist on disk
before that (a killed run), and are then simply written again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any

import orjson

from teibatch.crashpoints import crashpoint
from teibatch.errors import SinkError
from teibatch.sink.parts import DOCUMENTS_DIR, REJECTS_DIR, VECTORS_DIR, part_path, shard_of, staged_shard_of
from teibatch.sink.store import TEMP_MARK, OutputStore

MANIFEST = "_manifest.json"
MANIFEST_FORMAT = 1


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ShardEntry:
    """A committed shard: how many vectors and rejects it wrote, and in which run.

    ``bytes``: the size of its vectors part, by which a later run and ``status`` find a part gone or cut
    (``None`` in a manifest written before it was recorded: then only the part's presence is checked).
    ``duplicates``: which of its documents it rejected because an earlier shard holds their id (a digest,
    ``""`` for none; ``pipeline/unique_ids.py``).
    ``staged``: its vectors part (and documents part) still lie under their hidden staged names, waiting
    for the parts they replace to go (``sink/replace.py``).
    """

    rows: int
    rejects: int
    run_id: str
    committed_at: str
    sources: tuple[str, ...] = ()
    bytes: int | None = None
    staged: bool = False
    duplicates: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "rejects": self.rejects, "run_id": self.run_id,
                "committed_at": self.committed_at, "sources": list(self.sources),
                **({"bytes": self.bytes} if self.bytes is not None else {}),
                **({"staged": True} if self.staged else {}),
                **({"duplicates": self.duplicates} if self.duplicates else {})}

    def vectors_part(self, shard_id: str) -> str:
        """Where this shard's vectors part lies now, relative to the output."""
        return part_path(VECTORS_DIR, shard_id, staged=self.staged)


@dataclass
class Manifest:
    """The output's state; :meth:`save` replaces the file atomically."""

    fingerprint: str
    job_name: str
    info: dict[str, Any] = field(default_factory=dict)
    shards: dict[str, ShardEntry] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    """The shard ids of the corpus as the latest run planned it: committed or still pending."""
    options: dict[str, Any] | None = None
    """The options ``fingerprint`` digests, by job-file key; ``None`` in a manifest written before they were kept."""
    kept_fields: dict[str, Any] | None = None
    """The kept fields' types, as ``corpus.KeptFields.to_json`` records them (``None`` before they were recorded)."""
    quantization: dict[str, Any] | None = None
    """How ``embedding`` is stored (``teibatch.quantize.Quantization.to_json``) for an int8, uint8 or binary
    output: its calibration, taken once and reused by every later run. ``None`` for float outputs."""
    guard: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    """Called before every write; raises to stop it (the run's lock check, ``sink/lock.py``)."""

    @classmethod
    def load(cls, store: OutputStore) -> Manifest | None:
        data = store.read_json(MANIFEST)
        if data is None:
            return None
        try:
            if data.get("format") != MANIFEST_FORMAT:
                raise SinkError(f"{store.url}/{MANIFEST} has format {data.get('format')!r}; "
                                f"this teibatch reads format {MANIFEST_FORMAT}")
            shards = {sid: ShardEntry(**{**entry, "sources": tuple(entry.get("sources", ()))})
                      for sid, entry in data["shards"].items()}
            return cls(fingerprint=data["fingerprint"], job_name=data["job"], info=data.get("info", {}),
                       shards=shards, runs=list(data.get("runs", [])), planned=list(data.get("planned", [])),
                       options=data.get("options"), kept_fields=data.get("kept_fields"),
                       quantization=data.get("quantization"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise SinkError(f"{store.url}/{MANIFEST} is damaged ({exc!r}); "
                            "restore it or start a new output path") from exc

    def commit(self, shard_id: str, rows: int, rejects: int, run_id: str, sources: tuple[str, ...] = (), *,
               bytes: int | None = None, staged: bool = False, duplicates: str = "") -> None:
        self.shards[shard_id] = ShardEntry(rows=rows, rejects=rejects, run_id=run_id, committed_at=utc_now(),
                                           sources=sources, bytes=bytes, staged=staged,
                                           duplicates=duplicates)

    def parts_reading(self, sources: tuple[str, ...]) -> list[str]:
        """Vectors parts of committed shards that read any of ``sources``: where their documents were."""
        wanted = set(sources)
        return [entry.vectors_part(sid) for sid, entry in sorted(self.shards.items())
                if wanted.intersection(entry.sources)]

    @property
    def pending(self) -> list[str]:
        """Planned shards not committed yet."""
        return [sid for sid in self.planned if sid not in self.shards]

    def save(self, store: OutputStore) -> None:
        """Replace ``_manifest.json`` atomically: a crash leaves the old one or the new one, whole."""
        if self.guard is not None:
            self.guard()
        optional = {"options": self.options, "kept_fields": self.kept_fields, "quantization": self.quantization}
        blob = orjson.dumps({
            "format": MANIFEST_FORMAT, "job": self.job_name, "fingerprint": self.fingerprint,
            "info": self.info, "runs": self.runs, "updated_at": utc_now(), "planned": self.planned,
            "shards": {sid: entry.to_json() for sid, entry in sorted(self.shards.items())},
            **{key: value for key, value in optional.items() if value is not None},  # absent when None
        }, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

        def write(handle: IO[bytes]) -> None:
            handle.write(blob[: len(blob) // 2])
            handle.flush()
            crashpoint("manifest-write")
            handle.write(blob[len(blob) // 2:])

        store.write_atomic(MANIFEST, write)

    @property
    def rows(self) -> int:
        """Vectors in the committed planned shards (the current view once a run has finished)."""
        return sum(self.shards[sid].rows for sid in self.planned if sid in self.shards)

    @property
    def rejects(self) -> int:
        return sum(self.shards[sid].rejects for sid in self.planned if sid in self.shards)


def remove_stale(store: OutputStore, manifest: Manifest, live: set[str]) -> list[str]:
    """Delete parts of shards outside ``live`` (a changed or shrunk corpus) and leftover temp files.

    Returns the shard ids that were dropped from the manifest.
    """
    dropped = sorted(set(manifest.shards) - live)
    for shard_id in dropped:
        del manifest.shards[shard_id]
    for directory in (VECTORS_DIR, DOCUMENTS_DIR, REJECTS_DIR):
        for name in store.list(directory):
            part_of = shard_of(name) or staged_shard_of(name)
            if name.startswith(TEMP_MARK) or (part_of is not None and part_of not in live):
                store.remove(f"{directory}/{name}")
    return dropped


def remove_uncommitted_temp(store: OutputStore, manifest: Manifest | None = None) -> int:
    """Delete temporary files a killed run left behind; return how many.

    With ``manifest``, also the parts of shards it does not list: written by a shard task whose shard was
    never committed, they would stand beside the parts they were to replace (``sink/replace.py``), and a
    run writes them again.
    """
    removed = 0
    for directory in (VECTORS_DIR, DOCUMENTS_DIR, REJECTS_DIR, ""):
        for name in store.list(directory):
            part_of = (shard_of(name) or staged_shard_of(name)) if directory else None
            uncommitted = manifest is not None and part_of is not None and part_of not in manifest.shards
            if name.startswith(TEMP_MARK) or uncommitted:
                store.remove(f"{directory}/{name}" if directory else name)
                removed += 1
    return removed

