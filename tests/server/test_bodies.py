"""axum's own rejections, byte for byte: 415, 413, 400 and 422 with text/plain bodies."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from teibatch.server.bodies import is_json_content_type
from teibatch.server.testing import running_server

TEXT = "text/plain; charset=utf-8"


@pytest.mark.parametrize("value, accepted", [
    pytest.param("application/json", True, id="json"),
    pytest.param("application/json; charset=utf-8", True, id="charset"),
    pytest.param("application/vnd.api+json", True, id="plus-json"),
    pytest.param("text/plain", False, id="text"),
    pytest.param(None, False, id="missing"),
])
def test_json_content_types(value: str | None, accepted: bool) -> None:
    assert is_json_content_type(value) is accepted


@pytest.mark.parametrize("content, headers, status, body", [
    pytest.param(b'{"inputs": "a"}', {}, 415, "Expected request with `Content-Type: application/json`",
                 id="no-content-type"),
    pytest.param(b'{"inputs": "a"}', {"content-type": "text/plain"}, 415,
                 "Expected request with `Content-Type: application/json`", id="wrong-content-type"),
    pytest.param(b"", {"content-type": "application/json"}, 400,
                 "Failed to parse the request body as JSON: EOF while parsing a value at line 1 column 0",
                 id="empty-body"),
    pytest.param(b'{"inputs": "a"} x', {"content-type": "application/json"}, 400,
                 "Failed to parse the request body as JSON: trailing characters at line 1 column 17",
                 id="trailing"),
    pytest.param(b"{}", {"content-type": "application/json"}, 422,
                 "Failed to deserialize the JSON body into the target type: missing field `inputs`",
                 id="missing-field"),
    pytest.param(b'{"inputs": 5}', {"content-type": "application/json"}, 422,
                 "Failed to deserialize the JSON body into the target type: inputs: data did not match any "
                 "variant of untagged enum Input", id="wrong-input-type"),
    pytest.param(b'{"inputs": [1, "a"]}', {"content-type": "application/json"}, 422,
                 "Failed to deserialize the JSON body into the target type: inputs: data did not match any "
                 "variant of untagged enum Input", id="int-and-string"),
    pytest.param(b'{"inputs": [-1]}', {"content-type": "application/json"}, 422,
                 "Failed to deserialize the JSON body into the target type: inputs: data did not match any "
                 "variant of untagged enum Input", id="negative-id"),
    pytest.param(b'{"inputs": "a", "normalize": null}', {"content-type": "application/json"}, 422,
                 "Failed to deserialize the JSON body into the target type: normalize: invalid type: null, "
                 "expected a boolean", id="normalize-null"),
    pytest.param(b'{"inputs": "a", "truncation_direction": "up"}', {"content-type": "application/json"}, 422,
                 "Failed to deserialize the JSON body into the target type: truncation_direction: unknown "
                 "variant `up`, expected one of `Left`, `left`, `Right`, `right`", id="direction"),
    pytest.param(b"[]", {"content-type": "application/json"}, 422,
                 "Failed to deserialize the JSON body into the target type: invalid type: sequence, expected "
                 "struct EmbedRequest", id="not-an-object"),
])
def test_rejections(client: httpx.Client, content: bytes, headers: dict[str, str], status: int,
                    body: str) -> None:
    response = client.post("/embed", content=content, headers=headers)
    assert (response.status_code, response.headers["content-type"], response.text) == (status, TEXT, body)


def test_unknown_fields_are_ignored(client: httpx.Client) -> None:
    assert client.post("/embed", json={"inputs": "a", "colour": "blue"}).status_code == 200


@pytest.fixture
def small_limit_url() -> Iterator[str]:
    with running_server(payload_limit=1000) as url:
        yield url


def _chunks(total: int) -> Iterator[bytes]:
    yield b'{"inputs": "'
    for _ in range(total // 100):
        yield b"a" * 100
    yield b'"}'


@pytest.mark.parametrize("content", [
    pytest.param(b'{"inputs": "' + b"a" * 1000 + b'"}', id="content-length"),
    pytest.param(None, id="chunked"),
])
def test_payload_limit(small_limit_url: str, content: bytes | None) -> None:
    with httpx.Client(base_url=small_limit_url) as c:
        response = c.post("/embed", content=content if content is not None else _chunks(5000),
                          headers={"content-type": "application/json"})
        assert (response.status_code, response.headers["content-type"], response.text) == (
            413, TEXT, "Failed to buffer the request body: length limit exceeded")
        assert c.get("/teibatch/stats").json()["violations"]["payload"] == 1


def test_body_at_the_limit_is_accepted(small_limit_url: str) -> None:
    body = b'{"inputs": "' + b"a" * (1000 - 14) + b'"}'
    assert len(body) == 1000
    response = httpx.post(f"{small_limit_url}/embed", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200


def test_content_type_is_checked_before_the_length(small_limit_url: str) -> None:
    response = httpx.post(f"{small_limit_url}/embed", content=b"x" * 5000, headers={"content-type": "text/plain"})
    assert response.status_code == 415
