from __future__ import annotations

import teibatch.corpus as corpus


def test_all_is_sorted_and_complete() -> None:
    # isort-style, as ruff's RUF022 wants: constants first, then classes and functions
    assert corpus.__all__ == sorted(corpus.__all__, key=lambda name: (not name.isupper(), name))
    assert all(hasattr(corpus, name) for name in corpus.__all__)
    for name in ("CorpusOptions", "Document", "Reject", "Shard", "plan_shards", "read_shard", "content_hash",
                 "keep_field_types", "REJECT_MALFORMED", "REJECT_DUPLICATE_ID"):
        assert name in corpus.__all__
