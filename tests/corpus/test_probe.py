"""``probe_corpus``: the cheap check of a corpus against its job before any work."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest

from teibatch.corpus import CorpusOptions, CorpusProbe, plan_shards, probe_corpus, read_shard
from teibatch.errors import CorpusMismatch

ROWS = [{"id": f"r{i}", "text": f"row {i} text", "title": f"T{i}"} for i in range(150)]


def write_format(kit: Any, root: Path, fmt: str) -> Path:
    """ROWS in one file of format ``fmt`` under ``root``; returns the corpus path to give the job."""
    if fmt in ("jsonl", "jsonl.gz", "jsonl.zst", "jsonl.bz2"):
        return kit.write_jsonl(root / f"c.{fmt}", ROWS)
    if fmt == "json":
        path = root / "c.json"
        path.write_bytes(orjson.dumps({"records": ROWS}))
        return path
    if fmt in ("csv", "tsv"):
        return kit.write_csv(root / f"c.{fmt}", ["id", "text", "title"],
                             [[r["id"], r["text"], r["title"]] for r in ROWS], "\t" if fmt == "tsv" else ",")
    assert fmt == "parquet"
    return kit.write_parquet(root / "c.parquet", ROWS, row_group_size=64)


@pytest.mark.parametrize("fmt", [
    pytest.param(f, id=f) for f in ("jsonl", "jsonl.gz", "jsonl.zst", "jsonl.bz2", "json", "csv", "tsv", "parquet")
])
def test_every_row_format_passes_with_its_fields(kit: Any, tmp_path: Path, fmt: str) -> None:
    path = write_format(kit, tmp_path, fmt)
    probe = probe_corpus(CorpusOptions(str(path), id_field="id", keep_fields=("title",)))
    assert isinstance(probe, CorpusProbe)
    assert (probe.files, probe.sample_file, probe.records) == (1, path.name, 100)
    assert probe.fields == ("id", "text", "title")
    assert probe.rejects == {} and probe.repeated_ids == ()
    assert path.name in probe.summary() and "100 records" in probe.summary()


def test_text_files_and_builtin_corpus(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# a document")
    (tmp_path / "b.txt").write_text("another")
    probe = probe_corpus(CorpusOptions(str(tmp_path), id_field="ignored-for-text"))
    assert (probe.files, probe.sample_file, probe.format, probe.records, probe.fields) == (2, "a.md", "text", 1,
                                                                                            ("text",))
    builtin = probe_corpus(CorpusOptions("builtin:stdlib-docs", keep_fields=("title",)))
    assert builtin.records == 100 and set(builtin.fields) == {"id", "text", "source", "title"}


def test_a_mixed_folder_samples_its_first_row_file(kit: Any, mixed_corpus: Path) -> None:
    probe = probe_corpus(CorpusOptions(str(mixed_corpus), id_field="id", keep_fields=("n",)))
    assert (probe.files, probe.sample_file, probe.records) == (4, "a.jsonl", 5)


@pytest.mark.parametrize("path", [pytest.param("nowhere", id="missing-dir"), pytest.param("*.jsonl", id="glob")])
def test_nothing_matching_names_the_path(tmp_path: Path, path: str) -> None:
    (tmp_path / "a.csv").write_text("text\nx\n")
    with pytest.raises(CorpusMismatch, match=r"no (such file|file matches)") as caught:
        probe_corpus(CorpusOptions(str(tmp_path / path)))
    assert caught.value.file == str(tmp_path / path)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("options", "field", "advice"),
    [
        pytest.param({"text_field": "body"}, "body", "corpus.text_field", id="text-field"),
        pytest.param({"id_field": "doc_id"}, "doc_id", "corpus.id_field", id="id-field"),
        pytest.param({"keep_fields": ("title", "url")}, "url", "corpus.keep_fields", id="keep-field"),
    ],
)
def test_a_missing_field_names_file_field_and_the_fields_seen(kit: Any, tmp_path: Path, options: dict[str, Any],
                                                              field: str, advice: str) -> None:
    for fmt in ("jsonl", "csv", "parquet"):
        path = write_format(kit, tmp_path, fmt)
        with pytest.raises(CorpusMismatch) as caught:
            probe_corpus(CorpusOptions(str(path), **options))
        error = caught.value
        assert (error.file, error.field) == (path.name, field)
        assert f"no field {field!r}" in str(error)
        assert "fields seen: id, text, title" in str(error)
        assert advice in str(error)


def test_a_field_in_some_records_is_enough(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", [{"text": "a"}, {"text": "b", "url": "u"}, {"text": ""}])
    probe = probe_corpus(CorpusOptions(str(path), keep_fields=("url",)))
    assert probe.fields == ("text", "url")
    assert probe.rejects == {"empty_text": 1}


def test_keep_fields_on_text_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("words")
    with pytest.raises(CorpusMismatch, match="without fields") as caught:
        probe_corpus(CorpusOptions(str(tmp_path), keep_fields=("title",)))
    assert caught.value.field == "title"


def test_records_that_do_not_parse(kit: Any, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("id,text\na,hello\n")  # a CSV file named .jsonl
    with pytest.raises(CorpusMismatch, match=r"none of the first 2 records parses \(first: c\.jsonl#0 \(line 1\):"):
        probe_corpus(CorpusOptions(str(path)))


@pytest.mark.parametrize(
    ("rows", "options", "field", "words"),
    [
        pytest.param([{"text": i} for i in range(5)], {}, "text", "holds no text", id="numbers-as-text"),
        pytest.param([{"id": i + 0.5, "text": "x"} for i in range(5)], {"id_field": "id"}, "id",
                     "no usable id", id="float-ids"),
        pytest.param([{"id": "", "text": "x"}] * 3, {"id_field": "id"}, "id", "no usable id", id="empty-ids"),
        pytest.param([{"lang": "en" if i % 3 else "fr", "text": f"t{i}"} for i in range(30)], {"id_field": "lang"},
                     "lang", "does not look like an id", id="category-as-id"),
    ],
)
def test_fields_that_cannot_serve(kit: Any, tmp_path: Path, rows: list[dict[str, Any]], options: dict[str, Any],
                                  field: str, words: str) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(CorpusMismatch, match=words) as caught:
        probe_corpus(CorpusOptions(str(path), **options))
    assert (caught.value.file, caught.value.field) == ("c.jsonl", field)


def test_a_few_repeated_ids_are_reported_not_refused(kit: Any, tmp_path: Path) -> None:
    rows = [*ROWS[:50], ROWS[3], *ROWS[50:100]]
    path = kit.write_jsonl(tmp_path / "c.jsonl", rows)
    probe = probe_corpus(CorpusOptions(str(path), id_field="id"))
    assert probe.repeated_ids == ("r3",)
    assert probe.rejects == {"duplicate_id": 1}
    assert "'r3'" in probe.summary()


def test_empty_files_are_skipped_and_an_empty_corpus_refused(kit: Any, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("")
    kit.write_csv(tmp_path / "b.csv", ["id", "text"], [])  # a header and no rows
    kit.write_jsonl(tmp_path / "c.jsonl", ROWS[:3])
    assert probe_corpus(CorpusOptions(str(tmp_path))).sample_file == "c.jsonl"
    (tmp_path / "c.jsonl").write_text("\n\n")
    with pytest.raises(CorpusMismatch, match=r"no records in the first 3 file\(s\)"):
        probe_corpus(CorpusOptions(str(tmp_path)))


def test_the_probe_reads_only_its_sample(tmp_path: Path) -> None:
    # the file breaks off at row ~20,000: the probe never gets there, the shard reading it does
    data = gzip.compress(b"".join(orjson.dumps({"id": f"r{i}", "text": "t"}) + b"\n" for i in range(40_000)))
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    options = CorpusOptions(str(path), id_field="id", shard_docs=100_000)
    assert probe_corpus(options).records == 100
    (shard,) = plan_shards(options)
    with pytest.raises(CorpusMismatch, match=r"big\.jsonl\.gz"):
        list(read_shard(options, shard))


def test_a_bad_first_file_fails_the_probe_with_its_line(tmp_path: Path) -> None:
    lines = ["id,text", "a,fine", 'b,"never closed', *(f"r{i},x" for i in range(50))]
    path = tmp_path / "c.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusMismatch, match="never closes") as caught:
        probe_corpus(CorpusOptions(str(path), id_field="id"))
    assert (caught.value.file, caught.value.line) == ("c.csv", 3)
    probe = probe_corpus(CorpusOptions(str(path), id_field="id", on_bad_file="reject"))
    assert probe.rejects == {"malformed_record": 51}


def test_probe_over_s3(kit: Any, s3_endpoint: str) -> None:
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="probe")
    body = b"".join(orjson.dumps(row) + b"\n" for row in ROWS)
    client.put_object(Bucket="probe", Key="docs/part-0.jsonl.gz", Body=gzip.compress(body))
    storage = {"client_kwargs": {"endpoint_url": s3_endpoint}, "skip_instance_cache": True}
    probe = probe_corpus(CorpusOptions("s3://probe/docs/*.jsonl.gz", id_field="id", storage_options=storage))
    assert (probe.files, probe.sample_file, probe.records) == (1, "part-0.jsonl.gz", 100)
    with pytest.raises(CorpusMismatch, match="no field 'body'"):
        probe_corpus(CorpusOptions("s3://probe/docs", text_field="body", storage_options=storage))
    with pytest.raises(CorpusMismatch, match="no file matches"):
        probe_corpus(CorpusOptions("s3://probe/docs/*.csv", storage_options=storage))


def test_an_integer_and_a_string_id_that_collide_say_so(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", [{"id": 1, "text": "one"}, {"id": "1", "text": "string one"}])
    with pytest.raises(CorpusMismatch, match="does not look like an id") as caught:
        probe_corpus(CorpusOptions(str(path), id_field="id"))
    assert ('(\'1\' 2 times: id "1" (string, line 2) collides with integer 1 (line 1): integer ids are written as '
            "decimal strings)") in str(caught.value)
    rows = [*({"id": i, "text": "t"} for i in range(50)), {"id": "7", "text": "t"}]
    probe = probe_corpus(CorpusOptions(str(kit.write_jsonl(tmp_path / "d.jsonl", rows)), id_field="id"))
    assert probe.repeated_ids == ("7",)
    assert 'id "7" (string, line 51) collides with integer 7 (line 8)' in probe.summary()


def test_plain_repeated_ids_name_where_they_were_first_seen(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", [{"id": "same", "text": "t"}] * 3)
    with pytest.raises(CorpusMismatch, match=r"\('same' 3 times, first at line 1\)"):
        probe_corpus(CorpusOptions(str(path), id_field="id"))


def test_dotted_paths_are_found_in_json_and_parquet_and_a_missing_one_shows_the_nested_keys(
        kit: Any, tmp_path: Path) -> None:
    rows = [{"doc": {"id": f"r{i}", "body": f"text {i}", "meta": {"lang": "en"}}} for i in range(5)]
    kit.write_jsonl(tmp_path / "j" / "c.jsonl", rows)
    kit.write_parquet(tmp_path / "p" / "c.parquet", rows)
    for folder in ("j", "p"):
        options = CorpusOptions(str(tmp_path / folder), id_field="doc.id", text_field="doc.body",
                                keep_fields=("doc.meta.lang",))
        assert probe_corpus(options).rejects == {}
        with pytest.raises(CorpusMismatch, match=r"no field 'doc\.text' .*fields seen: doc\.id, doc\.body, "
                                                 r"doc\.meta\.lang\)") as caught:
            probe_corpus(CorpusOptions(str(tmp_path / folder), text_field="doc.text"))
        assert caught.value.field == "doc.text"
