"""Turning request inputs into texts ready to embed, with TEI's per-input checks and truncation.

Mirrors ``core/src/tokenization.rs``: an empty input is refused (400 Empty); an input longer than
``max_input_length * 250`` characters is cut there when truncating, refused (422) otherwise; the
prompt is prepended; then the token count is checked against ``max_input_length`` and the text cut
(``right`` or ``left``) when truncating, refused (422) otherwise. ``truncate: null`` means the
server's ``--auto-truncate``. Token-id inputs count one token per id and embed as the text they decode to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from teibatch.server.bodies import Item
from teibatch.server.config import CHARS_PER_TOKEN_LIMIT, ServerConfig
from teibatch.server.responses import ApiError, empty, validation
from teibatch.server.tokens import Tokenizer


@dataclass(frozen=True)
class Prepared:
    """One input ready for the queue: the exact text to embed and what it counts as."""

    text: str
    tokens: int
    chars: int


def resolve_prompt(config: ServerConfig, prompt_name: str | None) -> str:
    """The text to prepend: the named prompt, else the server's default prompt, else nothing."""
    prompts = dict(config.prompts)
    if prompt_name is not None:
        if prompt_name not in prompts:
            raise validation(_prompt_missing(prompt_name, list(prompts)))
        return prompts[prompt_name]
    if config.default_prompt is not None:
        return config.default_prompt
    if config.default_prompt_name is not None:
        return prompts[config.default_prompt_name]
    return ""


def _prompt_missing(name: str, available: list[str]) -> str:
    if not available:
        return (f"`default-prompt-name` is set to `{name}` but no prompts were found "
                "in the Sentence Transformers configuration")
    listed = "[" + ", ".join(f'"{p}"' for p in available) + "]"
    return (f"`default-prompt-name` is set to `{name}` but it was not found in the Sentence Transformers "
            f"prompts. Available prompts: {listed}")


def too_long(max_length: int, given: int) -> ApiError:
    """422 for an input over ``max_input_length`` tokens with truncation off."""
    return validation(f"`inputs` must have less than {max_length} tokens. Given: {given}",
                      violation="input_length")


def too_many_chars(char_limit: int, given: int) -> ApiError:
    """422 for an input over ``max_input_length * 250`` characters (counted before the prompt) where
    nothing truncates: with truncation off, and always on ``/tokenize``."""
    return validation(f"`inputs` must have less than {char_limit} characters. Given: {given}",
                      violation="input_length")


def check_tokenize_input(text: str, config: ServerConfig) -> None:
    """``/tokenize``'s per-input check: TEI tokenizes with truncation off, so an input over the
    character limit is refused (422), never cut."""
    char_limit = config.effective_max_input_length * CHARS_PER_TOKEN_LIMIT
    if len(text) > char_limit:
        raise too_many_chars(char_limit, len(text))


def prepare(item: Item, *, tokenizer: Tokenizer, config: ServerConfig, truncate: bool | None,
            direction: str, prompt: str, counted: int | None = None) -> Prepared:
    """One input checked and cut as TEI would; raises :class:`ApiError` (400/422) when refused.

    ``counted``: the tokens of ``prompt + item``, when the caller counted them already."""
    do_truncate = config.auto_truncate if truncate is None else truncate
    max_length = config.effective_max_input_length
    if isinstance(item, tuple):
        return _prepare_ids(item, tokenizer=tokenizer, max_length=max_length, truncate=do_truncate,
                            direction=direction, prompt=prompt)
    if not item:
        raise empty("`inputs` cannot be empty")
    chars = len(item)
    char_limit = max_length * CHARS_PER_TOKEN_LIMIT
    text = item
    if chars > char_limit:
        if not do_truncate:
            raise too_many_chars(char_limit, chars)
        text = text[:char_limit] if direction == "right" else text[-char_limit:]
    text = prompt + text
    tokens = counted if counted is not None and chars <= char_limit else tokenizer.count(text)
    if tokens > max_length:
        if not do_truncate:
            raise too_long(max_length, tokens)
        text = tokenizer.truncate(text, max_length, direction)
        tokens = tokenizer.count(text)
    return Prepared(text=text, tokens=tokens, chars=chars)


def _prepare_ids(ids: tuple[int, ...], *, tokenizer: Tokenizer, max_length: int, truncate: bool,
                 direction: str, prompt: str) -> Prepared:
    if not ids:
        raise empty("`inputs` cannot be empty")
    prompt_tokens = max(0, tokenizer.count(prompt) - tokenizer.count("")) if prompt else 0
    tokens = len(ids) + prompt_tokens
    kept = list(ids)
    if tokens > max_length:
        if not truncate:
            raise too_long(max_length, tokens)
        room = max(0, max_length - prompt_tokens)
        kept = kept[:room] if direction == "right" else kept[len(kept) - room:]
        tokens = len(kept) + prompt_tokens
    text = tokenizer.decode(kept, skip_special_tokens=True)
    return Prepared(text=prompt + text, tokens=tokens, chars=len(ids))


def prepare_all(items: Sequence[Item], *, tokenizer: Tokenizer, config: ServerConfig,
                truncate: bool | None, direction: str, prompt_name: str | None,
                dimensions: int | None = None, dimension: int | None = None) -> list[Prepared]:
    """Every input of a request, in order; the first failing input's error fails the whole request.

    ``dimensions`` is checked per input after its own checks, like TEI (where it is checked after
    inference), so a request's error is the first input's, whichever check it failed.
    """
    prompt = resolve_prompt(config, prompt_name)
    counted = _count_together(items, tokenizer, prompt)
    prepared = []
    for index, item in enumerate(items):
        prepared.append(prepare(item, tokenizer=tokenizer, config=config, truncate=truncate,
                                direction=direction, prompt=prompt, counted=counted.get(index)))
        if dimensions is not None and dimension is not None:
            check_dimensions(dimensions, dimension)
    return prepared


def _count_together(items: Sequence[Item], tokenizer: Tokenizer, prompt: str) -> dict[int, int]:
    """The tokens of ``prompt + item`` for every text input, by position, counted together. Counting never
    fails, so each input's checks still come in order (:func:`prepare`)."""
    texts = {index: prompt + item for index, item in enumerate(items) if isinstance(item, str) and item}
    return dict(zip(texts, tokenizer.counts(list(texts.values())), strict=True))


def check_dimensions(dimensions: int, dimension: int) -> None:
    """422 for ``dimensions`` of 0 or above the model's dimension (Matryoshka truncation)."""
    if dimensions == 0:
        raise validation("`dimensions` should be positive")
    if dimensions > dimension:
        raise validation("`dimensions` should be smaller than the maximum embedding dimension.")
