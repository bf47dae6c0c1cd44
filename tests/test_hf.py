"""Hugging Face BERT and GPT-2 weights in attnlab's networks (model.init_from=hf:...) and back (export.py format=hf):
small random `transformers` models saved locally, logits compared with transformers' own."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.cli.export import export
from attnlab.cli.training import train
from attnlab.errors import UserError
from attnlab.nn.registry import create_network
from attnlab.transfer import hf
from attnlab.transfer.hf_export import export_hf
from conftest import FAST, compose_cfg

transformers = pytest.importorskip("transformers")
TEXT = ["a gripping , funny movie", "the plot is thin and the acting is worse", "one of the best films of the year",
        "a dull , lifeless mess", "warm , witty and moving", "it never finds its footing"] * 20


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Random values everywhere (LayerNorm gains and biases included), so that a wrong mapping shows."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _wordpiece(folder: Path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TEXT, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]",
                                                sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    fast.save_pretrained(folder)
    return fast


def _bytelevel(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    return fast


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory) -> Path:
    """A random BertForMaskedLM (2 layers, 32 dims, LayerNorm eps 1e-12) and its WordPiece tokenizer."""
    folder = tmp_path_factory.mktemp("hf_bert")
    tok = _wordpiece(folder)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    _perturb(transformers.BertForMaskedLM(cfg)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory) -> Path:
    """A random GPT2LMHeadModel (2 layers, 32 dims, tanh GELU) and its byte-level BPE tokenizer."""
    folder = tmp_path_factory.mktemp("hf_gpt2")
    tok = _bytelevel(folder)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  eos_token_id=0, bos_token_id=0)
    _perturb(transformers.GPT2LMHeadModel(cfg)).save_pretrained(folder)
    return folder


def _ours(init_from: str, net: str, keep_new=(), **extra) -> torch.nn.Module:
    network, _ = create_network(net, hf.init_settings(init_from) | extra)
    hf.load_into(network, init_from, keep_new)
    return network.eval()


IDS = torch.tensor([[2, 17, 30, 41, 55, 3, 0, 0], [2, 23, 9, 61, 12, 70, 8, 3]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8])


# ---- loading: logits equal transformers'

def test_bert_mlm_weights_give_transformers_logits_with_padding(hf_bert):
    theirs = transformers.BertForMaskedLM.from_pretrained(hf_bert).eval()
    ours = _ours(f"hf:{hf_bert}", "bert", max_length=32)              # the position table cut to 32
    assert ours.config.norm_eps == 1e-12 and ours.config.norm_position == "post"
    with torch.no_grad():
        want = theirs(input_ids=IDS, attention_mask=MASK).logits
        got = ours(IDS, MASK)
    real = MASK.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5), (got[real] - want[real]).abs().max()


def test_bert_classifier_loads_the_pooler_and_reads_pairs(hf_bert, tmp_path):
    cfg = transformers.BertConfig.from_pretrained(hf_bert, num_labels=3)
    model = _perturb(transformers.BertForSequenceClassification(cfg))
    model.save_pretrained(tmp_path)
    ours = _ours(f"hf:{tmp_path}", "bert_classifier", max_length=64, num_classes=3)
    segments = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        want = model(input_ids=IDS, attention_mask=MASK, token_type_ids=segments).logits
        got = ours(IDS, MASK, segments)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_gpt2_weights_give_transformers_logits_with_a_padded_vocabulary(hf_gpt2):
    theirs = transformers.GPT2LMHeadModel.from_pretrained(hf_gpt2).eval()
    ours = _ours(f"hf:{hf_gpt2}", "gpt", block_size=64, pad_vocab_multiple=64)
    assert ours.config.ffn == "gelu_tanh" and ours.embed.wte.weight.shape[0] % 64 == 0
    with torch.no_grad():
        want = theirs(input_ids=IDS, attention_mask=MASK).logits
        got = ours(IDS)[..., : want.shape[-1]]
    real = MASK.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5), (got[real] - want[real]).abs().max()


def test_gpt2_classifier_reads_the_last_real_token(hf_gpt2, tmp_path):
    cfg = transformers.GPT2Config.from_pretrained(hf_gpt2, num_labels=2, pad_token_id=0)
    model = _perturb(transformers.GPT2ForSequenceClassification(cfg))
    model.save_pretrained(tmp_path)
    ours = _ours(f"hf:{tmp_path}", "gpt_classifier", block_size=64, num_classes=2)
    with torch.no_grad():
        want = model(input_ids=IDS, attention_mask=MASK).logits
        got = ours(IDS, MASK)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


# ---- export: from_pretrained gives attnlab's logits

def test_export_hf_round_trips_bert_and_gpt_to_the_same_logits(hf_bert, hf_gpt2, tmp_path):
    from attnlab.tasks.language_model import CausalLM, MaskedLM
    from attnlab.tasks.text_classification import TextClassifier

    cases = [(MaskedLM, hf_bert, {"max_length": 32}, transformers.BertForMaskedLM),
             (TextClassifier, hf_bert, {"max_length": 32, "num_classes": 2, "class_names": ["neg", "pos"]},
              transformers.BertForSequenceClassification),
             (CausalLM, hf_gpt2, {"block_size": 32}, transformers.GPT2LMHeadModel)]
    for task_cls, folder, extra, auto in cases:
        init = f"hf:{folder}"
        task = task_cls(**hf.init_settings(init), **extra, tokenizer=hf.read_tokenizer(init), init_from=init)
        task.on_fit_start()
        torch.manual_seed(1)
        with torch.no_grad():
            for name, p in task.net.named_parameters():
                if name.startswith(("classifier", "pooler", "segment")):
                    p.normal_(0, 0.2)
        task.eval()
        out = tmp_path / task_cls.__name__
        export_hf(task, out)
        theirs = auto.from_pretrained(out).eval()
        with torch.no_grad():
            got = task.net(IDS, MASK) if task_cls is not CausalLM else task.net(IDS)
            want = theirs(input_ids=IDS, attention_mask=MASK).logits
        if got.dim() == 3:
            real = MASK.bool()
            got, want = got[real][:, : want.shape[-1]], want[real]
        assert torch.allclose(got, want, atol=1e-5), (task_cls.__name__, (got - want).abs().max())
        tok = transformers.AutoTokenizer.from_pretrained(out)
        assert tok("a funny movie")["input_ids"] == (
            [2, *task.tokenizer.encode("a funny movie"), 3] if folder == hf_bert else task.tokenizer.encode("a funny movie"))
    assert json.loads((tmp_path / "TextClassifier" / "config.json").read_text())["id2label"] == {"0": "neg", "1": "pos"}


# ---- train.py from hf: weights, then export.py

def test_train_from_hf_bert_then_export_hf(hf_bert, small_data, tmp_path):
    over = ["model=bert_classifier", "data=sst2", f"model.init_from=hf:{hf_bert}", "data.max_length=32",
            "data.batch_size=16", "trainer=cpu", "trainer.max_steps=30", "trainer.val_check_interval=15",
            "optimizer.lr=5e-4", "logger=csv", *FAST]
    cfg = compose_cfg(over, tmp_path / "run", data_dir=small_data)
    train(cfg)
    assert cfg.model.n_embd == 32 and cfg.model.norm_eps == 1e-12     # the sizes came from the weights' config
    assert "test/acc" in json.loads((tmp_path / "run" / "metrics.json").read_text())
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    out = export(compose_cfg([f"ckpt_path={ckpt}", "format=hf"], tmp_path / "exp", config_name="export"))
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    from attnlab.tasks.text_classification import TextClassifier

    ours = TextClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False).eval()
    batch = tok(["a gripping , funny movie", "a dull mess"], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = theirs(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert theirs.config.num_labels == 2 and torch.allclose(got, want, atol=1e-5)


def test_continue_pretraining_gpt2_from_hf_weights_lowers_the_loss(hf_gpt2, small_data, tmp_path):
    over = ["model=gpt2_small", "data=tinyshakespeare", f"model.init_from=hf:{hf_gpt2}", "data.block_size=32",
            "data.batch_size=8", "trainer=cpu", "trainer.max_steps=40", "trainer.val_check_interval=20",
            "trainer.limit_val_batches=4", "optimizer.lr=1e-3", "model.num_samples=0", "test=false", "logger=csv",
            *FAST]
    cfg = compose_cfg(over, tmp_path / "run", data_dir=small_data)
    train(cfg)
    assert cfg.model.n_layer == 2 and cfg.model.ffn == "gelu_tanh"
    import pandas as pd

    csv = pd.read_csv(next((tmp_path / "run").rglob("metrics.csv")))
    losses = csv["train/loss"].dropna().tolist()
    assert losses[-1] < losses[0]


# ---- refusals

def test_hub_name_offline_says_where_the_weights_are_cached(tmp_path):
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = "from attnlab.transfer import hf; hf.init_settings('hf:bert-base-uncased')"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "are not in the Hugging Face cache" in r.stderr and str(tmp_path / "hf") in r.stderr
    assert "huggingface-cli download bert-base-uncased" in r.stderr


def test_unsupported_architecture_and_wrong_family_are_refused(hf_gpt2, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UserError, match=r"is a 'llama' model \(LlamaForCausalLM\): attnlab loads BERT"):
        hf.init_settings(f"hf:{tmp_path}")
    net, _ = create_network("bert_classifier", dict(vocab_size=400, max_length=32, n_layer=2, n_head=4, n_embd=32))
    with pytest.raises(UserError, match="holds GPT-2 .* weights, but this run's network is BertClassifier.*"
                                        "model=gpt_classifier"):
        hf.load_into(net, f"hf:{hf_gpt2}", ())


def test_export_hf_refuses_a_layout_transformers_cannot_express(tmp_path):
    from attnlab.tasks.language_model import CausalLM

    task = CausalLM(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, positional="rope")
    with pytest.raises(UserError, match=r"model.positional=rope, which it cannot express. Use format=safetensors"):
        export_hf(task, tmp_path)
    from types import SimpleNamespace

    with pytest.raises(UserError, match=r"format=hf writes BERT and GPT checkpoints .* network is Linear. Use "
                                        "format=safetensors"):
        export_hf(SimpleNamespace(net=torch.nn.Linear(2, 2)), tmp_path)


# ---- GLUE through datasets

def _glue_folder(tmp_path: Path, task: str) -> Path:
    import datasets

    names = {"cola": ["unacceptable", "acceptable"], "rte": ["entailment", "not_entailment"]}[task]
    pairs = task == "rte"
    good = ["the movie was great", "she reads books every day", "they sang a song", "we like warm tea"]
    bad = ["movie the great was", "books she every reads", "song sang they a", "tea warm like we"]

    def split(n):
        rows = [(g, 1) for g in good] + [(b, 0) for b in bad]
        rows = (rows * n)[: 8 * n]
        cols = {"sentence1": [r[0] for r in rows], "sentence2": [r[0][::-1] for r in rows]} if pairs \
            else {"sentence": [r[0] for r in rows]}
        feats = {c: datasets.Value("string") for c in cols} | {"label": datasets.ClassLabel(names=names),
                                                                "idx": datasets.Value("int32")}
        return datasets.Dataset.from_dict(cols | {"label": [r[1] for r in rows], "idx": list(range(len(rows)))},
                                          features=datasets.Features(feats))

    folder = tmp_path / f"glue_{task}"
    datasets.DatasetDict({"train": split(12), "validation": split(3), "test": split(2)}).save_to_disk(str(folder))
    return folder


def test_glue_from_a_saved_dataset_with_pairs_names_and_mcc(tmp_path):
    from attnlab.data.text.glue import GlueDataModule

    dm = GlueDataModule(task="rte", local_path=str(_glue_folder(tmp_path, "rte")), tokenizer_vocab_size=100,
                        cache_dir=str(tmp_path / "cache"), batch_size=4)
    dm.setup("fit")
    info = dm.info()
    assert info.class_names == ["entailment", "not_entailment"] and dm.text_columns == ["sentence1", "sentence2"]
    batch = next(iter(dm.train_dataloader()))
    assert batch["token_type_ids"].max() == 1                          # pairs: segment 1 for the second text

    cfg = compose_cfg(["model=bert_classifier", "data=glue", "data.task=cola",
                       f"data.local_path={_glue_folder(tmp_path, 'cola')}", "data.tokenizer_vocab_size=100",
                       "data.batch_size=8", "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
                       "model.monitor=val/mcc", "trainer=cpu", "trainer.max_steps=60",
                       "trainer.val_check_interval=30", "trainer.check_val_every_n_epoch=null", "trainer.max_epochs=-1",
                       "optimizer.lr=3e-3", "logger=csv", *FAST], tmp_path / "run")
    train(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert {"val/mcc", "test/mcc", "test/f1", "test/acc"} <= set(metrics)
    assert metrics["test/mcc"] > 0.5                                    # word order is learnable


def test_glue_offline_and_bad_task_are_refused(tmp_path, hub_offline):
    from attnlab.data.text.glue import GlueDataModule

    with pytest.raises(UserError, match="data.task=sts is not a GLUE task: use one of cola, sst2, mrpc, stsb"):
        GlueDataModule(task="sts")
    with pytest.raises(UserError, match=r"GLUE mrpc is a sentence-pair task with the text column\(s\) sentence1, "
                                        "sentence2. Leave data.text_columns=null"):
        GlueDataModule(task="mrpc", text_columns=["sentence1"])
    dm = GlueDataModule(task="mrpc", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(UserError, match=r"could not load 'nyu-mll/glue' \(mrpc\).*data.local_path.*glue_data.*"
                                        "save_to_disk"):
        dm.setup("fit")


@pytest.mark.slow
def test_gpt_classifier_from_hf_gpt2_trains_and_predicts(hf_gpt2, small_data, tmp_path, capsys):
    over = ["model=gpt_classifier", "data=sst2", f"model.init_from=hf:{hf_gpt2}", "data.max_length=48",
            "data.batch_size=16", "trainer=cpu", "trainer.max_steps=80", "trainer.val_check_interval=40", "trainer.max_epochs=-1",
            "trainer.check_val_every_n_epoch=null",
            "optimizer.lr=2e-3", "logger=csv", *FAST]
    cfg = compose_cfg(over, tmp_path / "run", data_dir=small_data)
    train(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert cfg.model.n_layer == 2 and metrics["test/acc"] > 0.6, metrics   # the fixture's words carry the label
    from attnlab.cli.predict import predict

    capsys.readouterr()
    predict(compose_cfg([f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}",
                         "text='a gripping , funny movie'"], tmp_path / "pred", config_name="predict"))
    assert re.match(r"[01] \(0\.\d{3}\): a gripping , funny movie", capsys.readouterr().out)


def test_the_glue_recipe_starts_from_hf_bert_on_a_regression(hf_bert, tmp_path):
    """experiment=bert_glue from hf:<BERT weights>: their sizes and post-norm layout replace the recipe's, their
    tokenizer reads GLUE's text, and STS-B's one-output head is new (the weights have none)."""
    import glue_mini
    import yaml

    tsv = glue_mini.write_tsv_tree(tmp_path / "glue_data")
    cfg = compose_cfg(["experiment=bert_glue", "data.task=stsb", f"data.local_path={tsv}",
                       f"model.init_from=hf:{hf_bert}", "data.max_length=32", "data.batch_size=8", "trainer=cpu",
                       "trainer.max_steps=4", "logger=csv", *FAST], tmp_path / "run")
    train(cfg)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["norm_position"] == "post" and saved["model"]["n_embd"] == 32
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert {"test/pearson", "test/spearman"} <= set(metrics)
