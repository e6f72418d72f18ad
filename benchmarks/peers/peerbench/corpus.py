"""The benchmark's corpus: deterministic JSONL documents of realistic lengths, with a few bad ones.

Lengths follow a log-normal distribution of tokens (median 110, mean about 160; about 3.5% of the
documents are longer than TEI's default ``max_input_length`` of 512 tokens and are truncated by the
servers), counted with the rule of the built-in server's tokenizer (runs of up to 4 ASCII word
characters, or one other character, plus 2 special tokens). Words come from a fixed pseudo-English
vocabulary, sentences end with a period, and each record carries ``id``, ``title``, ``text``, ``url``
like a typical export. The same arguments always give the same bytes.

Bad documents replace the records at fixed fractions of the corpus (the first at 2%): an empty text,
a record without a ``text`` field, a number and a ``null`` as the text. A corpus "with the bad
documents removed" is the same corpus without those records.
"""

from __future__ import annotations

import json
import math
import random
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FILES = 8
MEDIAN_TOKENS = 110
SIGMA = 0.85
MAX_TOKENS = 6_000
BAD_FRACTIONS = (0.02, 0.21, 0.40, 0.59, 0.78, 0.97)
REVISION = "Revised paragraph added later."
BAD_KINDS = ("empty", "missing", "number", "null", "empty", "missing")
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "an", "el", "or", "un", "ber", "con", "dis", "ent",
              "for", "gra", "hel", "ion", "ment", "pro", "que", "str", "ter", "tion", "ver", "wal", "xen", "zor")


@dataclass(frozen=True)
class CorpusInfo:
    """What the harness needs to know about a written corpus."""

    path: Path
    documents: int
    bad_ids: dict[str, str]          # id -> kind of bad document
    tokens: int                      # tokens the servers embed (each document truncated to 512)


def _vocabulary(rng: random.Random, size: int = 4_000) -> list[str]:
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 3, 4)))))
    return sorted(words)


def word_tokens(word: str) -> int:
    """Tokens of one ASCII word under the built-in server's rule: one per 4 characters."""
    return math.ceil(len(word) / 4)


def _text(rng: random.Random, vocabulary: list[str], target: int) -> tuple[str, int]:
    """A text of about ``target`` tokens (special tokens included) and its exact token count."""
    sentences: list[str] = []
    tokens = 2
    while tokens < target:
        words = [rng.choice(vocabulary) for _ in range(rng.randint(6, 18))]
        words[0] = words[0].capitalize()
        sentences.append(" ".join(words) + ".")
        tokens += sum(word_tokens(w) for w in words) + 1
    return " ".join(sentences), tokens


def bad_positions(documents: int) -> dict[int, str]:
    """Index -> kind of each bad document in a corpus of ``documents`` (none below 50 documents)."""
    if documents < 50:
        return {}
    return {int(documents * f): kind for f, kind in zip(BAD_FRACTIONS, BAD_KINDS, strict=True)}


def write_corpus(root: Path, documents: int, *, seed: int = 13, files: int = DEFAULT_FILES, bad: bool = True,
                 changed: frozenset[int] = frozenset(), median_tokens: int = MEDIAN_TOKENS) -> CorpusInfo:
    """Write ``documents`` records into ``files`` JSONL files under ``root`` (created).

    ``bad=False`` leaves the bad documents out (the records at their positions are skipped, so ids
    stay the same as in the full corpus); ``changed`` lists indexes whose text gets one more
    sentence (for the "skips unchanged documents" check). ``median_tokens`` sets the length
    distribution's median (the scaling table uses short documents to reach a million in minutes).
    """
    rng = random.Random(seed)
    vocabulary = _vocabulary(rng)
    root.mkdir(parents=True, exist_ok=False)
    bads = bad_positions(documents)
    bad_ids: dict[str, str] = {}
    total_tokens = 0
    per_file = math.ceil(documents / files)
    with ExitStack() as stack:
        handles = [stack.enter_context(open(root / f"part-{f:02d}.jsonl", "w", encoding="utf-8"))
                   for f in range(files)]
        for n in range(documents):
            target = min(MAX_TOKENS, max(8, round(rng.lognormvariate(math.log(median_tokens), SIGMA))))
            text, tokens = _text(rng, vocabulary, target)
            doc_id = f"doc-{n:07d}"
            if n in changed:
                text += " " + REVISION
                tokens += sum(word_tokens(w) for w in REVISION[:-1].split()) + 1
            record: dict[str, object] = {"id": doc_id, "title": " ".join(text.split()[:4]),
                                         "text": text, "url": f"https://example.com/docs/{n}"}
            kind = bads.get(n)
            if kind is not None:
                if not bad:
                    continue
                bad_ids[doc_id] = kind
                if kind == "empty":
                    record["text"] = ""
                elif kind == "missing":
                    del record["text"]
                elif kind == "number":
                    record["text"] = 12345
                else:
                    record["text"] = None
            else:
                total_tokens += min(tokens, 512)
            handles[n // per_file].write(json.dumps(record) + "\n")
    kept = documents - (0 if bad else len(bads))
    return CorpusInfo(root, kept, bad_ids, total_tokens)


def read_documents(root: Path) -> tuple[list[str], list[object]]:
    """Ids and texts of every record, files in name order: what a contestant script reads first.

    The text is ``record.get("text")``: a missing field reaches the library as ``None``, a number
    as a number, as they would from most loaders.
    """
    ids: list[str] = []
    texts: list[object] = []
    for path in sorted(root.glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                ids.append(record["id"])
                texts.append(record.get("text"))
    return ids, texts
