"""Counting tokens the way a server counts them, for the chunker.

A chunk must never be longer than the server's ``max_input_length``, and the server counts with its
own rule: the model's tokenizer (TEI, and the built-in server's ``numpy`` and ``sentence-transformers``
backends), or the approximation of :mod:`teibatch.server.tokens` (the built-in ``hashing`` backend).
A :class:`TokenCounter` gives the chunker two things, each for a whole batch of texts at once: where
each token lies in a text (character offsets into the Python ``str``, special tokens left out) and how
many tokens the server counts for a text (special tokens such as ``[CLS]``/``[SEP]`` included, since
they count against ``max_input_length``).

Each counter also says, in ``cuts``, where its counts add up when a text is cut (``tokens``,
``whitespace`` or ``none``: see :mod:`teibatch.token_cuts`), so the chunker knows when it can count
a piece by slicing and when it must count it again. The servers' own ``/tokenize`` route is a
counter too: :class:`teibatch.tei.tokenize.RouteTokenCounter`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from typing import Any, Protocol

from teibatch.corpus.word_counts import DEFAULT_CACHE_WORDS, WordCounter
from teibatch.server.tokens import ApproxTokenizer
from teibatch.token_cuts import CUTS_NONE, CUTS_TOKENS, CUTS_WHITESPACE

INSTALL_HINT = "pip install 'teibatch[chunking]'"

# Parts of a tokenizer.json that keep the count of a text cut at whitespace additive: the normalizer
# works character by character, the pre-tokenizer splits at whitespace, the model tokenizes each
# word alone and the post-processor adds a fixed number of special tokens.
_LOCAL_NORMALIZERS = {"BertNormalizer", "Lowercase", "StripAccents", "NFD", "NFKD"}
_LOCAL_PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits"}
_WHITESPACE_SPLITTERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
_WORD_MODELS = {"WordPiece", "WordLevel", "BPE", "Unigram"}
_FIXED_POST_PROCESSORS = {"BertProcessing", "RobertaProcessing", "TemplateProcessing"}
_ASCII_PUNCTUATION = frozenset(string.punctuation)


class TokenCounter(Protocol):
    """One server's token rule, over batches of texts.

    ``special_tokens`` is what the server adds to every input; ``cuts`` is ``tokens``, ``whitespace``
    or ``none`` (see :mod:`teibatch.token_cuts`). ``offsets`` gives, per text, the ``(start, end)`` character
    offsets of its tokens without special tokens, in order; ``counts`` gives, per text, its tokens as
    the server counts them, special tokens included.
    """

    cuts: str

    @property
    def special_tokens(self) -> int: ...  # read-only: the /tokenize counter asks its servers once

    def offsets(self, texts: Sequence[str]) -> Sequence[Sequence[tuple[int, int]]]: ...

    def counts(self, texts: Sequence[str]) -> list[int]: ...


class HFTokenCounter:
    """A Hugging Face ``tokenizers`` tokenizer: the count TEI and the built-in real-model backends use.

    Built from a ``tokenizers.Tokenizer``; the chunker's copy has truncation and padding turned off
    (a tokenizer.json often carries both, and the server counts the whole text). Batches are encoded
    with ``encode_batch``, which uses ``RAYON_NUM_THREADS`` threads (all cores by default).

    Where counts add up at whitespace (``cuts: whitespace``) and ``by_words`` is left on, texts are
    counted word by word with a cache of ``cache_words`` words' counts, and offsets come on demand
    (:mod:`teibatch.corpus.word_counts`): the same counts and offsets, without encoding a word twice.
    ``words`` is that :class:`~teibatch.corpus.word_counts.WordCounter`, ``None`` where texts are
    encoded whole.
    """

    def __init__(self, tokenizer: Any, *, by_words: bool = True, cache_words: int = DEFAULT_CACHE_WORDS) -> None:
        tokenizers = require_tokenizers()
        config = tokenizer.to_str()
        self._tok = tokenizers.Tokenizer.from_str(config)
        self._tok.no_truncation()
        self._tok.no_padding()
        self.special_tokens = len(self._tok.encode("", add_special_tokens=True).ids)
        parsed = json.loads(config)
        self.cuts = cut_rule(parsed)
        # An added token that strips the whitespace beside it takes that whitespace into its offsets,
        # which a word encoded alone does not have: such a tokenizer is encoded whole.
        self.words = WordCounter(self._tok, cache_words, punctuation_cuts(parsed)) \
            if by_words and self.cuts == CUTS_WHITESPACE \
            and not any(token.get("lstrip") or token.get("rstrip") for token in parsed.get("added_tokens") or ()) \
            else None
        # encode_batch_fast (tokenizers >= 0.21) skips the offsets, which counting does not need.
        self._count_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)

    def offsets(self, texts: Sequence[str]) -> Sequence[Sequence[tuple[int, int]]]:
        """Character offsets of each text's tokens (the Python bindings give ``str`` offsets)."""
        if self.words is not None:
            return self.words.offsets(texts)
        return [encoding.offsets for encoding in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's tokens with the model's special tokens."""
        if self.words is not None:
            return [self.special_tokens + count for count in self.words.counts(texts)]
        if len(texts) == 1:  # the chunker counts one piece at a time; skip the thread pool for it
            return [len(self._tok.encode(texts[0], add_special_tokens=True).ids)]
        return [len(encoding.ids) for encoding in self._count_batch(list(texts), add_special_tokens=True)]


class ApproxTokenCounter:
    """The built-in server's ``hashing`` backend rule (:mod:`teibatch.server.tokens`), which also
    answers its ``/tokenize``: what the quickstart's local servers count."""

    cuts = CUTS_TOKENS

    def __init__(self) -> None:
        self._rule = ApproxTokenizer()
        self.special_tokens = self._rule.special_tokens

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Character spans of each text's pieces."""
        return [self._rule.spans(text) for text in texts]

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's pieces plus ``[CLS]`` and ``[SEP]``, as the server counts them."""
        return self._rule.counts(texts)


class CharCounter:
    """Every character is a token and none is added: for ``strategy: chars``, which asked not to use a
    tokenizer. The servers' own count may be higher; they truncate or reject what is too long."""

    special_tokens = 0
    cuts = CUTS_NONE  # counting a piece again is only its length, so no promise is needed

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """One span per character."""
        return [[(i, i + 1) for i in range(len(text))] for text in texts]

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's length in characters."""
        return [len(text) for text in texts]


def cut_rule(config: dict[str, Any]) -> str:
    """``whitespace`` when every part of a tokenizer.json (parsed) keeps counts additive at whitespace,
    else ``none``; a tokenizer that is not known to be safe is always counted again."""
    if config.get("model", {}).get("type") not in _WORD_MODELS or config["model"].get("dropout"):
        return CUTS_NONE
    if not _all_of(config.get("normalizer"), _LOCAL_NORMALIZERS, allow_none=True):
        return CUTS_NONE
    pre_tokenizer = config.get("pre_tokenizer")
    if not _all_of(pre_tokenizer, _LOCAL_PRE_TOKENIZERS, allow_none=False) \
            or not _types(pre_tokenizer) & _WHITESPACE_SPLITTERS:
        return CUTS_NONE
    post_processor = config.get("post_processor")
    if post_processor is not None and post_processor.get("type") not in _FIXED_POST_PROCESSORS:
        return CUTS_NONE
    if any(any(ch.isspace() for ch in token.get("content", "")) for token in config.get("added_tokens") or ()):
        return CUTS_NONE
    return CUTS_WHITESPACE


def punctuation_cuts(config: dict[str, Any]) -> list[str] | None:
    """Where counts also add up at each ASCII punctuation character (BERT's pre-tokenizer makes
    each one a token of its own, and the normalizers ``cut_rule`` allows leave them as they are): the
    added tokens' texts, which a piece of text holding one must be counted whole; else ``None``.
    An added token matched after normalization that holds such a character says ``None`` too."""
    if (config.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        return None
    added = config.get("added_tokens") or ()
    if any(token.get("normalized", True) and any(ch in _ASCII_PUNCTUATION for ch in token.get("content", ""))
           for token in added):
        return None
    return [token["content"] for token in added if token.get("content")]


def _types(part: dict[str, Any] | None) -> set[str]:
    if part is None:
        return set()
    if part.get("type") == "Sequence":
        inner = part.get("normalizers") or part.get("pretokenizers") or []
        return set().union(*(_types(item) for item in inner)) if inner else {"Sequence"}
    return {str(part.get("type"))}


def _all_of(part: dict[str, Any] | None, allowed: set[str], *, allow_none: bool) -> bool:
    if part is None:
        return allow_none
    types = _types(part)
    return bool(types) and types <= allowed


def require_tokenizers() -> Any:
    """The ``tokenizers`` module; ImportError with the install hint when it is missing."""
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError(f"counting tokens with a model's tokenizer needs 'tokenizers': {INSTALL_HINT}") from exc
    return tokenizers
