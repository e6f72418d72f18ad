"""The content hash that decides whether a document's vector can be reused.

Incremental runs skip a document when the output already holds the same (id, content hash) pair.
The hash covers the text and every option that changes the vector (model id, revision, normalize,
truncate, prompt name, dimensions, ...), so changing any option re-embeds everything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

CONTENT_HASH_HEX = 32


def content_hash(text: str, vector_options: Mapping[str, Any]) -> str:
    """32 hex chars of blake2b over the options (as sorted-key JSON) and the text.

    Equal texts under equal options hash equal; any change to an option changes every hash.
    Options must be JSON-encodable (strings, numbers, booleans, None, lists, dicts).
    """
    options = orjson.dumps(dict(vector_options), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    digest = hashlib.blake2b(options, digest_size=CONTENT_HASH_HEX // 2)
    digest.update(b"\0")
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
