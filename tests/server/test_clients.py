"""Client libraries no one here wrote talk to the server unchanged: openai and huggingface_hub."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import numpy as np
import pytest

from teibatch.server.backends.hashing import HashingEmbedder
from teibatch.server.testing import running_server, server_stats

TEXTS = ["A man is eating food.", "The stock market fell today."]
KEY = "sk-test"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server(api_key=KEY) as base:
        yield base


@pytest.mark.parametrize("encoding_format", [
    pytest.param(None, id="sdk-default-base64"),
    pytest.param("float", id="float"),
    pytest.param("base64", id="base64"),
])
def test_openai_sdk(url: str, encoding_format: str | None) -> None:
    openai = pytest.importorskip("openai", reason="the openai SDK is not installed (test extra)")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    kwargs = {"encoding_format": encoding_format} if encoding_format else {}
    result = client.embeddings.create(model="teibatch/hashing-384", input=TEXTS, **kwargs)
    if encoding_format == "base64":  # asked for explicitly, the SDK hands the strings over as they came
        vectors = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in result.data])
    else:  # the SDK's default asks for base64 and decodes it itself
        vectors = np.array([d.embedding for d in result.data], dtype=np.float32)
    np.testing.assert_array_equal(vectors, HashingEmbedder(384).embed(TEXTS))
    assert result.usage.prompt_tokens == result.usage.total_tokens == 20
    assert result.model == "teibatch/hashing-384"


def test_openai_sdk_sees_typed_errors(url: str) -> None:
    openai = pytest.importorskip("openai", reason="the openai SDK is not installed (test extra)")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.embeddings.create(model="m", input="a")
    good = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        good.embeddings.create(model="m", input=["a"] * 33)
    assert caught.value.body["message"] == "batch size 33 > maximum allowed batch size 32"  # type: ignore[index]


def test_huggingface_hub_feature_extraction(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (test extra)")
    # HF_HUB_OFFLINE=1 (set where real models load offline) blocks every URL, loopback included.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    before = server_stats(url)["requests"]["by_route"]
    client = hub.InferenceClient(model=url, token=KEY)
    one = client.feature_extraction(TEXTS[0])
    np.testing.assert_allclose(np.asarray(one).reshape(-1), HashingEmbedder(384).embed(TEXTS[:1])[0], rtol=1e-6)
    cut = client.feature_extraction(TEXTS[1], truncate=True, normalize=True)
    assert np.asarray(cut).reshape(-1).shape == (384,)
    after = server_stats(url)["requests"]["by_route"]
    assert sum(after.values()) - sum(before.values()) == 3  # two embeddings + the stats call itself
