"""/info, /tokenize, /decode, /metrics and /teibatch/stats."""

from __future__ import annotations

import httpx
import pytest

from teibatch.server.metrics import text_digest
from teibatch.server.testing import running_server


def test_info_has_every_tei_field_in_order(client: httpx.Client) -> None:
    response = client.get("/info")
    assert response.headers["content-type"] == "application/json"
    assert list(response.json().items()) == [
        ("model_id", "teibatch/hashing-384"), ("model_sha", None), ("model_dtype", "float32"),
        ("served_model_name", "teibatch/hashing-384"), ("model_type", {"embedding": {"pooling": "mean"}}),
        ("max_concurrent_requests", 512), ("max_input_length", 512), ("max_batch_tokens", 16384),
        ("max_batch_requests", None), ("max_client_batch_size", 32), ("auto_truncate", True),
        ("tokenization_workers", 1), ("version", "1.9.3"), ("sha", None), ("docker_label", None)]


def test_info_reflects_options() -> None:
    with running_server(model_id="my/model", served_model_name="alias", max_client_batch_size=7,
                        max_batch_tokens=256, max_input_length=1024, auto_truncate=True) as url:
        info = httpx.get(f"{url}/info").json()
    assert (info["model_id"], info["served_model_name"], info["max_client_batch_size"],
            info["max_input_length"]) == ("my/model", "alias", 7, 256)


def test_tokenize_single_and_batch(client: httpx.Client) -> None:
    single = client.post("/tokenize", json={"inputs": "hi!"})
    assert single.status_code == 200
    assert "x-compute-type" not in single.headers
    assert single.json() == [[
        {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None},
        {"id": single.json()[0][1]["id"], "text": "hi", "special": False, "start": 0, "stop": 2},
        {"id": single.json()[0][2]["id"], "text": "!", "special": False, "start": 2, "stop": 3},
        {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None}]]
    batch = client.post("/tokenize", json={"inputs": ["a", "b c"], "add_special_tokens": False}).json()
    assert [[t["text"] for t in tokens] for tokens in batch] == [["a"], ["b", "c"]]


def test_tokenize_never_truncates() -> None:
    with running_server(max_input_length=4) as url:
        tokens = httpx.post(f"{url}/tokenize", json={"inputs": "a b c d e f"}).json()[0]
    assert len(tokens) == 8


def test_tokenize_refuses_an_input_over_the_character_limit_even_when_auto_truncating(client: httpx.Client) -> None:
    # TEI tokenizes /tokenize inputs with truncation off: max_input_length (512) * 250 characters at
    # most, whatever --auto-truncate says, and one input over fails the whole request.
    assert client.post("/tokenize", json={"inputs": ["a", "é" * 128_000]}).status_code == 200
    response = client.post("/tokenize", json={"inputs": ["a", "é" * 128_001], "add_special_tokens": False})
    assert (response.status_code, response.json()) == (422, {
        "error": "Input validation error: `inputs` must have less than 128000 characters. Given: 128001",
        "error_type": "Validation"})
    assert client.get("/teibatch/stats").json()["violations"]["input_length"] == 1


@pytest.mark.parametrize("body, status, expected", [
    pytest.param({"inputs": []}, 400, {"error": "`inputs` cannot be empty", "error_type": "Empty"},
                 id="tokenize-empty-batch"),
    pytest.param({"inputs": ["a"] * 33}, 422,
                 {"error": "batch size 33 > maximum allowed batch size 32", "error_type": "Validation"},
                 id="tokenize-batch-size"),
])
def test_tokenize_errors(client: httpx.Client, body: dict[str, object], status: int,
                         expected: dict[str, str]) -> None:
    response = client.post("/tokenize", json=body)
    assert (response.status_code, response.json()) == (status, expected)


def test_decode_round_trips_tokenize(client: httpx.Client) -> None:
    ids = [t["id"] for t in client.post("/tokenize", json={"inputs": "Hello, world"}).json()[0]]
    assert client.post("/decode", json={"ids": ids}).json() == ["Hello, world"]
    assert client.post("/decode", json={"ids": [ids], "skip_special_tokens": False}).json() == [
        "[CLS] Hello, world [SEP]"]


@pytest.mark.parametrize("ids", [pytest.param([], id="empty"), pytest.param([[]], id="empty-inner")])
def test_decode_empty(client: httpx.Client, ids: object) -> None:
    response = client.post("/decode", json={"ids": ids})
    assert (response.status_code, response.json()) == (
        400, {"error": "Input validation error: `input_ids` cannot be empty", "error_type": "Empty"})


def test_metrics_are_prometheus_text_with_tei_names(client: httpx.Client) -> None:
    client.post("/embed", json={"inputs": ["a", "b"]})
    client.post("/embed", json={"inputs": ["a"] * 40})
    response = client.get("/metrics")
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    lines = set(response.text.splitlines())
    for line in ('te_request_count{method="batch"} 2', 'te_request_success{method="batch"} 1',
                 'te_request_failure{err="batch_size"} 1', "te_queue_size 0", "te_embed_success 1",
                 'teibatch_violation_total{kind="batch_size"} 1', 'teibatch_violation_total{kind="payload"} 0',
                 'teibatch_fault_injected{kind="429"} 0', 'te_batch_next_size_bucket{le="+Inf"} 1'):
        assert line in lines, line
    assert any(line.startswith("te_request_duration_bucket{le=") for line in lines)


def test_stats_record_text_digests_and_reset() -> None:
    with running_server(record_texts=True) as url, httpx.Client(base_url=url) as c:
        c.post("/embed", json={"inputs": ["a", "b", "a"]})
        c.post("/v1/embeddings", json={"input": [[1000, 1001]]})
        stats = c.delete("/teibatch/stats").json()
        after = c.get("/teibatch/stats").json()
    assert stats["texts"] == {text_digest("a"): 2, text_digest("b"): 1, text_digest((1000, 1001)): 1}
    assert (stats["inputs_embedded"], stats["requests"]["by_route"]["/embed"]) == (4, 1)
    assert stats["requests"]["by_status"] == {"200": 2}
    assert (after["inputs_embedded"], after["texts"]) == (0, {})
