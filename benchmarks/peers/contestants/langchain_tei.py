"""LangChain: ``HuggingFaceEndpointEmbeddings`` pointed at a TEI URL, and ``OpenAIEmbeddings`` on TEI.

* ``hf-endpoint``: ``HuggingFaceEndpointEmbeddings(model="http://...")``, as LangChain's TEI page
  said until langchain-huggingface started refusing URLs; ``embed_documents`` on the whole corpus.
* ``openai`` / ``openai-32``: the page's current advice, ``OpenAIEmbeddings(model=..., base_url=
  "<server>/v1", api_key=..., check_embedding_ctx_length=False)`` and ``embed_documents`` on the
  whole corpus; its batch knob ``chunk_size`` left at its default (1000) or set to TEI's 32.

With ``features`` on (the probe), the embedder is wrapped in ``CacheBackedEmbeddings.from_bytes_store``
over a ``LocalFileStore``, LangChain's documented embedding cache, storing every 256 documents.
"""

from __future__ import annotations

from contestants.common import Config, main, read_documents, write_vectors

CACHE_BATCH = 256


def run(config: Config) -> None:
    ids, texts = read_documents(config.corpus)
    url = config.urls[0]
    if config.variant == "hf-endpoint":
        from langchain_huggingface import HuggingFaceEndpointEmbeddings

        embeddings = HuggingFaceEndpointEmbeddings(model=url, task="feature-extraction",
                                                   huggingfacehub_api_token=config.api_key)
    else:
        from langchain_openai import OpenAIEmbeddings

        options = {"chunk_size": 32} if config.variant == "openai-32" else {}
        embeddings = OpenAIEmbeddings(model=config.model, base_url=f"{url}/v1", api_key=config.api_key,
                                      check_embedding_ctx_length=False, **options)
    if config.features:
        from langchain_classic.embeddings import CacheBackedEmbeddings
        from langchain_classic.storage import LocalFileStore

        embeddings = CacheBackedEmbeddings.from_bytes_store(
            embeddings, LocalFileStore(str(config.state / "cache")), namespace=config.model,
            batch_size=CACHE_BATCH, key_encoder="blake2b")
    vectors = embeddings.embed_documents(texts)
    write_vectors(config, ids, vectors)


if __name__ == "__main__":
    main(run)
