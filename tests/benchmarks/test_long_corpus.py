"""``benchmarks/long_corpus.py`` makes what it says: long documents of the asked token range, counted
by the built-in server's rule, realistic text, the same for the same seed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import orjson
import pytest

from teibatch.corpus.text_units import split_paragraphs
from teibatch.server.tokens import ApproxTokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "long_corpus.py"


@pytest.fixture(scope="module")
def long_corpus() -> ModuleType:
    spec = importlib.util.spec_from_file_location("long_corpus", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_documents_are_long_realistic_and_counted_by_the_hashing_rule(long_corpus: ModuleType,
                                                                      tmp_path: Path) -> None:
    written = long_corpus.write_long_corpus(tmp_path / "long.jsonl", 12)
    rows = [orjson.loads(line) for line in (tmp_path / "long.jsonl").read_bytes().splitlines()]
    rule = ApproxTokenizer()
    tokens = [rule.count(row["text"]) - rule.special_tokens for row in rows]
    assert [row["id"] for row in rows] == [f"long-{i:05d}" for i in range(12)]
    assert all(2_000 <= count <= 20_000 for count in tokens)
    assert (written.documents, written.tokens, written.min_tokens, written.max_tokens) == (
        12, sum(tokens), min(tokens), max(tokens))
    assert f"{sum(tokens):,} tokens" in str(written)
    assert all(len(split_paragraphs(row["text"])) > 3 and row["title"] and row["text"].startswith(row["title"])
               for row in rows)
    assert sum(not row["text"].isascii() for row in rows) >= 10  # about one sentence in twenty is not


def test_the_same_seed_gives_the_same_corpus(long_corpus: ModuleType) -> None:
    first = list(long_corpus.long_documents(3, seed=5, min_tokens=500, max_tokens=1_500))
    assert first == list(long_corpus.long_documents(3, seed=5, min_tokens=500, max_tokens=1_500))
    assert first != list(long_corpus.long_documents(3, seed=6, min_tokens=500, max_tokens=1_500))
    assert all(500 <= tokens <= 1_500 for _, tokens in first)


def test_a_range_narrower_than_a_sentence_is_refused(long_corpus: ModuleType) -> None:
    with pytest.raises(ValueError, match="longest sentence"):
        next(long_corpus.long_documents(1, min_tokens=100, max_tokens=120))


def test_the_script_prints_its_total_tokens(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "c.jsonl"), "--documents", "3"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.startswith("3 documents, ") and " tokens (" in done.stdout
