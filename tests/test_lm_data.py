"""Text data: the nanoGPT split, memory-mapped windows, tokenizer caching, packing and masking, bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab.data.text import tokenizers as toks
from attnlab.data.text.lm_datasets import MaskingCollator, mask_tokens, pack_spans
from attnlab.data.text.corpus import TextDataModule
from attnlab.errors import UserError
from conftest import real_data


def _dm(tmp_path, **kw) -> TextDataModule:
    kw = dict(cache_dir=str(tmp_path / "cache"), batch_size=4, block_size=32) | kw
    dm = TextDataModule(**kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.fixture
def small_corpus(tmp_path, small_data):
    text = (small_data / "tinyshakespeare" / "input.txt").read_text()
    path = tmp_path / "small.txt"
    path.write_text(text)
    return path, text


def test_char_split_is_nanogpt_s_and_windows_are_corpus_slices(tmp_path, small_data):
    path = small_data / "tinyshakespeare" / "input.txt"
    text = path.read_text()
    n_train = int(0.9 * len(text))  # nanoGPT's shakespeare_char: the first 90% of the characters train
    dm = _dm(tmp_path, name="tinyshakespeare", files=[str(path)], block_size=64)
    assert dm.info().vocab_size == 65  # the small corpus has Tiny Shakespeare's characters
    assert len(dm.token_arrays["train"]) == n_train and len(dm.token_arrays["val"]) == len(text) - n_train
    assert dm.token_arrays["train"].array.dtype == np.uint16
    chars = sorted(set(text))
    decode = lambda ids: "".join(chars[i] for i in ids)  # noqa: E731
    batch_x, batch_y = next(iter(dm.train_dataloader()))            # (B, T) each
    assert batch_x.shape == (4, 64) and batch_x.dtype == torch.long
    for x, y in zip(batch_x, batch_y):
        s = decode(x.tolist())
        start = text.find(s)
        assert start >= 0 and start + 64 < n_train + 64                 # a contiguous slice of the train text
        assert decode(y.tolist()) == text[start + 1 : start + 65]      # the same window shifted by one
    val_x, _ = next(iter(dm.val_dataloader()))
    assert decode(val_x[0].tolist()) in text[n_train:]
    # the cache lives under cache_dir, never beside the data
    assert list((tmp_path / "cache" / "text").glob("tinyshakespeare-*/train.bin"))
    assert sorted(p.name for p in path.parent.iterdir()) == ["input.txt"]
    # training windows are random draws, repeatable for a (seed, epoch)
    first = [x for _, (x, _) in zip(range(2), dm.train_dataloader())]
    again = [x for _, (x, _) in zip(range(2), dm.train_dataloader())]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_tinyshakespeare_matches_nanogpt_split(tmp_path):
    dm = _dm(tmp_path, name="tinyshakespeare", files=[str(real_data("tinyshakespeare") / "input.txt")],
             block_size=64)
    assert dm.info().vocab_size == 65
    assert len(dm.token_arrays["train"]) == 1_003_854 and len(dm.token_arrays["val"]) == 111_540


def test_trained_tokenizer_is_cached_and_not_retrained(tmp_path, small_corpus, monkeypatch):
    path, _ = small_corpus
    kw = dict(files=[str(path)], tokenizer="bpe", tokenizer_vocab_size=400)
    dm = _dm(tmp_path, **kw)
    assert 300 < dm.info().vocab_size <= 400
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
    assert dm.info().vocab_size == len(set("".join(r["body"] + "\n" for r in records)))
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


def test_wikitext2_offline_copy_lacks_train_and_says_where_to_put_it(tmp_path, small_data):
    from conftest import compose_cfg

    from attnlab.cli.builders import build_datamodule

    # small_data's wikitext2/ holds valid.txt and test.txt only, like the offline copy
    cfg = compose_cfg(["data=wikitext2", "model=gpt_char"], tmp_path, data_dir=small_data)
    with pytest.raises(UserError) as err:
        build_datamodule(cfg.data)
    msg = str(err.value)
    assert str(small_data / "wikitext2" / "train.txt") in msg and "only valid.txt and test.txt" in msg


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
    collate = MaskingCollator(0, 4, [0, 2, 3], 100, 0.5, pad_to_multiple_of=1)
    out = collate([torch.tensor([2, 50, 60, 3]), torch.tensor([2, 70, 3])])
    assert out["input_ids"].shape == (2, 4) and out["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_masked_batches_come_in_few_shapes_and_name_their_masked_positions():
    """Lengths padded to a multiple of 8 (never past max_length) and the masked positions to a multiple of 64, so
    that a masked LM's step sees few shapes; the positions and their labels are exactly those of `labels`."""
    g = torch.Generator().manual_seed(0)
    collate = MaskingCollator(0, 4, [0, 2, 3], 100, 0.4, max_length=60)
    shapes = set()
    for _ in range(50):
        lengths = torch.randint(20, 58, (16,), generator=g).tolist()
        seqs = [torch.cat([torch.tensor([2]), torch.randint(5, 100, (n - 2,), generator=g), torch.tensor([3])])
                for n in lengths]
        b = collate(seqs)
        T = b["input_ids"].shape[1]
        assert T == min(-(-max(lengths) // 8) * 8, 60)                 # a multiple of 8, or max_length
        real = b["masked_labels"] != -100
        assert len(b["masked_positions"]) % 64 == 0 and not real[int(real.sum()):].any()  # padding at the end
        flat_labels = b["labels"].flatten()
        assert torch.equal(b["masked_positions"][real], (flat_labels != -100).nonzero().squeeze(1))
        assert torch.equal(b["masked_labels"][real], flat_labels[flat_labels != -100])
        shapes.add((T, len(b["masked_positions"])))
    assert len(shapes) <= 8                                         # unbounded: ~50 (T, N) pairs
    capped = MaskingCollator(0, 4, [0, 2, 3], 100, 0.4, max_length=10)([torch.arange(2, 11)])
    assert capped["input_ids"].shape == (1, 10)                     # 9 tokens -> 16 would exceed max_length 10


def test_lowercase_char_tokenizer_lowercases_what_it_encodes(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_text("The Quick Brown Fox\nJumps Over The Lazy Dog\n" * 40)
    dm = _dm(tmp_path, files=[str(path)], lowercase=True, block_size=16)
    tok = dm.tokenizer
    assert tok.lowercase and tok.chars == "".join(sorted(set("the quick brown fox\njumps over the lazy dog")))
    assert tok.decode(dm.token_arrays["train"].array[:20].tolist()) == "the quick brown fox\n"
    assert toks.tokenizer_from_json(tok.to_json()).encode("ROMEO") == tok.encode("romeo")  # prompts at predict time
    old = toks.tokenizer_from_json(json.dumps({"attnlab_char_tokenizer": {"chars": "ab", "specials": []}}))
    assert not old.lowercase and old.encode("ab") == [0, 1]                # saved before `lowercase` existed
    # a cache entry written before the fix (no `lowercase` in it) is rebuilt, not loaded as case-sensitive
    (cached,) = (tmp_path / "cache" / "tokenizers").glob("char-*.json")
    cached.write_text(json.dumps({"attnlab_char_tokenizer": {"chars": tok.chars, "specials": []}}))
    assert _dm(tmp_path, files=[str(path)], lowercase=True, block_size=16).tokenizer.lowercase


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_char_tokenizer_on_records_knows_the_newline_between_them(tmp_path, suffix):
    records = [{"text": f"record {i} has no newline"} for i in range(100)]
    path = tmp_path / f"r{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in records))
    else:
        import pandas as pd

        pd.DataFrame(records).to_parquet(path)
    dm = _dm(tmp_path, files=[str(path)], block_size=8)
    assert "\n" in dm.tokenizer.chars
    assert dm.tokenizer.decode(dm.token_arrays["train"].array[:48].tolist()) == \
        "record 0 has no newline\nrecord 1 has no newline\n"


def test_files_may_be_one_path_instead_of_a_list(tmp_path):
    train, val = tmp_path / "train.txt", tmp_path / "val.txt"
    train.write_text("hello world\n" * 100)
    val.write_text("world hello\n" * 20)
    dm = _dm(tmp_path, files=str(train), val_files=str(val), test_files=str(val), block_size=8)
    assert len(dm.token_arrays["train"]) == 1200 and len(dm.token_arrays["val"]) == len(dm.token_arrays["test"]) == 240


def test_random_starts_are_split_across_ddp_ranks_and_lightning_leaves_them_unwrapped():
    from types import SimpleNamespace

    from lightning.pytorch.trainer.connectors.data_connector import _DataConnector

    from attnlab.data.samplers import ResumableDataLoader
    from attnlab.data.text.lm_datasets import RandomStarts

    whole = RandomStarts(1000, 64, seed=3)
    ranks = [RandomStarts(1000, 64, seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    for s in (whole, *ranks):
        s.set_epoch(2)
    a, b = list(ranks[0]), list(ranks[1])
    assert len(a) == len(b) == len(ranks[0]) == 32
    assert [i for pair in zip(a, b) for i in pair] == list(whole)          # disjoint draws, covering the epoch
    odd = [RandomStarts(1000, 65, seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    assert len(list(odd[0])) == len(list(odd[1])) == len(odd[0]) == 33     # equal shares: no rank waits on another
    # Lightning's own check: a DistributedSampler is not wrapped, so a resumed rank skips inside its own sampler
    ddp = SimpleNamespace(trainer=SimpleNamespace(_accelerator_connector=SimpleNamespace(
        use_distributed_sampler=True, is_distributed=True)))
    loader = ResumableDataLoader(range(1000), batch_size=4, sampler=ranks[1], drop_last=True)
    assert not _DataConnector._requires_distributed_sampler(ddp, loader)
    loader.load_state_dict({"epoch": 2, "batches": 3})
    assert torch.cat(list(loader)).tolist() == b[12:]


@pytest.mark.parametrize("damage", ["cut short", "empty index"])
def test_a_damaged_token_cache_is_rebuilt_not_trained_on(tmp_path, caplog, damage):
    """A token file cut short (a full disk, a killed copy) or an empty document index: the next run tokenizes the
    split again instead of training on part of the corpus."""
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {i} of the corpus, to be or not to be\n" for i in range(300)))
    kw = dict(files=[str(path)], cache_dir=str(tmp_path / "cache"), block_size=8)
    dm = TextDataModule(**kw)
    dm.prepare_data()
    whole = dm.token_arrays["train"].array.tolist()
    (train_bin,) = (tmp_path / "cache").rglob("train.bin")
    if damage == "cut short":
        with open(train_bin, "r+b") as f:
            f.truncate(train_bin.stat().st_size // 3)
    else:
        train_bin.with_suffix(".docs.npy").write_bytes(b"")
    dm = TextDataModule(**kw)
    with caplog.at_level("WARNING", logger="attnlab"):
        dm.prepare_data()
    assert dm.token_arrays["train"].array.tolist() == whole
    assert "token cache" in caplog.text and "damaged" in caplog.text


def test_ctrl_c_while_tokenizing_leaves_no_temporary_files(tmp_path, monkeypatch):
    from attnlab.data.text import token_arrays

    chunks = token_arrays._chunks

    def interrupted(*args):  # Ctrl-C after the first chunk is written
        for i, chunk in enumerate(chunks(*args)):
            if i == 1:
                raise KeyboardInterrupt
            yield chunk

    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {i} of the corpus\n" for i in range(20000)))
    kw = dict(files=[str(path)], cache_dir=str(tmp_path / "cache"), block_size=8)
    monkeypatch.setattr(token_arrays, "_chunks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        TextDataModule(**kw).prepare_data()
    assert not list((tmp_path / "cache").rglob("*.tmp")) and not list((tmp_path / "cache").rglob("*.bin"))
    monkeypatch.setattr(token_arrays, "_chunks", chunks)
    dm = TextDataModule(**kw)
    dm.prepare_data()  # the next run builds the cache whole
    assert len(dm.token_arrays["train"]) > 0


def _prepare_and_report(kw, barrier, results) -> None:
    try:
        barrier.wait()
        dm = TextDataModule(**kw)
        dm.prepare_data()
        results.put({k: v.array.tolist() for k, v in dm.token_arrays.items()})
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put(f"{type(e).__name__}: {e}")


def test_processes_preparing_the_same_corpus_at_once_share_the_cache(tmp_path, monkeypatch):
    import multiprocessing
    import time

    from attnlab.data.text import token_arrays as text

    chunks = text._chunks

    def slow_chunks(*args):  # widens the window in which both processes write the token files
        for chunk in chunks(*args):
            time.sleep(0.3)
            yield chunk

    monkeypatch.setattr(text, "_chunks", slow_chunks)
    path = tmp_path / "c.txt"
    path.write_text("to be or not to be\n" * 200)
    kw = dict(files=[str(path)], cache_dir=str(tmp_path / "cache"), block_size=8)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_prepare_and_report, args=(kw, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    assert all(isinstance(g, dict) for g in got), got
    assert got[0] == got[1] and len(got[0]["train"]) == int(0.9 * 3800)
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_a_tokenizer_trained_on_a_fraction_split_never_sees_validation_text(tmp_path, monkeypatch):
    common = "the cat sat on the mat and the dog ran far away\n"
    text = common * 40 + "the cat sat on the mat " * 30 + "zyzzyva " * 30 + "\n"  # the last line crosses into val
    assert text.index("zyzzyva") > int(0.9 * len(text))
    path = tmp_path / "c.txt"
    path.write_text(text)
    seen: list[str] = []
    train = toks.train_hf_tokenizer

    def spy(kind, texts, *args, **kwargs):
        seen.extend(texts)
        return train(kind, iter(seen), *args, **kwargs)

    monkeypatch.setattr(toks, "train_hf_tokenizer", spy)
    dm = _dm(tmp_path, files=[str(path)], tokenizer="bpe", tokenizer_vocab_size=300, block_size=8)
    assert sum(len(t) for t in seen) == int(0.9 * len(text)) and "zyzzyva" not in "".join(seen)
    assert not any("zy" in t for t in dm.tokenizer.tok.get_vocab())
