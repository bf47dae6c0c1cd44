"""Text data: the nanoGPT split, memory-mapped windows, tokenizer caching, packing and masking, bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab.data import tokenizers as toks
from attnlab.data.text import MaskingCollator, TextDataModule, mask_tokens, pack_spans
from attnlab.errors import UserError
from conftest import shared


def _dm(tmp_path, **kw) -> TextDataModule:
    kw = dict(cache_dir=str(tmp_path / "cache"), batch_size=4, block_size=32) | kw
    dm = TextDataModule(**kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.fixture
def small_corpus(tmp_path):
    text = (shared("tinyshakespeare") / "input.txt").read_text()[:60_000]
    path = tmp_path / "small.txt"
    path.write_text(text)
    return path, text


def test_tinyshakespeare_matches_nanogpt_split_and_windows_are_corpus_slices(tmp_path):
    path = shared("tinyshakespeare") / "input.txt"
    text = path.read_text()
    dm = _dm(tmp_path, name="tinyshakespeare", files=[str(path)], block_size=64)
    assert dm.meta["vocab_size"] == 65
    assert len(dm.token_arrays["train"]) == 1_003_854 and len(dm.token_arrays["val"]) == 111_540
    assert dm.token_arrays["train"].array.dtype == np.uint16
    chars = sorted(set(text))
    decode = lambda ids: "".join(chars[i] for i in ids)  # noqa: E731
    batch_x, batch_y = next(iter(dm.train_dataloader()))            # (B, T) each
    assert batch_x.shape == (4, 64) and batch_x.dtype == torch.long
    for x, y in zip(batch_x, batch_y):
        s = decode(x.tolist())
        start = text.find(s)
        assert start >= 0 and start + 64 < 1_003_854 + 64               # a contiguous slice of the train text
        assert decode(y.tolist()) == text[start + 1 : start + 65]      # the same window shifted by one
    val_x, _ = next(iter(dm.val_dataloader()))
    assert decode(val_x[0].tolist()) in text[1_003_854:]
    # the cache lives under cache_dir, never beside the data
    assert list((tmp_path / "cache" / "text").glob("tinyshakespeare-*/train.bin"))
    # training windows are random draws, repeatable for a (seed, epoch)
    first = [x for _, (x, _) in zip(range(2), dm.train_dataloader())]
    again = [x for _, (x, _) in zip(range(2), dm.train_dataloader())]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_trained_tokenizer_is_cached_and_not_retrained(tmp_path, small_corpus, monkeypatch):
    path, _ = small_corpus
    kw = dict(files=[str(path)], tokenizer="bpe", tokenizer_vocab_size=400)
    dm = _dm(tmp_path, **kw)
    assert 300 < dm.meta["vocab_size"] <= 400
    cached = list((tmp_path / "cache" / "tokenizers").glob("bpe-*.json"))
    assert len(cached) == 1

    def no_training(*a, **k):
        raise AssertionError("the tokenizer was trained again")

    monkeypatch.setattr(toks, "train_hf_tokenizer", no_training)
    again = _dm(tmp_path, **kw)
    assert again.tokenizer.to_json() == dm.tokenizer.to_json()
    # other settings are another cache entry: that one trains
    with pytest.raises(AssertionError, match="trained again"):
        _dm(tmp_path, **(kw | {"tokenizer_vocab_size": 500}))
    # the token ids round-trip to the text
    tok = again.tokenizer
    assert tok.decode(tok.encode("ROMEO: good morrow")) == "ROMEO: good morrow"


def test_jsonl_and_parquet_records_and_a_missing_text_column(tmp_path, small_corpus):
    _, text = small_corpus
    records = [{"body": p} for p in text.split("\n\n") if p.strip()]
    jl = tmp_path / "c.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in records))
    dm = _dm(tmp_path, files=[str(jl)], text_column="body", tokenizer="bpe", tokenizer_vocab_size=300)
    eot = dm.tokenizer.token_to_id(toks.EOT)
    train = dm.token_arrays["train"].array
    assert (train == eot).sum() > 0.8 * 0.9 * len(records)          # one separator per document
    import pandas as pd

    pq = tmp_path / "c.parquet"
    pd.DataFrame(records).to_parquet(pq)
    dm = _dm(tmp_path, files=[str(pq)], text_column="body")
    assert dm.meta["vocab_size"] == len(set("".join(r["body"] + "\n" for r in records)))
    for path in (jl, pq):
        with pytest.raises(UserError, match=r"no text column 'text' \(its columns: body\).*data.text_column=body"):
            _dm(tmp_path, files=[str(path)], text_column="text")


def test_missing_and_empty_corpus_files_are_user_errors(tmp_path):
    with pytest.raises(UserError, match=r"text file .*nope.txt does not exist.*data.files"):
        _dm(tmp_path, files=[str(tmp_path / "nope.txt")])
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(UserError, match=r"text file .*empty.txt is empty"):
        _dm(tmp_path, files=[str(empty)])
    blank = tmp_path / "blank.jsonl"
    blank.write_text(json.dumps({"text": ""}) + "\n")
    with pytest.raises(UserError, match="holds no text"):
        _dm(tmp_path, files=[str(blank)])
    with pytest.raises(UserError, match="has no text"):
        TextDataModule(files=[], cache_dir=str(tmp_path))


def test_wikitext2_offline_copy_lacks_train_and_says_where_to_put_it(tmp_path):
    from conftest import compose_cfg

    from attnlab.cli.builders import build_datamodule

    cfg = compose_cfg(["data=wikitext2", "model=gpt_char"], tmp_path)
    with pytest.raises(UserError) as err:
        build_datamodule(cfg.data)
    msg = str(err.value)
    assert str(shared("wikitext2") / "train.txt") in msg and "only valid.txt and test.txt" in msg


def test_unknown_characters_name_the_characters_and_the_fix():
    tok = toks.CharTokenizer("abc \n")
    assert tok.decode(tok.encode("cab a")) == "cab a"
    with pytest.raises(UserError, match=r"does not know: 'Zé'.*data.tokenizer=bpe"):
        tok.encode("aZé")


def test_masking_statistics_are_bert_s():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 1000, (64, 512), generator=g)
    candidates = torch.ones_like(ids, dtype=torch.bool)
    candidates[:, 0] = False                                        # e.g. [CLS]
    out, labels = mask_tokens(ids, candidates, mask_id=4, vocab_size=1000, prob=0.15, generator=g)
    chosen = labels != -100
    assert abs(chosen.float().mean().item() * 512 / 511 - 0.15) < 0.005
    assert not chosen[:, 0].any() and torch.equal(labels[chosen], ids[chosen])
    n = chosen.sum().item()
    as_mask = (out[chosen] == 4).sum().item() / n
    kept = (out[chosen] == ids[chosen]).sum().item() / n
    randomized = 1 - as_mask - kept
    assert abs(as_mask - 0.8) < 0.01 and abs(kept - 0.1) < 0.01 and abs(randomized - 0.1) < 0.01
    assert torch.equal(out[~chosen], ids[~chosen])                  # nothing else changes


def test_masked_lm_batches_pack_lines_and_mask_only_real_tokens(tmp_path, small_corpus):
    path, text = small_corpus
    dm = _dm(tmp_path, files=[str(path)], tokenizer="wordpiece", tokenizer_vocab_size=600, objective="masked",
             max_length=48, batch_size=8)
    tok = dm.tokenizer
    batch = next(iter(dm.train_dataloader()))
    ids, attn, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape[1] <= 48 and (ids[:, 0] == tok.token_to_id(toks.CLS)).all()
    assert (labels[attn == 0] == -100).all() and (labels[:, 0] == -100).all()
    # validation masks are repeatable; training masks change from batch to batch
    v1, v2 = next(iter(dm.val_dataloader())), next(iter(dm.val_dataloader()))
    assert torch.equal(v1["labels"], v2["labels"])
    # consecutive lines share a sequence; only a line longer than a sequence is cut
    spans = pack_spans(np.array([5, 9, 30, 31, 80]), 0, 90, 20)
    assert spans.tolist() == [[0, 9], [9, 29], [29, 31], [31, 51], [51, 71], [71, 90]]
    collate = MaskingCollator(0, 4, [0, 2, 3], 100, 0.5)
    out = collate([torch.tensor([2, 50, 60, 3]), torch.tensor([2, 70, 3])])
    assert out["input_ids"].shape == (2, 4) and out["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
