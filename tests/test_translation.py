"""Seq2seq translation: masks, incremental decoding, beam search, BLEU, a short real run on Multi30k, predict.py,
and the errors a user can make. Everything but the learning run reads the small Multi30k-like captions of
tests/fixtures.py."""

from __future__ import annotations

import json
import logging

import pytest
import sacrebleu
import torch

from attnlab.cli.training import train
from attnlab.data.translation.parallel_sets import BucketBatchSampler
from attnlab.data.translation.parallel_text import read_pair
from attnlab.errors import UserError
from attnlab.nn.decoding import beam_search, greedy
from attnlab.nn.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig
from attnlab.nn.transformer_seq2seq import TransformerSeq2Seq, TransformerSeq2SeqConfig
from attnlab.tasks.translation import Translator, corpus_bleu
from conftest import FAST, compose_cfg, real_data, run_cli, run_here, wandb_offline

PAD, BOS, EOS = 0, 2, 3
V = 40


def transformer(**kw) -> TransformerSeq2Seq:
    torch.manual_seed(0)
    cfg = TransformerSeq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, n_layer=2, n_head=4, n_embd=32,
                                   ffn_hidden=64, dropout=0.0, max_len=64, **kw)
    return TransformerSeq2Seq(cfg).eval()


def rnn(**kw) -> RNNSeq2Seq:
    torch.manual_seed(0)
    return RNNSeq2Seq(RNNSeq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, emb_dim=16, hidden=32, dropout=0.0,
                                       **kw)).eval()


def source(lengths=(7, 4, 9)) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    rows = [torch.cat([torch.randint(4, V, (n - 1,), generator=g), torch.tensor([EOS])]) for n in lengths]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD)


MODELS = {
    "transformer": transformer,
    "transformer-pre-rope": lambda: transformer(norm_position="pre", positional="rope"),
    "gru-bahdanau": lambda: rnn(cell="gru", attention="bahdanau"),
    "lstm-luong": lambda: rnn(cell="lstm", attention="luong", n_layer=2),
    "rnn-none": lambda: rnn(cell="rnn", attention="none", bidirectional=False),
}


# ---- masks

@pytest.mark.parametrize("name", ["transformer", "gru-bahdanau"])
def test_padding_changes_nothing(name):
    model, src = MODELS[name](), source()
    padded = torch.cat([src, torch.full((src.shape[0], 5), PAD)], dim=1)
    tgt = torch.randint(4, V, (src.shape[0], 6))
    assert torch.allclose(model(src, tgt), model(padded, tgt), atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_decoder_cannot_see_future_target_tokens(name):
    model, src = MODELS[name](), source()
    tgt = torch.randint(4, V, (src.shape[0], 8))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, V, (src.shape[0], 3))
    a, b = model(src, tgt), model(src, changed)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-5)   # positions before the change see the same prefix
    assert not torch.allclose(a[:, 6:], b[:, 6:], atol=1e-3)


# ---- incremental decoding

@pytest.mark.parametrize("name", list(MODELS))
def test_cached_step_decoding_equals_full_recomputation(name):
    model, src = MODELS[name](), source()
    tgt = torch.cat([torch.full((src.shape[0], 1), BOS), torch.randint(4, V, (src.shape[0], 7))], dim=1)
    full = model(src, tgt)                                            # (B, T, V), all positions at once
    state = model.start(src)
    steps = [model.step(tgt[:, t : t + 1], state)[0] for t in range(tgt.shape[1])]
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_beam_search_with_one_beam_is_greedy(name):
    model, src = MODELS[name](), source((7, 4, 9, 3, 12))
    assert beam_search(model, src, BOS, EOS, 15, beam_size=1) == greedy(model, src, BOS, EOS, 15)[0]


class _PrefersSpecials:
    """A model whose every step scores padding and BOS highest."""

    def __init__(self, model):
        self.model = model

    def start(self, src):
        return self.model.start(src)

    def step(self, tokens, state, return_attn=False):
        logits, attn = self.model.step(tokens, state, return_attn)
        return logits.index_add(1, torch.tensor([PAD, BOS]), torch.full((logits.shape[0], 2), 100.0)), attn

    def reorder(self, *args, **kwargs):
        return self.model.reorder(*args, **kwargs)


def test_decoding_never_emits_padding_or_bos():
    from attnlab.nn.decoding import decode

    model = _PrefersSpecials(transformer())
    for beam in (1, 3):
        assert all(set(out) <= {PAD, BOS} for out in decode(model, source(), BOS, EOS, 6, beam_size=beam))
        for out in decode(model, source(), BOS, EOS, 6, beam_size=beam, banned=(PAD, BOS)):
            assert PAD not in out and BOS not in out


def test_beam_search_finds_a_more_probable_translation_than_greedy():
    model, src = transformer(), source((7, 4, 9, 3, 12, 6))

    def logprob(src_row, hyp):
        tgt = torch.tensor([[BOS, *hyp, EOS]])
        logp = model(src_row[None], tgt[:, :-1]).log_softmax(-1)
        return logp[0].gather(1, tgt[0, 1:, None]).sum().item()

    g = greedy(model, src, BOS, EOS, 12)[0]
    b = beam_search(model, src, BOS, EOS, 12, beam_size=6, length_penalty=0.0)  # plain log-probability
    scores = [(logprob(src[i], b[i]), logprob(src[i], g[i])) for i in range(len(g))]
    assert all(sb >= sg - 1e-4 for sb, sg in scores), scores
    assert any(sb > sg + 1e-4 for sb, sg in scores), "beam search never improved on greedy"


def test_alignment_weights_are_distributions_over_the_real_source_tokens():
    for name in ("transformer", "gru-bahdanau", "lstm-luong"):
        model, src = MODELS[name](), source()
        _, maps = greedy(model, src, BOS, EOS, 6, return_attn=True)
        for row, attn in zip(src, maps):
            n = int((row != PAD).sum())
            assert torch.allclose(attn.sum(-1), torch.ones(attn.shape[0]), atol=1e-4)
            assert attn[:, n:].abs().sum() < 1e-6  # padding gets no attention


# ---- batching

def test_buckets_hold_similar_lengths_and_cover_every_sentence_once():
    lengths = torch.randint(3, 60, (2000,)).numpy()
    sampler = BucketBatchSampler(lengths, batch_size=32, seed=0)
    batches = list(sampler)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(2000))
    spread = sum(int(lengths[b].max() - lengths[b].min()) for b in batches) / len(batches)
    assert spread < 3, f"a batch mixes lengths {spread:.1f} tokens apart on average"
    sampler.set_epoch(1)
    assert list(sampler) != batches  # reshuffled each epoch
    budget = BucketBatchSampler(lengths, batch_size=32, max_tokens=600, seed=0)  # the budget replaces batch_size
    assert all(len(b) * lengths[b].max() <= 600 for b in budget) and max(len(b) for b in budget) > 32
    ranks = [list(BucketBatchSampler(lengths, 32, seed=0, num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) and not {i for b in ranks[0] for i in b} & {i for b in ranks[1] for i in b}


# ---- BLEU

def test_bleu_is_sacrebleu_on_detokenized_text():
    hyps = ["a man is riding a bike .", "two dogs play in the snow", "a woman sings"]
    refs = ["a man rides a bicycle .", "two dogs are playing in the snow", "a woman is singing on stage"]
    score, signature = corpus_bleu(hyps, refs)
    assert score.score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert "tok:13a" in signature and "nrefs:1" in signature
    assert corpus_bleu(refs, refs)[0].score == pytest.approx(100.0)


# ---- a short real run on Multi30k

SHORT = ["experiment=mt_transformer", "model.n_layer=2", "model.n_embd=128", "model.n_head=4", "model.ffn_hidden=256",
         "data.batch_size=64", "data.eval_batch_size=128", "trainer.max_epochs=1", "+trainer.limit_train_batches=180",
         "trainer.limit_val_batches=2", "trainer.limit_test_batches=1", "optimizer.lr=2e-3", "model.num_samples=2",
         "model.decode.beam_size=3", *FAST]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """train.py as a user runs it, logging to W&B offline."""
    real_data("multi30k")
    base = tmp_path_factory.mktemp("mt")
    run_dir = base / "run"
    env = {**wandb_offline(base), "ATTNLAB_CACHE_DIR": str(base / "cache"),
           "ATTNLAB_LOG_DIR": str(base / "logs")}
    out = run_cli("train.py", *SHORT, "logger=wandb", f"hydra.run.dir={run_dir}", env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    return run_dir, compose_cfg(SHORT, run_dir)


# a smaller model for a few steps on the small captions: a checkpoint, W&B media, decoding
TINY = ["experiment=mt_transformer", "model.n_layer=1", "model.n_embd=64", "model.n_head=4", "model.ffn_hidden=128",
        "data.batch_size=16", "data.eval_batch_size=32", "trainer.max_epochs=1", "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=1", "optimizer.lr=2e-3", "model.num_samples=2", "model.decode.beam_size=3",
        *FAST]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, small_data):
    """train.py as a user runs it on the small captions, logging to W&B offline."""
    base = tmp_path_factory.mktemp("mt_small")
    run_dir = base / "run"
    env = {**wandb_offline(base), "ATTNLAB_CACHE_DIR": str(base / "cache"),
           "ATTNLAB_LOG_DIR": str(base / "logs")}
    out = run_cli("train.py", *TINY, "logger=wandb", f"hydra.run.dir={run_dir}", env=env, data_dir=small_data)
    assert out.returncode == 0, out.stdout[-3000:]
    return run_dir


@pytest.mark.slow
def test_a_short_run_on_multi30k_beats_the_untrained_model(trained):
    run_dir, cfg = trained
    metrics = json.loads((run_dir / "metrics.json").read_text())
    ckpt = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    model = Translator.load_from_checkpoint(ckpt).eval()
    from attnlab.cli.builders import build_datamodule

    dm = build_datamodule(cfg.data)
    batches = [b for _, b in zip(range(2), dm.val_dataloader())]  # the validation batches the run scored

    def bleu(m):
        hyps = [h for b in batches for h in m.translate(b["src"], beam_size=1)]
        return sacrebleu.corpus_bleu(hyps, [[r for b in batches for r in b["ref"]]]).score

    untrained = Translator(**{k: v for k, v in model.hparams.items() if k not in ("optimizer", "scheduler")},
                           src_tokenizer=model.tokenizer_json[0], tgt_tokenizer=model.tokenizer_json[1]).eval()
    assert bleu(model) == pytest.approx(metrics["val/bleu"], abs=1e-4)  # val/bleu is sacreBLEU of these outputs
    assert bleu(untrained) < 1.0
    assert metrics["val/bleu"] >= bleu(untrained) + 4.0, metrics
    assert metrics["test/bleu"] > 4.0 and metrics["val/ppl"] < 60
    pngs = sorted((run_dir / "alignments").glob("*.png"))
    assert len(pngs) == 4 and all(p.stat().st_size > 5_000 for p in pngs)


@pytest.mark.slow
def test_translations_and_alignments_reach_wandb(small_run):
    run_dir = small_run
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    media = offline / "files" / "media"
    (table,) = media.rglob("val/translations*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == ["source", "reference", "translation"] and len(data["data"]) == 2
    assert len(list(media.rglob("val/alignments*/*.png")) or list((media / "images" / "val").glob("alignments*"))) == 4
    (test_table,) = media.rglob("test/translations*.table.json")


@pytest.mark.slow
def test_predict_translates_a_sentence_and_a_file(small_run, tmp_path, log_env):
    run_dir = small_run
    ckpt = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    out = run_here("predict.py", f"ckpt_path={ckpt}", "text=Ein Mann fährt Fahrrad.", "extras.print_config=false",
                   f"hydra.run.dir={tmp_path}/p1", env=log_env)
    assert out.returncode == 0, out.stdout[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.strip() and not line.startswith("[")]
    assert lines and any(w in lines[-1] for w in ("man", "person", "a ")), out.stdout[-1000:]
    src = tmp_path / "in.de"
    src.write_text("Zwei Hunde spielen im Schnee.\nEine Frau singt.\nEin Kind schläft.\n", encoding="utf-8")
    out = run_here("predict.py", f"ckpt_path={ckpt}", f"input={src}", "decode.beam_size=1",
                   "extras.print_config=false", f"hydra.run.dir={tmp_path}/p2", env=log_env)
    assert out.returncode == 0, out.stdout[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.strip() and not line.startswith("[")]
    assert len(lines) == 3, out.stdout[-1000:]


@pytest.mark.slow
def test_eval_takes_decoding_settings(small_run, small_data, tmp_path, log_env):
    run_dir = small_run
    ckpt = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    out = run_here("eval.py", f"ckpt_path={ckpt}", "split=val", "decode.val_beam_size=2", "trainer.limit_val_batches=1",
                   "extras.print_config=false", f"hydra.run.dir={tmp_path}/e", env=log_env, data_dir=small_data)
    assert out.returncode == 0, out.stdout[-2000:]
    assert "val BLEU" in out.stdout and "(beam 2," in out.stdout, out.stdout[-2000:]


@pytest.mark.slow
def test_a_translation_checkpoint_is_refused_by_an_image_model(small_run, tmp_path, log_env):
    run_dir = small_run
    ckpt = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    out = run_here("train.py", "model=vit", "data=digits", f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path}/r",
                   env=log_env)
    assert out.returncode != 0
    assert "attnlab: error:" in out.stdout and "Translator" in out.stdout, out.stdout[-1500:]


# ---- every experiment runs (tiny sizes)

@pytest.mark.parametrize("experiment,extra", [
    ("mt_transformer", ["model.n_layer=1", "model.n_embd=32", "model.ffn_hidden=64"]),
    ("mt_bahdanau", ["model.hidden=32", "model.emb_dim=16"]),
    ("mt_gru", ["model.hidden=32", "model.emb_dim=16"]),
    ("mt_lstm", ["model.hidden=32", "model.emb_dim=16"]),
])
@pytest.mark.slow
def test_fast_dev_run_of_each_translation_experiment(tmp_path, small_data, experiment, extra):
    cfg = compose_cfg([f"experiment={experiment}", "debug=fdr", "data.eval_batch_size=16", "model.num_samples=1",
                       *extra, *FAST], tmp_path, data_dir=small_data)
    train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["test/ppl"] > 1 and 0 <= metrics["test/bleu"] <= 100


def test_transformer_base_with_noam_schedule_composes(tmp_path):
    cfg = compose_cfg(["model=transformer_seq2seq", "data=multi30k", "scheduler=noam", "optimizer=adam",
                       "optimizer.lr=1"], tmp_path)
    assert cfg.scheduler.d_model == 512 and cfg.model.n_layer == 6 and cfg.model.label_smoothing == 0.1


# ---- bad input

def _pair(tmp_path, src_lines, tgt_lines):
    (tmp_path / "a.de").write_text("\n".join(src_lines) + "\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("\n".join(tgt_lines) + "\n", encoding="utf-8")
    return f"[{tmp_path / 'a.de'},{tmp_path / 'a.en'}]"


def _parallel(tmp_path, files, *extra):
    return compose_cfg(["model=transformer_seq2seq_small", "data=parallel", f"data.train={files}",
                        f"data.val={files}", "debug=fdr", *extra, *FAST], tmp_path / "run")


def test_line_counts_that_differ_are_refused(tmp_path):
    cfg = _parallel(tmp_path, _pair(tmp_path, ["ein hund", "eine katze", "ein haus"], ["a dog", "a cat"]))
    with pytest.raises(UserError, match=r"a.de has 3 lines but .*a.en has 2.*line i of one must be the translation"):
        train(cfg)


def test_empty_lines_are_left_out_with_a_warning_and_long_ones_truncated(tmp_path, caplog):
    from attnlab.cli.builders import build_datamodule

    lines_de = ["ein hund läuft schnell über die große grüne wiese am see"] * 30 + ["", "eine katze"]
    lines_en = ["a dog runs quickly across the big green meadow by the lake"] * 30 + ["a cat", ""]
    cfg = _parallel(tmp_path, _pair(tmp_path, lines_de, lines_en), "data.max_length=6", "data.vocab_size=300",
                    "data.min_frequency=1", "data.batch_size=4")
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        dm = build_datamodule(cfg.data)
    assert len(dm.train_set) == 30
    assert "2 pair(s) with an empty side left out (lines 31, 32)" in caplog.text
    assert "longer than data.max_length=6 tokens were truncated" in caplog.text
    assert max(len(dm.train_set[i]["tgt"]) for i in range(30)) == 6


def test_data_longer_than_the_positional_table_is_refused(tmp_path):
    files = _pair(tmp_path, ["ein hund"] * 20, ["a dog"] * 20)
    cfg = _parallel(tmp_path, files, "model.max_len=32", "data.max_length=64", "data.vocab_size=300",
                    "data.min_frequency=1", "data.batch_size=4")
    with pytest.raises(UserError, match=r"data.max_length=64 is longer than .*model.max_len=32"):
        train(cfg)


def test_unknown_language_codes_are_refused(tmp_path, small_data):
    cfg = compose_cfg(["experiment=mt_transformer", "data.src_lang=xx", *FAST], tmp_path, data_dir=small_data)
    with pytest.raises(UserError, match="'xx' is not a Multi30k language.*en, de, fr, cs"):
        train(cfg)
    cfg = compose_cfg(["experiment=mt_transformer", "data.src_lang=en", "data.tgt_lang=en", *FAST], tmp_path,
                      data_dir=small_data)
    with pytest.raises(UserError, match="both 'en'"):
        train(cfg)


def test_missing_multi30k_files_say_where_to_put_them(tmp_path):
    cfg = compose_cfg(["experiment=mt_transformer", "data.download=false", f"paths.data_dir={tmp_path}", *FAST],
                      tmp_path)
    cfg.data.data_dir = str(tmp_path)
    with pytest.raises(UserError, match=r"train.de.gz does not exist.*go in .*multi30k.*github.com/multi30k"):
        train(cfg)


def test_hub_translation_data_offline_says_so(tmp_path, hub_offline):
    cfg = compose_cfg(["model=transformer_seq2seq_small", "data=wmt16_ro_en", "debug=fdr", *FAST], tmp_path)
    with pytest.raises(UserError, match="could not load the hub dataset 'wmt16'.*go online"):
        train(cfg)


def test_a_resumed_epoch_continues_at_the_batch_it_stopped_at():
    from attnlab.data.samplers import ResumableDataLoader

    lengths = torch.randint(3, 30, (300,)).numpy()
    ds = [{"src": torch.ones(n, dtype=torch.long), "tgt": torch.ones(n, dtype=torch.long), "i": i}
          for i, n in enumerate(lengths)]

    def loader():
        return ResumableDataLoader(ds, batch_sampler=BucketBatchSampler(lengths, 16, seed=3),
                                   collate_fn=lambda b: [x["i"] for x in b])

    full = loader()
    full.batch_sampler.set_epoch(2)
    order = list(full)
    first = loader()
    first.batch_sampler.set_epoch(2)
    it = iter(first)
    seen = [next(it) for _ in range(5)]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert seen + list(resumed) == order and state["epoch"] == 2 and state["batches"] == 5


def test_bad_alignment_settings_and_non_utf8_files_are_user_errors(tmp_path):
    with pytest.raises(UserError, match=r"alignment_layer=3, but the decoder has 2 layers"):
        transformer(alignment_layer=3)
    with pytest.raises(UserError, match=r"alignment_head=4, but there are 4 heads: give one of 0..3"):
        transformer(alignment_head=4)
    (tmp_path / "a.de").write_bytes("ein Fuß\n".encode("latin1"))
    (tmp_path / "a.en").write_text("a foot\n", encoding="utf-8")
    cfg = _parallel(tmp_path, f"[{tmp_path / 'a.de'},{tmp_path / 'a.en'}]")
    with pytest.raises(UserError, match=r"a.de is not utf-8 text .*data.encoding=latin-1 .*iconv -f latin1 -t utf-8"):
        train(cfg)
    de, _ = read_pair(tmp_path / "a.de", tmp_path / "a.en", "", encoding="latin-1")
    assert de == ["ein Fu\u00df"]
