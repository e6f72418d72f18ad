"""Staged parts replace the parts they supersede once their group is committed; committed parts are checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from teibatch.sink import Manifest, OutputStore, Replacements, VectorSchema, WriteOptions, check_parts, vectors_table
from teibatch.sink.parts import write_part


def write(store: OutputStore, manifest: Manifest, shard: str, ids: list[str], sources: tuple[str, ...], *,
          staged: bool = False) -> None:
    """Write and commit a vectors part of ``ids`` for ``shard``."""
    table = vectors_table(VectorSchema(dimension=2), ids, np.ones((len(ids), 2), np.float32), ["h"] * len(ids), {})
    relative = write_part(store, "vectors", shard, table, WriteOptions(), staged=staged)
    manifest.commit(shard, rows=len(ids), rejects=0, run_id="r", sources=sources,
                    bytes=(store.fs.size(store.path(relative))), staged=staged)


def names(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "vectors").iterdir())


def test_a_group_is_replaced_only_once_every_new_shard_is_committed(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path))
    manifest = Manifest(fingerprint="f", job_name="j")
    write(store, manifest, "old-a1", ["a1", "a2"], ("a.jsonl",))  # a.jsonl's two old shards
    write(store, manifest, "old-a2", ["a3"], ("a.jsonl",))
    write(store, manifest, "b", ["b1"], ("b.jsonl",))  # unchanged
    live = {"new-a1": ("a.jsonl",), "new-a2": ("a.jsonl",), "b": ("b.jsonl",)}
    replacements = Replacements(manifest, live)
    assert [replacements.supersedes(s) for s in live] == [True, True, False]

    write(store, manifest, "new-a1", ["a1", "a2"], ("a.jsonl",), staged=True)
    assert replacements.finish(store, ["new-a1"]) == []  # new-a2 is not committed: the old rows stay
    assert names(tmp_path) == [".staged-part-new-a1", "part-b.parquet", "part-old-a1.parquet",
                               "part-old-a2.parquet"]

    write(store, manifest, "new-a2", ["a3"], ("a.jsonl",), staged=True)
    assert replacements.finish(store, ["new-a2"]) == ["old-a1", "old-a2"]
    assert names(tmp_path) == ["part-b.parquet", "part-new-a1.parquet", "part-new-a2.parquet"]
    saved = orjson.loads((tmp_path / "_manifest.json").read_bytes())["shards"]
    assert sorted(saved) == ["b", "new-a1", "new-a2"]
    assert not any(entry.get("staged") for entry in saved.values())
    assert check_parts(store, manifest, live).bad == ()


def test_a_half_done_replacement_is_finished_by_the_next_finish(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path))
    manifest = Manifest(fingerprint="f", job_name="j")
    write(store, manifest, "old", ["a1"], ("a.jsonl",))
    write(store, manifest, "new", ["a1"], ("a.jsonl",), staged=True)
    manifest.save(store)
    (tmp_path / "vectors" / "part-old.parquet").unlink()  # killed after the delete, before the rename
    loaded = Manifest.load(store)
    assert loaded is not None and loaded.shards["new"].staged
    assert Replacements(loaded, {"new": ("a.jsonl",)}).finish(store) == ["old"]
    assert names(tmp_path) == ["part-new.parquet"]
    assert not loaded.shards["new"].staged


def test_a_part_gone_or_cut_is_found_and_an_old_manifest_is_checked_for_presence(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path))
    manifest = Manifest(fingerprint="f", job_name="j")
    for shard in ("kept", "gone", "cut", "old"):
        write(store, manifest, shard, [f"{shard}-1", f"{shard}-2"], (f"{shard}.jsonl",))
    manifest.save(store)
    data = orjson.loads((tmp_path / "_manifest.json").read_bytes())
    del data["shards"]["old"]["bytes"]  # as a manifest written before sizes were recorded
    (tmp_path / "_manifest.json").write_bytes(orjson.dumps(data))
    (tmp_path / "vectors" / "part-gone.parquet").unlink()
    with (tmp_path / "vectors" / "part-cut.parquet").open("r+b") as handle:
        handle.truncate(10)
    with (tmp_path / "vectors" / "part-old.parquet").open("ab") as handle:
        handle.write(b"more")  # its size was not recorded: only its presence is checked
    loaded = Manifest.load(store)
    assert loaded is not None and loaded.shards["old"].bytes is None
    check = check_parts(store, loaded, ["kept", "gone", "cut", "old", "never-committed"])
    assert (check.missing, check.wrong_size, check.rows) == (("gone",), ("cut",), 4)
