"""Reranker mode: /rerank and /predict, and the 424s between model kinds."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from teibatch.server.testing import running_server

QUERY = "What is Deep Learning?"
TEXTS = ["The stock market fell today.", "Deep Learning is a kind of machine learning."]


@pytest.fixture
def reranker() -> Iterator[httpx.Client]:
    with running_server(model_kind="reranker") as url, httpx.Client(base_url=url) as c:
        yield c


def test_rerank_sorts_by_score(reranker: httpx.Client) -> None:
    response = reranker.post("/rerank", json={"query": QUERY, "texts": TEXTS})
    assert response.status_code == 200
    body = response.json()
    assert [entry["index"] for entry in body] == [1, 0]
    assert all(set(entry) == {"index", "score"} for entry in body)
    assert 0 < body[1]["score"] < body[0]["score"] < 1


def test_rerank_return_text_and_raw_scores(reranker: httpx.Client) -> None:
    body = reranker.post("/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True,
                                          "raw_scores": True}).json()
    assert [entry["text"] for entry in body] == [TEXTS[1], TEXTS[0]]
    assert body[1]["score"] < 0  # a logit, not a probability


@pytest.mark.parametrize("body, status, expected", [
    pytest.param({"query": "q", "texts": []}, 400, {"error": "`texts` cannot be empty", "error_type": "Empty"},
                 id="no-texts"),
    pytest.param({"query": "q", "texts": ["t"] * 33}, 422,
                 {"error": "batch size 33 > maximum allowed batch size 32", "error_type": "Validation"},
                 id="batch-size"),
])
def test_rerank_errors(reranker: httpx.Client, body: dict[str, object], status: int,
                       expected: dict[str, str]) -> None:
    response = reranker.post("/rerank", json=body)
    assert (response.status_code, response.json()) == (status, expected)


@pytest.mark.parametrize("path, body", [
    pytest.param("/embed", {"inputs": "a"}, id="embed"),
    pytest.param("/embed_all", {"inputs": "a"}, id="embed-all"),
    pytest.param("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}, id="similarity"),
])
def test_reranker_refuses_to_embed(reranker: httpx.Client, path: str, body: dict[str, object]) -> None:
    response = reranker.post(path, json=body)
    assert (response.status_code, response.json()) == (
        424, {"error": "Backend error: Model is not an embedding model", "error_type": "Backend"})


def test_reranker_refuses_openai_embeddings_in_openai_shape(reranker: httpx.Client) -> None:
    response = reranker.post("/v1/embeddings", json={"input": "a"})
    assert (response.status_code, response.json()) == (
        424, {"message": "Backend error: Model is not an embedding model", "code": 424, "type": "Backend"})


def test_embedding_model_refuses_rerank_and_predict(client: httpx.Client) -> None:
    rerank = client.post("/rerank", json={"query": "q", "texts": ["t"]})
    assert (rerank.status_code, rerank.json()) == (
        424, {"error": "Backend error: model is not a re-ranker model", "error_type": "Backend"})
    predict = client.post("/predict", json={"inputs": "t"})
    assert (predict.status_code, predict.json()) == (
        424, {"error": "Backend error: Model is not a classifier model", "error_type": "Backend"})


@pytest.mark.parametrize("inputs, batch", [
    pytest.param("a text", False, id="single"),
    pytest.param(["a question", "an answer"], False, id="pair-is-one-input"),
    pytest.param([["a"], ["a", "b"]], True, id="batch"),
])
def test_predict_shapes(reranker: httpx.Client, inputs: object, batch: bool) -> None:
    body = reranker.post("/predict", json={"inputs": inputs}).json()
    answers = body if batch else [body]
    for answer in answers:
        assert len(answer) == 1 and answer[0]["label"] == "LABEL_0" and 0 <= answer[0]["score"] <= 1


def test_reranker_info(reranker: httpx.Client) -> None:
    assert reranker.get("/info").json()["model_type"] == {
        "reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
