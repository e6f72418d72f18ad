"""New parts take the place of the parts they supersede, without a reader of ``vectors/`` ever seeing both.

A changed file gets new shard ids (``corpus/sharding.py``); the manifest still lists its old shards,
now *stale*, and their parts still hold the file's old rows. A new shard *supersedes* the stale
shards that read any of its files. Its parts replace theirs in this order, each step leaving every
id at most once in what a reader globs (``vectors/*.parquet``, ``pyarrow.dataset("vectors")``):

1. the shard task writes its vectors part (and documents part) under a hidden staged name
   (``.staged-part-<shard>``, :data:`~teibatch.sink.parts.STAGED_MARK`), which no reader globs;
2. the driver commits the shard: the manifest lists it, marked ``staged``;
3. once every new shard of its *group* is committed — the new shards and stale shards linked through
   the files they read (the old rows of one file may be spread over all of that file's new shards) —
   the group's stale parts are deleted (readers briefly see neither old nor new rows of those files),
4. its staged parts are renamed to their final names,
5. and the manifest drops the stale shards and the staged marks.

A run killed between any two steps leaves old rows or new rows, never both; the next run finishes
the job (:meth:`Replacements.finish` over every group) before it plans any work. Stale shards no new
shard reads (a removed file) are no group's: their parts go when a run finishes
(:func:`~teibatch.sink.manifest.remove_stale`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping

from teibatch.crashpoints import crashpoint
from teibatch.sink.manifest import Manifest
from teibatch.sink.parts import DOCUMENTS_DIR, REJECTS_DIR, VECTORS_DIR, part_path
from teibatch.sink.store import OutputStore

STAGED_DIRS = (VECTORS_DIR, DOCUMENTS_DIR)  # the parts a reader reads as vectors; rejects are written in place


class Replacements:
    """The groups of one run's plan: which new shard must stage its parts, and when a group is replaced.

    ``live``: the planned shards' ids and the files each reads. Stale shards are read from
    ``manifest`` once; :meth:`finish` drops them from it as their groups are replaced.
    """

    def __init__(self, manifest: Manifest, live: Mapping[str, tuple[str, ...]]) -> None:
        self.manifest = manifest
        self.live = live
        self._live_by_source: dict[str, set[str]] = defaultdict(set)
        self._stale_by_source: dict[str, set[str]] = defaultdict(set)
        for shard_id, sources in live.items():
            for source in sources:
                self._live_by_source[source].add(shard_id)
        for shard_id, entry in manifest.shards.items():
            if shard_id not in live:
                for source in entry.sources:
                    self._stale_by_source[source].add(shard_id)

    def supersedes(self, shard_id: str) -> bool:
        """Whether the planned shard ``shard_id`` replaces stale parts: its own must then be written staged."""
        return any(self._stale_by_source.get(source) for source in self.live[shard_id])

    def finish(self, store: OutputStore, shard_ids: Iterable[str] | None = None) -> list[str]:
        """Replace each group of ``shard_ids`` (default: every planned shard) whose new shards are all
        committed: steps 3–5 of the module docstring. Returns the stale shard ids dropped."""
        dropped: list[str] = []
        seen: set[str] = set()
        for shard_id in self.live if shard_ids is None else shard_ids:
            if shard_id in seen:
                continue
            new, stale = self._group(shard_id)
            seen |= new
            shards = self.manifest.shards
            staged = [sid for sid in new if sid in shards and shards[sid].staged]
            if (stale or staged) and all(sid in shards for sid in new):
                self._replace(store, sorted(new), sorted(stale))
                dropped += sorted(stale)
        return dropped

    def _group(self, shard_id: str) -> tuple[set[str], set[str]]:
        """The planned and stale shards linked to ``shard_id`` through the files they read."""
        new, stale = {shard_id}, set()
        files: list[str] = list(self.live[shard_id])
        visited: set[str] = set()
        while files:
            source = files.pop()
            if source in visited:
                continue
            visited.add(source)
            for sid in self._live_by_source.get(source, ()):
                if sid not in new:
                    new.add(sid)
                    files += self.live[sid]
            for sid in self._stale_by_source.get(source, ()):
                if sid not in stale and sid in self.manifest.shards:
                    stale.add(sid)
                    files += self.manifest.shards[sid].sources
        return new, stale

    def _replace(self, store: OutputStore, new: list[str], stale: list[str]) -> None:
        if self.manifest.guard is not None:  # parts are deleted only by the run that holds the output
            self.manifest.guard()
        for shard_id in stale:  # a stale shard's parts may lie under either name (staged, then superseded)
            for directory in (VECTORS_DIR, DOCUMENTS_DIR, REJECTS_DIR):
                store.remove(part_path(directory, shard_id))
                store.remove(part_path(directory, shard_id, staged=True))
        crashpoint("replace")
        shards = self.manifest.shards
        for shard_id in new:
            if shards[shard_id].staged:
                for directory in STAGED_DIRS:
                    _promote(store, directory, shard_id)
                shards[shard_id] = dataclasses.replace(shards[shard_id], staged=False)
        for shard_id in stale:
            entry = shards.pop(shard_id)
            for source in entry.sources:
                self._stale_by_source[source].discard(shard_id)
        self.manifest.save(store)


def _promote(store: OutputStore, directory: str, shard_id: str) -> None:
    """Rename a staged part to its final name; one already renamed (a run killed before the manifest said
    so), or never written (no documents part), is left as it is."""
    with contextlib.suppress(FileNotFoundError):
        store.move(part_path(directory, shard_id, staged=True), part_path(directory, shard_id))
