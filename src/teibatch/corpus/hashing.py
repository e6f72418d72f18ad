"""The content hash that decides whether a document's vector can be reused.

Incremental runs skip a document when the output already holds the same (id, content hash) pair.
The hash covers the text and every option that changes the vector (model id, revision, normalize,
truncate, prompt name, dimensions, ...), so changing any option re-embeds everything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import orjson

CONTENT_HASH_HEX = 32


def content_hasher(vector_options: Mapping[str, Any]) -> Callable[[str], str]:
    """:func:`content_hash` with ``vector_options`` fixed: the options are digested once, and each
    text's hash continues from a copy of that digest (a shard hashes every one of its texts)."""
    options = orjson.dumps(dict(vector_options), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    start = hashlib.blake2b(options, digest_size=CONTENT_HASH_HEX // 2)
    start.update(b"\0")

    def hash_text(text: str) -> str:
        digest = start.copy()
        digest.update(text.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    return hash_text


def content_hash(text: str, vector_options: Mapping[str, Any]) -> str:
    """32 hex chars of blake2b over the options (as sorted-key JSON) and the text.

    Equal texts under equal options hash equal; any change to an option changes every hash.
    Options must be JSON-encodable (strings, numbers, booleans, None, lists, dicts).
    """
    return content_hasher(vector_options)(text)
