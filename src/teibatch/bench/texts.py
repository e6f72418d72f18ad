"""The texts a bench sends: synthetic English-like texts, or a sample spread over the job's corpus;
and their tokens, counted by the server when it can."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

import anyio
import httpx
import orjson

from teibatch.bench.grid import spread
from teibatch.corpus import CorpusOptions, Document, plan_shards, read_shard
from teibatch.endpoint import Endpoint
from teibatch.errors import CorpusMismatch
from teibatch.pipeline.plan import BUILTIN_TOKENS, builtin_tokens
from teibatch.tei import ServerInfo

TOKENIZE_TIMEOUT_S = 10.0
SAMPLE_SHARDS = 8
SYNTHETIC_TEXTS = 1_024
SEED = 0
TOKENS_FROM_SERVER = "the server's /tokenize"

_VOCABULARY = (  # common English words: about one token each, as in real text
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have "
    "an had they you were their one all we can her has there been if more when will would who so no time "
    "data model system value number first new used each other two may work also after use many these most "
    "only over such where well between both under through during make even before same another research "
    "server request batch vector search query document result training language network memory process "
    "report city water history market energy public policy study group design figure table section"
)


def synthetic_texts(mean_words: float, count: int = SYNTHETIC_TEXTS, seed: int = SEED) -> list[str]:
    """``count`` English-like texts of common words, the same for the same arguments.

    Lengths in words are log-normal with mean ``mean_words`` (σ 0.6: from a few words to a few
    times the mean, as passages and abstracts are), cut at 8 × the mean; sentences of 6-18 words.
    """
    rng = random.Random(seed)
    vocabulary = _VOCABULARY.split()
    sigma = 0.6
    mu = math.log(mean_words) - sigma * sigma / 2  # the log-normal's mean is exp(mu + sigma²/2)
    texts = []
    for _ in range(count):
        words = rng.choices(vocabulary, k=max(3, min(round(rng.lognormvariate(mu, sigma)), round(8 * mean_words))))
        sentences = []
        while words:
            cut = rng.randint(6, 18)
            sentences.append(" ".join(words[:cut]).capitalize() + ".")
            words = words[cut:]
        texts.append(" ".join(sentences))
    return texts


def bench_texts(corpus: CorpusOptions | None, sample: int, mean_words: float) -> tuple[list[str], str]:
    """The texts to send, and where they came from in words: ``sample`` texts of ``corpus`` when one
    is given (:func:`corpus_sample`), else synthetic texts of ``mean_words`` (:func:`synthetic_texts`)."""
    if corpus is not None:
        texts = corpus_sample(corpus, sample)
        return texts, f"{len(texts)} texts sampled from the corpus {corpus.path}"
    texts = synthetic_texts(mean_words)
    return texts, f"{len(texts)} synthetic texts of {mean_words:g} words on average"


def corpus_sample(options: CorpusOptions, count: int) -> list[str]:
    """Up to ``count`` texts of the corpus: the first documents of up to 8 shards spread over all of
    it, so that a corpus sorted by length or topic is not sampled from its start alone."""
    shards = spread(plan_shards(options), SAMPLE_SHARDS)
    texts: list[str] = []
    for i, shard in enumerate(shards):  # none for an empty corpus
        share = count // len(shards) + (i < count % len(shards))
        documents = (item.text for item in read_shard(options, shard, verify=False) if isinstance(item, Document))
        texts += itertools.islice(documents, share)
    if not texts:
        raise CorpusMismatch("holds no document with a text to sample", file=options.path)
    return texts


async def count_tokens(http: httpx.AsyncClient, endpoint: Endpoint, texts: Sequence[str], info: ServerInfo,
                       timeout: float = TOKENIZE_TIMEOUT_S) -> tuple[list[int], str]:
    """Tokens of each text as the server embeds it (at most ``max_input_length``: requests truncate),
    and how they were counted: by the server's ``/tokenize`` when it answers within ``timeout``, else
    the built-in estimate (any failure of that optional route only changes the source)."""
    cap = info.max_input_length
    headers = {"content-type": "application/json"}
    if endpoint.api_key:
        headers["authorization"] = f"Bearer {endpoint.api_key}"
    counts: list[int] = []
    try:
        with anyio.fail_after(timeout):
            for start in range(0, len(texts), info.max_client_batch_size):
                chunk = list(texts[start:start + info.max_client_batch_size])
                response = await http.post(f"{endpoint.url}/tokenize", content=orjson.dumps({"inputs": chunk}),
                                           headers=headers)
                tokens = orjson.loads(response.content) if response.status_code == 200 else None
                if not isinstance(tokens, list) or len(tokens) != len(chunk):
                    raise ValueError(f"/tokenize answered {response.status_code}")
                counts += [min(len(t), cap) for t in tokens]
    except (TimeoutError, httpx.HTTPError, ValueError, TypeError):
        return [min(builtin_tokens(t), cap) for t in texts], BUILTIN_TOKENS
    return counts, TOKENS_FROM_SERVER
