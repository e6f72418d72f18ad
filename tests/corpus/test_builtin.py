from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path
from typing import Any

import pyarrow as pa

from teibatch.corpus import CorpusOptions, Document, keep_field_types, plan_shards, read_shard
from teibatch.corpus.builtin import STDLIB_DOC_MODULES, load_builtin, stdlib_docs, stdlib_source
from teibatch.server.tokens import ApproxTokenizer

OPTIONS = CorpusOptions("builtin:stdlib-docs", keep_fields=("source", "title"), shard_docs=1000)


def test_stdlib_docs_is_a_few_thousand_unique_documents() -> None:
    records = list(stdlib_docs())
    assert 3000 <= len(records) <= 8000
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids)
    assert {r["source"] for r in records} == {"module", "docstring", "topic"}
    assert all(set(r) == {"id", "text", "source", "title"} and r["text"].strip() for r in records)
    assert not any(re.search(r"0x[0-9a-fA-F]{6,}", r["text"]) for r in records)
    assert "topic:if" in ids and "json:dumps" in ids


def test_stdlib_docs_is_deterministic() -> None:
    assert list(stdlib_docs()) == list(stdlib_docs())
    assert list(STDLIB_DOC_MODULES) == sorted(set(STDLIB_DOC_MODULES))


def test_builtin_is_sharded_like_any_corpus(kit: Any) -> None:
    corpus = load_builtin("builtin:stdlib-docs")
    shards = plan_shards(OPTIONS)
    assert shards == plan_shards(OPTIONS)
    assert sum(s.size for s in shards) == len(corpus.records)
    assert all(s.format == "builtin" and s.sources == ("builtin:stdlib-docs",) for s in shards)
    items = list(read_shard(OPTIONS, shards[-1]))
    assert all(isinstance(d, Document) for d in items)
    assert [d.id for d in items] == [r["id"] for r in corpus.records[shards[-1].start:]]
    assert set(items[0].fields) == {"source", "title"}
    assert keep_field_types(OPTIONS) == {"source": pa.string(), "title": pa.string()}


def test_builtin_honours_an_explicit_id_field() -> None:
    options = CorpusOptions("builtin:stdlib-docs", id_field="title", shard_docs=100_000)
    (shard,) = plan_shards(options)
    first = next(iter(read_shard(options, shard)))
    assert isinstance(first, Document) and first.id == load_builtin("builtin:stdlib-docs").records[0]["title"]


def test_stdlib_source_is_one_long_document_per_module() -> None:
    records = list(stdlib_source())
    assert 500 <= len(records) <= 1500
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids)
    assert all(set(r) == {"id", "text", "title", "path"} and r["title"] == r["id"] and r["text"].strip()
               for r in records)
    by_id = {r["id"]: r for r in records}
    assert (by_id["json"]["path"], by_id["json.decoder"]["path"]) == ("json/__init__.py", "json/decoder.py")
    root = Path(sysconfig.get_paths()["stdlib"])
    assert by_id["json.decoder"]["text"] == Path(json.decoder.__file__).read_text(encoding="utf-8")
    assert all((root / r["path"]).is_file() for r in records)
    assert not any(part in {"test", "tests", "site-packages"} for r in records for part in r["path"].split("/"))
    tokens = sorted(ApproxTokenizer().count(r["text"]) for r in records)
    assert tokens[len(tokens) // 2] >= 1000 and tokens[-1] >= 20_000  # long documents


def test_stdlib_source_is_deterministic_and_sharded_like_any_corpus() -> None:
    assert list(stdlib_source()) == list(stdlib_source())
    records = [r["path"] for r in stdlib_source()]
    assert records == sorted(records, key=lambda path: path.split("/"))
    options = CorpusOptions("builtin:stdlib-source", keep_fields=("title", "path"), shard_docs=100)
    shards = plan_shards(options)
    corpus = load_builtin("builtin:stdlib-source")
    assert sum(s.size for s in shards) == len(corpus.records) and len(shards) > 1
    items = list(read_shard(options, shards[1]))
    assert [d.id for d in items if isinstance(d, Document)] == [r["id"] for r in corpus.records[100:200]]
    assert corpus.fingerprint != load_builtin("builtin:stdlib-docs").fingerprint
