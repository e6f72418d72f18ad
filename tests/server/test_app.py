"""Routing and auth: the API key guards all but /health and /metrics, before the body is read."""

from __future__ import annotations

import httpx
import pytest

from teibatch.server.testing import running_server

KEY = "s3cret"


@pytest.mark.parametrize("method, path, body", [
    pytest.param("GET", "/info", None, id="info"),
    pytest.param("POST", "/embed", {"inputs": "a"}, id="embed"),
    pytest.param("POST", "/v1/embeddings", {"input": "a"}, id="openai"),
    pytest.param("POST", "/tokenize", {"inputs": "a"}, id="tokenize"),
    pytest.param("POST", "/rerank", {"query": "a", "texts": ["b"]}, id="rerank"),
    pytest.param("POST", "/", {"inputs": "a"}, id="invocations-root"),
])
@pytest.mark.parametrize("authorization", [
    pytest.param(None, id="missing"),
    pytest.param("Bearer wrong", id="wrong"),
    pytest.param(f"bearer {KEY}", id="lowercase-scheme"),
    pytest.param(KEY, id="no-scheme"),
])
def test_protected_routes_answer_401_with_empty_body(method: str, path: str, body: object,
                                                     authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    with running_server(api_key=KEY) as url:
        response = httpx.request(method, url + path, json=body, headers=headers)
    assert (response.status_code, response.content) == (401, b"")
    assert "www-authenticate" not in response.headers


def test_right_key_and_public_routes() -> None:
    with running_server(api_key=KEY) as url, httpx.Client(base_url=url) as c:
        assert c.post("/embed", json={"inputs": "a"}, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        for path in ("/health", "/", "/ping", "/metrics", "/teibatch/stats"):
            assert c.get(path).status_code == 200, path


def test_auth_runs_before_the_body_limit() -> None:
    with running_server(api_key=KEY, payload_limit=100) as url:
        response = httpx.post(f"{url}/embed", content=b"x" * 10_000, headers={"content-type": "application/json"})
        assert (response.status_code, response.content) == (401, b"")
        assert httpx.get(f"{url}/teibatch/stats").json()["violations"]["payload"] == 0


@pytest.mark.parametrize("method, path, status, allow", [
    pytest.param("GET", "/nope", 404, None, id="unknown-path"),
    pytest.param("GET", "/embed", 405, "POST", id="wrong-method"),
    pytest.param("POST", "/info", 405, "GET,HEAD", id="post-to-get-route"),
])
def test_unknown_path_and_wrong_method_have_empty_bodies(client: httpx.Client, method: str, path: str,
                                                         status: int, allow: str | None) -> None:
    response = client.request(method, path)
    assert (response.status_code, response.content) == (status, b"")
    assert response.headers.get("allow") == allow


def test_health_is_200_with_empty_body(client: httpx.Client) -> None:
    response = client.get("/health")
    assert (response.status_code, response.content) == (200, b"")


@pytest.mark.parametrize("options, path, body", [
    pytest.param({}, "/embed", {"inputs": "a"}, id="embedding"),
    pytest.param({"model_kind": "reranker"}, "/rerank", {"query": "a", "texts": ["a"]}, id="reranker"),
    pytest.param({"pooling": "splade"}, "/embed_sparse", {"inputs": "a"}, id="splade"),
])
def test_invocations_alias_follows_the_model_kind(options: dict[str, object], path: str,
                                                  body: dict[str, object]) -> None:
    with running_server(**options) as url:
        direct = httpx.post(url + path, json=body).json()
        assert httpx.post(f"{url}/invocations", json=body).json() == direct
        assert httpx.post(f"{url}/", json=body).json() == direct
