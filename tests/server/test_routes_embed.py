"""/embed, /v1/embeddings, /embed_sparse, /embed_all, /similarity: TEI's shapes and per-input errors."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from teibatch.server.backends.hashing import HashingEmbedder
from teibatch.server.testing import running_server
from teibatch.server.tokens import ApproxTokenizer

JSON = "application/json"
COMPUTE_HEADERS = ("x-compute-type", "x-compute-time", "x-compute-characters", "x-compute-tokens",
                   "x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


def error(message: str, error_type: str = "Validation") -> dict[str, str]:
    return {"error": message, "error_type": error_type}


@pytest.mark.parametrize("inputs, count", [
    pytest.param("hello world", 1, id="string"),
    pytest.param(["a", "b", "c"], 3, id="list"),
    pytest.param([101, 2023, 102], 1, id="token-ids-are-one-input"),
    pytest.param([[101, 2023], [7, 8, 9]], 2, id="batch-of-ids"),
    pytest.param(["a", [1000, 1001]], 2, id="mixed"),
])
def test_embed_shapes(client: httpx.Client, inputs: object, count: int) -> None:
    response = client.post("/embed", json={"inputs": inputs})
    assert response.status_code == 200
    assert response.headers["content-type"] == JSON
    vectors = np.array(response.json(), dtype=np.float32)
    assert vectors.shape == (count, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert all(h in response.headers for h in COMPUTE_HEADERS)


def test_embed_equals_the_embedder_bit_for_bit(client: httpx.Client) -> None:
    texts = ["A man is eating food.", "The stock market fell today."]
    served = np.array(client.post("/embed", json={"inputs": texts}).json(), dtype=np.float32)
    assert served.tobytes() == HashingEmbedder(384).embed(texts).tobytes()


def test_token_ids_embed_like_their_text(client: httpx.Client) -> None:
    ids = [t.id for t in ApproxTokenizer().encode("Hello, world")]
    by_ids, by_text = client.post("/embed", json={"inputs": [ids, "Hello, world"]}).json()
    assert by_ids == by_text


def test_normalize_false_and_dimensions(client: httpx.Client) -> None:
    text = "the quick brown fox jumps over the lazy dog"
    raw = np.array(client.post("/embed", json={"inputs": text, "normalize": False}).json()[0])
    assert np.linalg.norm(raw) > 1.0
    cut = np.array(client.post("/embed", json={"inputs": text, "dimensions": 128}).json()[0])
    assert cut.shape == (128,)
    np.testing.assert_allclose(np.linalg.norm(cut), 1.0, rtol=1e-5)
    np.testing.assert_allclose(cut, raw[:128] / np.linalg.norm(raw[:128]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("body, status, expected", [
    pytest.param({"inputs": ""}, 400, error("Input validation error: `inputs` cannot be empty", "Empty"),
                 id="empty-string"),
    pytest.param({"inputs": []}, 400, error("Input validation error: `inputs` cannot be empty", "Empty"),
                 id="empty-list-is-empty-ids"),
    pytest.param({"inputs": ["a", ""]}, 400, error("Input validation error: `inputs` cannot be empty", "Empty"),
                 id="one-empty-in-batch"),
    pytest.param({"inputs": "a", "dimensions": 0}, 422,
                 error("Input validation error: `dimensions` should be positive"), id="dimensions-zero"),
    pytest.param({"inputs": "a", "dimensions": 385}, 422,
                 error("Input validation error: `dimensions` should be smaller than the maximum embedding "
                       "dimension."), id="dimensions-too-big"),
    pytest.param({"inputs": "a", "prompt_name": "query"}, 422,
                 error("Input validation error: `default-prompt-name` is set to `query` but no prompts were "
                       "found in the Sentence Transformers configuration"), id="unknown-prompt"),
    pytest.param({"inputs": ["a"] * 33}, 422, error("batch size 33 > maximum allowed batch size 32"),
                 id="batch-size"),
])
def test_embed_errors(client: httpx.Client, body: dict[str, object], status: int,
                      expected: dict[str, str]) -> None:
    response = client.post("/embed", json=body)
    assert (response.status_code, response.headers["content-type"], response.json()) == (status, JSON, expected)


def test_too_many_tokens_without_truncation() -> None:
    long_text = "word " * 20  # 22 tokens
    with running_server(max_input_length=10) as url:
        response = httpx.post(f"{url}/embed", json={"inputs": long_text, "truncate": False})
        assert (response.status_code, response.json()) == (422, error(
            "Input validation error: `inputs` must have less than 10 tokens. Given: 22"))
        stats = httpx.get(f"{url}/teibatch/stats").json()
        assert stats["violations"]["input_length"] == 1


@pytest.mark.parametrize("options, body, kept", [
    pytest.param({}, {"truncate": True}, "word0 word1 word2", id="truncate-true-right"),
    pytest.param({}, {"truncate": True, "truncation_direction": "Left"}, "word17 word18 word19",
                 id="truncate-left"),
    pytest.param({}, {}, "word0 word1 word2", id="null-means-auto-truncate"),
])
def test_truncation_embeds_the_cut_text(options: dict[str, object], body: dict[str, object], kept: str) -> None:
    text = " ".join(f"word{i}" for i in range(20))
    with running_server(max_input_length=8, **options) as url:
        served = httpx.post(f"{url}/embed", json={"inputs": text, **body}).json()
        expected = httpx.post(f"{url}/embed", json={"inputs": kept}).json()
    assert served == expected


def test_auto_truncate_false_refuses_when_truncate_is_null() -> None:
    with running_server(max_input_length=8, auto_truncate=False) as url:
        response = httpx.post(f"{url}/embed", json={"inputs": "a b c d e f g h i"})
    assert (response.status_code, response.json()) == (422, error(
        "Input validation error: `inputs` must have less than 8 tokens. Given: 11"))


def test_too_many_characters() -> None:
    with running_server(max_input_length=4, auto_truncate=False) as url:
        response = httpx.post(f"{url}/embed", json={"inputs": "a" * 1001})
        assert (response.status_code, response.json()) == (422, error(
            "Input validation error: `inputs` must have less than 1000 characters. Given: 1001"))
        assert httpx.post(f"{url}/embed", json={"inputs": "a" * 1001, "truncate": True}).status_code == 200


def test_prompts_are_prepended() -> None:
    with running_server(prompts={"query": "query: "}) as url:
        prompted = httpx.post(f"{url}/embed", json={"inputs": "cats", "prompt_name": "query"}).json()
        plain = httpx.post(f"{url}/embed", json={"inputs": "query: cats"}).json()
        missing = httpx.post(f"{url}/embed", json={"inputs": "cats", "prompt_name": "doc"})
    assert prompted == plain
    assert missing.json() == error("Input validation error: `default-prompt-name` is set to `doc` but it was "
                                   'not found in the Sentence Transformers prompts. Available prompts: ["query"]')


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings"])
def test_openai_float_and_base64(client: httpx.Client, path: str) -> None:
    floats = client.post(path, json={"input": ["hello world", "cats"], "model": "whatever"})
    assert floats.status_code == 200
    body = floats.json()
    assert body["object"] == "list" and body["model"] == "teibatch/hashing-384"
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    encoded = client.post(path, json={"input": ["hello world", "cats"], "encoding_format": "base64"}).json()
    for as_float, as_b64 in zip(body["data"], encoded["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(as_b64["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(as_float["embedding"], dtype=np.float32))


def test_openai_errors_use_the_openai_shape(client: httpx.Client) -> None:
    response = client.post("/v1/embeddings", json={"input": ["a"] * 33})
    assert (response.status_code, response.json()) == (422, {
        "message": "batch size 33 > maximum allowed batch size 32", "code": 422, "type": "Validation"})
    bad_format = client.post("/v1/embeddings", json={"input": "a", "encoding_format": "int8"})
    assert bad_format.status_code == 422
    assert bad_format.headers["content-type"] == "text/plain; charset=utf-8"
    assert bad_format.text.startswith("Failed to deserialize the JSON body into the target type: encoding_format")


def test_openai_dimensions(client: httpx.Client) -> None:
    body = client.post("/v1/embeddings", json={"input": "a b", "dimensions": 8}).json()
    assert len(body["data"][0]["embedding"]) == 8


def test_embed_sparse_needs_splade(client: httpx.Client) -> None:
    response = client.post("/embed_sparse", json={"inputs": "a"})
    assert (response.status_code, response.json()) == (424, error(
        "Backend error: Model is not an embedding model with SPLADE pooling", "Backend"))


def test_splade_mode() -> None:
    with running_server(pooling="splade") as url:
        sparse = httpx.post(f"{url}/embed_sparse", json={"inputs": ["hello world", "cats"]})
        dense = httpx.post(f"{url}/embed", json={"inputs": "a"})
        raw = httpx.post(f"{url}/embed", json={"inputs": "a", "normalize": False})
        info = httpx.get(f"{url}/info").json()
    assert sparse.status_code == 200
    entries = sparse.json()
    assert len(entries) == 2 and all(set(e) == {"index", "value"} for e in entries[0])
    assert (dense.status_code, dense.json()) == (424, error(
        "Backend error: `normalize` is not available for SPLADE models", "Backend"))
    assert raw.status_code == 200 and len(raw.json()[0]) == 30522
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}


def test_embed_all_gives_one_vector_per_token(client: httpx.Client) -> None:
    response = client.post("/embed_all", json={"inputs": ["hello world", "a"]})
    assert response.status_code == 200
    shapes = [np.array(v).shape for v in response.json()]
    assert shapes == [(6, 384), (3, 384)]  # [CLS] hell o worl d [SEP]


def test_similarity(client: httpx.Client) -> None:
    body = {"inputs": {"source_sentence": "A man is eating food.",
                       "sentences": ["A man is eating bread.", "The stock market fell today."]}}
    response = client.post("/similarity", json=body)
    assert response.status_code == 200
    close, far = response.json()
    assert close > far
    empty = client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}})
    assert (empty.status_code, empty.json()) == (400, error("`inputs.sentences` cannot be empty", "Empty"))
