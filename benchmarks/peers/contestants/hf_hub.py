"""``huggingface_hub.InferenceClient(model=<server URL>).feature_extraction`` in a loop.

``per-doc``: one text a call, as the docs' example (``client.feature_extraction("Hi, who are you?")``);
``batch32``: a list of 32 texts a call (``text`` accepts ``str | list[str]``).
"""

from __future__ import annotations

from contestants.common import Config, main, read_documents, write_vectors


def run(config: Config) -> None:
    from huggingface_hub import InferenceClient

    ids, texts = read_documents(config.corpus)
    client = InferenceClient(model=config.urls[0], token=config.api_key, timeout=60)
    vectors: list[object] = []
    if config.variant == "per-doc":
        for text in texts:
            vectors.append(client.feature_extraction(text)[0])  # type: ignore[arg-type]
    else:
        for start in range(0, len(texts), 32):
            vectors.extend(client.feature_extraction(texts[start:start + 32]))  # type: ignore[arg-type]
    write_vectors(config, ids, vectors)


if __name__ == "__main__":
    main(run)
