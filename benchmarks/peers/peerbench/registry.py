"""The contestants: one row each, grouped in families (one library, one probe per family).

``docs`` is the page whose pattern the contestant follows; ``features`` says what the library offers
for resuming and skipping, and how that was checked (the probe then tries it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Contestant:
    family: str
    variant: str
    module: str
    label: str
    tuned: bool = False
    probe: bool = False         # this variant runs the family's resume/skip probe
    per_document: bool = False  # one request per document: a longer time limit
    ray: bool = False           # starts a Ray cluster of its own: a longer time limit

    @property
    def key(self) -> str:
        return f"{self.family}:{self.variant}"


CONTESTANTS = (
    Contestant("httpx", "seq32", "httpx_loop", "httpx loop, sequential, 32 a request, 1 server", probe=True),
    Contestant("asyncio", "sem8", "asyncio_loop", "asyncio.gather, Semaphore(8), 32 a request", probe=True),
    Contestant("asyncio", "budget", "asyncio_loop", "asyncio.gather, 512 // 32 workers per server", tuned=True),
    Contestant("langchain", "hf-endpoint", "langchain_tei", "LangChain HuggingFaceEndpointEmbeddings(model=URL)"),
    Contestant("langchain", "openai", "langchain_tei", "LangChain OpenAIEmbeddings on /v1, chunk_size 1000"),
    Contestant("langchain", "openai-32", "langchain_tei", "LangChain OpenAIEmbeddings on /v1, chunk_size=32",
               tuned=True, probe=True),
    Contestant("llamaindex", "batch10", "llamaindex_tei", "LlamaIndex TextEmbeddingsInference, embed_batch_size=10",
               probe=True),
    Contestant("llamaindex", "batch32", "llamaindex_tei", "LlamaIndex TextEmbeddingsInference, embed_batch_size=32",
               tuned=True),
    Contestant("hf-hub", "per-doc", "hf_hub", "huggingface_hub InferenceClient.feature_extraction, 1 a call",
               probe=True, per_document=True),
    Contestant("hf-hub", "batch32", "hf_hub", "huggingface_hub InferenceClient.feature_extraction, 32 a call",
               tuned=True),
    Contestant("ray-data", "actors2", "ray_data", "Ray Data map_batches, ActorPoolStrategy(size=2), 32 a batch",
               ray=True),
    Contestant("ray-data", "actors8", "ray_data", "Ray Data map_batches, 2 actors per server on 1 CPU, 32 a batch",
               tuned=True, probe=True, ray=True),
    Contestant("ray-data-llm", "docs", "ray_data_llm", "Ray Data LLM HttpRequestProcessor, 1 URL, 1 doc a request",
               probe=True, per_document=True, ray=True),
    Contestant("ray-data-llm", "packed32", "ray_data_llm",
               "Ray Data LLM HttpRequestProcessor, 1 per server, 32 docs a request", tuned=True, ray=True),
    Contestant("teibatch", "default", "teibatch_job", "teibatch run_job, static servers.urls", probe=True, ray=True),
)

FEATURES = {
    "httpx": "none: a plain loop keeps every vector in memory until it writes them at the end",
    "asyncio": "none: a plain loop keeps every vector in memory until it writes them at the end",
    "langchain": "CacheBackedEmbeddings (langchain-classic) over a LocalFileStore: vectors kept by a hash of "
                 "the text (probe: batch_size=256, stored every 256 documents)",
    "llamaindex": "BaseEmbedding.embeddings_cache: a KV store keyed by the text (probe: SimpleKVStore, "
                  "persisted to a file after the batch)",
    "hf-hub": "none: InferenceClient sends requests; its API has no cache or checkpoint (checked: the "
              "InferenceClient reference and the installed huggingface_hub.inference source)",
    "ray-data": "Ray Data checkpointing (beta): DataContext.checkpoint_config = CheckpointConfig(id_column=...), "
                "rows already written are filtered out by id on the next run",
    "ray-data-llm": "Ray Data checkpointing (beta), as for Ray Data",
    "teibatch": "the same command resumes (committed shards are kept); mode: incremental skips documents "
                "whose (id, content hash) is unchanged",
}


def select(only: list[str] | None) -> list[Contestant]:
    """The contestants named by ``--only`` (a family, or ``family:variant``), all when none."""
    if not only:
        return list(CONTESTANTS)
    chosen = [c for c in CONTESTANTS if c.family in only or c.key in only]
    unknown = [name for name in only if not any(name in (c.family, c.key) for c in CONTESTANTS)]
    if unknown:
        names = sorted({c.family for c in CONTESTANTS} | {c.key for c in CONTESTANTS})
        raise SystemExit(f"unknown contestant {', '.join(unknown)}; choose from: {', '.join(names)}")
    return chosen
