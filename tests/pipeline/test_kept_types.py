"""Kept-field types across an output's life: decided by its first run, recorded, kept by the next ones."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from teibatch.corpus import plan_shards, probe_corpus
from teibatch.errors import CorpusMismatch, OutputMismatch
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.kept_types import output_kept_fields
from teibatch.pipeline.progress import LineReporter, SilentReporter
from teibatch.sink import Manifest
from teibatch.sink.manifest import ShardEntry
from tests.conftest import write_jsonl

KEPT = {"n": 5, "x": 1.5, "flag": True, "tags": [1, 2], "meta": {"a": 1, "b": "s"}, "title": "t"}


class Messages(SilentReporter):
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        self.lines.append((text, {"event": event, **fields}))


def decide(job_path: Path, manifest: Manifest) -> tuple[Any, Messages]:
    job = load_job(job_path)
    options = job.corpus_options()
    messages = Messages()
    kept = output_kept_fields(job, probe_corpus(options), plan_shards(options), manifest, "out", messages)
    return kept, messages


def committed() -> Manifest:
    manifest = Manifest("f", "test-job")
    manifest.shards["s"] = ShardEntry(rows=3, rejects=0, run_id="r", committed_at="now")
    return manifest


def test_the_first_run_decides_and_records_and_later_runs_keep_it(tmp_path: Path,
                                                                  job_file: Callable[..., Path]) -> None:
    write_jsonl(tmp_path / "c" / "a.jsonl", [{"text": "t", "n": 1}])
    path = job_file({"path": str(tmp_path / "c"), "keep_fields": ["n"]})
    manifest = Manifest("f", "test-job")
    kept, _ = decide(path, manifest)
    assert kept.types == {"n": pa.int64()} and manifest.kept_fields == kept.to_json()
    # the corpus changes its first records: a resumed output keeps its recorded types
    write_jsonl(tmp_path / "c" / "a.jsonl", [{"text": "t", "n": 1.5}])
    manifest.shards["s"] = ShardEntry(rows=1, rejects=0, run_id="r", committed_at="now")
    assert decide(path, manifest)[0].types == {"n": pa.int64()}


def test_an_output_from_before_recorded_types_keeps_behaving_as_stringify(tmp_path: Path,
                                                                          job_file: Callable[..., Path]) -> None:
    write_jsonl(tmp_path / "c" / "a.jsonl", [{"text": "t", "n": 1}])
    manifest = committed()  # shards, but no kept_fields: an older teibatch wrote it
    kept, messages = decide(job_file({"path": str(tmp_path / "c"), "keep_fields": ["n"]}), manifest)
    assert (kept.rule, kept.types, kept.stringified) == ("stringify", {"n": pa.string()}, {"n"})
    assert manifest.kept_fields is not None and manifest.kept_fields["rule"] == "stringify"
    ((text, fields),) = messages.lines
    assert fields["event"] == "kept_fields_stay_text" and "n stay JSON text" in text


def test_stringify_on_a_strict_output_it_would_change_is_refused(tmp_path: Path,
                                                                 job_file: Callable[..., Path]) -> None:
    write_jsonl(tmp_path / "c" / "a.jsonl", [{"text": "t", "n": 1, "s": "x"}])
    manifest = Manifest("f", "test-job")
    decide(job_file({"path": str(tmp_path / "c"), "keep_fields": ["n", "s"]}), manifest)
    manifest.shards["s"] = ShardEntry(rows=1, rejects=0, run_id="r", committed_at="now")
    stringify = job_file({"path": str(tmp_path / "c"), "keep_fields": ["n", "s"], "keep_fields_types": "stringify"})
    with pytest.raises(OutputMismatch, match=r"kept field 'n' as int64 .*new output\.path"):
        decide(stringify, manifest)
    manifest.shards.clear()  # nothing committed: nothing to keep, the types are decided again
    assert decide(stringify, manifest)[0].types == {"n": pa.string(), "s": pa.string()}


@pytest.mark.usefixtures("ray_session")
def test_a_run_keeps_each_fields_type_and_says_which_it_writes_as_text(tmp_path: Path,
                                                                       job_file: Callable[..., Path]) -> None:
    rows = [{"id": f"d{i}", "text": f"document {i}", **KEPT, "mixed": i if i % 2 else f"s{i}"} for i in range(6)]
    write_jsonl(tmp_path / "c" / "docs.jsonl", rows)
    lines = io.StringIO()
    job = load_job(job_file({"path": str(tmp_path / "c"), "id_field": "id", "keep_fields": [*KEPT, "mixed"]},
                            {"provider": "local", "count": 1}))
    summary = run_job(job, reporter=LineReporter(lines))
    out = tmp_path / "out"
    table = ds.dataset(out / "vectors").to_table()
    assert {name: table.schema.field(name).type for name in [*KEPT, "mixed"]} == {
        "n": pa.int64(), "x": pa.float64(), "flag": pa.bool_(), "tags": pa.list_(pa.int64()),
        "meta": pa.struct([("a", pa.int64()), ("b", pa.string())]), "title": pa.string(), "mixed": pa.string()}
    by_id = {row["id"]: row for row in table.to_pylist()}
    assert {k: by_id["d1"][k] for k in KEPT} == KEPT
    assert (by_id["d1"]["mixed"], by_id["d2"]["mixed"]) == ("1", "s2")
    warning = "kept field 'mixed' holds values of more than one type"
    assert lines.getvalue().count(warning) == 1
    report = orjson.loads((out / "runs" / f"{summary.run_id}.json").read_bytes())
    events = [e for e in report["events"] if e["event"] == "kept_field_stringified"]
    assert [(e["field"], e["types"]) for e in events] == [("mixed", ["string, int64 in docs.jsonl"])]
    manifest = orjson.loads((out / "_manifest.json").read_bytes())
    assert manifest["kept_fields"]["types"]["n"] == "int64" and manifest["kept_fields"]["stringified"] == ["mixed"]


@pytest.mark.usefixtures("ray_session")
def test_a_value_that_does_not_fit_stops_its_shard_and_stringify_then_works(tmp_path: Path,
                                                                            job_file: Callable[..., Path]) -> None:
    rows = [{"id": f"d{i}", "text": f"document {i}", "n": i} for i in range(150)]
    rows[120]["n"] = "one hundred twenty"  # past the probe's sample: the type was decided as int64
    write_jsonl(tmp_path / "c" / "docs.jsonl", rows)
    corpus = {"path": str(tmp_path / "c"), "id_field": "id", "keep_fields": ["n"]}
    servers = {"provider": "local", "count": 1}
    with pytest.raises(CorpusMismatch) as caught:
        run_job(load_job(job_file(corpus, servers)))
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert re.search(r"docs\.jsonl:121: kept field 'n' holds a string \('one hundred twenty'\), but the output's "
                     r"column 'n' is int64", message), message
    assert "keep_fields_types: stringify" in message
    assert not list((tmp_path / "out" / "vectors").glob("*.parquet")), "the shard was not committed"
    summary = run_job(load_job(job_file({**corpus, "keep_fields_types": "stringify"}, servers)))
    assert summary.embedded == 150
    table = ds.dataset(tmp_path / "out" / "vectors").to_table()
    assert table.schema.field("n").type == pa.string()
    assert {row["id"]: row["n"] for row in table.to_pylist()}["d120"] == "one hundred twenty"
