"""Hugging Face BERT and GPT-2 weights in attnlab's own networks (`model.init_from=hf:<hub name or local folder>`),
and back (`export.py format=hf`).

One table per family pairs each attnlab tensor with its `transformers` tensor(s): BERT (`BertModel`,
`BertForMaskedLM`, `BertForSequenceClassification`) maps onto `nn/bert.py` (post-norm blocks, LayerNorm eps from the
config, token-type embeddings as `segment`, the pooler), GPT-2 (`GPT2LMHeadModel`, `GPT2Model`,
`GPT2ForSequenceClassification`) onto `nn/gpt.py` (pre-norm, Conv1D weights transposed, tanh GELU). Loading reads
only `config.json`, the weights (`model.safetensors`, sharded or not, or `pytorch_model.bin`) and the tokenizer:
`transformers` itself is not needed."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import UserError

log = logging.getLogger("attnlab")

PREFIX = "hf:"
FAMILIES = {"bert": "BERT (BertModel, BertForMaskedLM, BertForSequenceClassification)",
            "gpt2": "GPT-2 (GPT2LMHeadModel, GPT2Model, GPT2ForSequenceClassification)"}
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
         "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt"]


def is_hf(init_from: Any) -> bool:
    return isinstance(init_from, str) and init_from.startswith(PREFIX)


# ---- finding and reading
def resolve(init_from: str) -> Path:
    """hf:<local folder> or hf:<hub name> -> the folder holding config.json (downloaded into the Hugging Face cache
    when online, read from it when not)."""
    name = init_from.removeprefix(PREFIX).strip()
    folder = Path(name).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise UserError(f"model.init_from={init_from}: the folder {folder} has no config.json. Give a folder "
                            "written by transformers' save_pretrained (config.json, model.safetensors, "
                            "tokenizer.json) or a hub name such as hf:bert-base-uncased.")
        return folder
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=FILES))
    except Exception as e:  # offline, unknown name, gated repository
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"model.init_from={init_from}: the weights of '{name}' are not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and could not be downloaded ({type(e).__name__}: {reason[:200]}). On a "
            f"machine with network, run `huggingface-cli download {name}` once (or this same command: it caches "
            "them; HF_HOME moves the cache), or copy a folder written by save_pretrained (config.json, "
            "model.safetensors, tokenizer.json) here and give its path: model.init_from=hf:/path/to/folder."
        ) from None


def read_config(folder: Path, init_from: str) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    family = config.get("model_type")
    if family not in FAMILIES:
        arch = ", ".join(config.get("architectures") or []) or "no architectures listed"
        raise UserError(f"model.init_from={init_from} is a '{family}' model ({arch}): attnlab loads "
                        f"{' and '.join(FAMILIES.values())} weights into its own networks. Pick a BERT or GPT-2 "
                        "checkpoint, or train this architecture with transformers' own scripts.")
    act = config.get("hidden_act" if family == "bert" else "activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise UserError(f"model.init_from={init_from}: the activation '{act}' has no attnlab equivalent (attnlab "
                        f"has {', '.join(ACTIVATIONS)}). Pick weights trained with one of those.")
    unsupported = {"position_embedding_type": "absolute", "scale_attn_by_inverse_layer_idx": False,
                   "reorder_and_upcast_attn": False}
    for key, usual in unsupported.items():
        if config.get(key, usual) != usual:
            raise UserError(f"model.init_from={init_from}: {key}={config[key]} is not a layout attnlab's networks "
                            f"compute (they do {key}={usual}). Pick weights with the usual {key}.")
    return config


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(_inside(folder, shard, index))).items()}
    if (folder / "pytorch_model.bin").is_file():  # a pickle: read as every checkpoint is (weights only)
        from attnlab.checkpoints.reading import load_checkpoint

        return load_checkpoint(folder / "pytorch_model.bin", "model.init_from")
    raise UserError(f"{folder} has a config.json but no weights (model.safetensors or pytorch_model.bin): "
                    "download the whole folder.")


def _inside(folder: Path, name: Any, index: Path) -> Path:
    """A shard an index names: a file of the folder itself (a name that climbs out of it, or an absolute path, could
    make the index read any file on the disk)."""
    path = (folder / str(name)).resolve()
    if not isinstance(name, str) or Path(name).is_absolute() or not path.is_relative_to(folder.resolve()):
        raise UserError(f"model.init_from: {index} names the shard {name!r}, which is not a file of {folder}. An "
                        "index names its shards by file name, beside it; nothing outside the folder is read. Download "
                        "the folder again.")
    return path


def read_tokenizer(init_from: str) -> str:
    """The checkpoint's tokenizer as attnlab's tokenizer JSON (tokenizer.json, or vocab.txt / vocab.json +
    merges.txt)."""
    folder = resolve(init_from)
    family = read_config(folder, init_from)["model_type"]
    kind = "wordpiece" if family == "bert" else "bpe"
    from tokenizers import Tokenizer

    if (folder / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    elif family == "bert" and (folder / "vocab.txt").is_file():
        from tokenizers.implementations import BertWordPieceTokenizer

        lower = json.loads((folder / "tokenizer_config.json").read_text()).get("do_lower_case", True) \
            if (folder / "tokenizer_config.json").is_file() else True
        tok = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=lower)._tokenizer
    elif family == "gpt2" and (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        from tokenizers.implementations import ByteLevelBPETokenizer

        tok = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))._tokenizer
    else:
        raise UserError(f"model.init_from={init_from}: {folder} has no tokenizer (tokenizer.json, or vocab.txt for "
                        "BERT, vocab.json + merges.txt for GPT-2): save it next to the weights "
                        "(tokenizer.save_pretrained(folder)).")
    tok.post_processor = None  # attnlab's data adds [CLS]/[SEP] itself
    return json.dumps({"attnlab_kind": kind, "tokenizer": json.loads(tok.to_str())})


# ---- what the weights fix about the network
def settings(config: dict[str, Any]) -> dict[str, Any]:
    """The attnlab network settings these weights need (the sequence length stays the run's: the position table is
    cut to it)."""
    if config["model_type"] == "bert":
        n = config["hidden_size"]
        return {"vocab_size": config["vocab_size"], "n_layer": config["num_hidden_layers"],
                "n_head": config["num_attention_heads"], "n_embd": n, "ffn_mult": config["intermediate_size"] / n,
                "ffn": ACTIVATIONS[config.get("hidden_act", "gelu")], "norm": "layernorm",
                "norm_eps": config.get("layer_norm_eps", 1e-12), "norm_position": "post", "positional": "learned",
                "bias": True, "tie_weights": config.get("tie_word_embeddings", True),
                "type_vocab_size": config.get("type_vocab_size", 2)}
    n = config["n_embd"]
    return {"vocab_size": config["vocab_size"], "n_layer": config["n_layer"], "n_head": config["n_head"], "n_embd": n,
            "ffn_mult": (config.get("n_inner") or 4 * n) / n,
            "ffn": ACTIVATIONS[config.get("activation_function", "gelu_new")], "norm": "layernorm",
            "norm_eps": config.get("layer_norm_epsilon", 1e-5), "norm_position": "pre", "positional": "learned",
            "bias": True, "tie_weights": config.get("tie_word_embeddings", True)}


def init_settings(init_from: str) -> dict[str, Any]:
    folder = resolve(init_from)
    return settings(read_config(folder, init_from))


# ---- the key tables: (attnlab key, transformers key(s), how)
def _pair(ours: str, theirs: str, how: str = "same", bias: bool = True) -> list[tuple[str, Any, str]]:
    rows = [(f"{ours}.weight", f"{theirs}.weight", how)]
    return rows + [(f"{ours}.bias", f"{theirs}.bias", "same")] if bias else rows


def table(family: str, n_layer: int) -> list[tuple[str, Any, str]]:
    """how: same | T (GPT-2's Conv1D stores (in, out)) | qkv (BERT's three projections, stacked)."""
    if family == "bert":
        rows = [("embed.wte.weight", "bert.embeddings.word_embeddings.weight", "same"),
                ("embed.pos.wpe.weight", "bert.embeddings.position_embeddings.weight", "same"),
                ("segment.weight", "bert.embeddings.token_type_embeddings.weight", "same"),
                *_pair("embed_norm", "bert.embeddings.LayerNorm")]
        for i in range(n_layer):
            p, q = f"blocks.{i}.", f"bert.encoder.layer.{i}."
            rows += [(f"{p}attn.qkv_proj.{w}", tuple(f"{q}attention.self.{x}.{w}" for x in ("query", "key", "value")),
                      "qkv") for w in ("weight", "bias")]
            rows += [*_pair(f"{p}attn.out_proj", f"{q}attention.output.dense"),
                     *_pair(f"{p}norm1", f"{q}attention.output.LayerNorm"),
                     *_pair(f"{p}ffn.fc", f"{q}intermediate.dense"), *_pair(f"{p}ffn.proj", f"{q}output.dense"),
                     *_pair(f"{p}norm2", f"{q}output.LayerNorm")]
        return rows + [*_pair("pooler", "bert.pooler.dense"), *_pair("classifier", "classifier"),
                       *_pair("head_dense", "cls.predictions.transform.dense"),
                       *_pair("head_norm", "cls.predictions.transform.LayerNorm"),
                       ("decoder_bias", "cls.predictions.bias", "same"),
                       ("decoder.weight", "cls.predictions.decoder.weight", "same")]
    rows = [("embed.wte.weight", "transformer.wte.weight", "same"),
            ("embed.pos.wpe.weight", "transformer.wpe.weight", "same")]
    for i in range(n_layer):
        p, q = f"blocks.{i}.", f"transformer.h.{i}."
        rows += [*_pair(f"{p}norm1", f"{q}ln_1"), *_pair(f"{p}attn.qkv_proj", f"{q}attn.c_attn", "T"),
                 *_pair(f"{p}attn.out_proj", f"{q}attn.c_proj", "T"), *_pair(f"{p}norm2", f"{q}ln_2"),
                 *_pair(f"{p}ffn.fc", f"{q}mlp.c_fc", "T"), *_pair(f"{p}ffn.proj", f"{q}mlp.c_proj", "T")]
    return rows + [*_pair("norm_f", "transformer.ln_f"), ("lm_head.weight", "lm_head.weight", "same"),
                   ("classifier.weight", "score.weight", "same")]


def _canonical(state: dict[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """transformers' keys with the base model's prefix (a bare BertModel / GPT2Model saves without it) and the
    LayerNorm names of old checkpoints (gamma/beta)."""
    base, heads = ("bert.", ("cls.", "classifier.")) if family == "bert" else ("transformer.", ("lm_head.", "score."))
    out = {}
    for k, v in state.items():
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[k if k.startswith((base, *heads)) else base + k] = v
    return out


def to_attnlab(state: dict[str, torch.Tensor], family: str, n_layer: int) -> dict[str, torch.Tensor]:
    state, out = _canonical(state, family), {}
    for ours, theirs, how in table(family, n_layer):
        if how == "qkv":
            if all(t in state for t in theirs):
                out[ours] = torch.cat([state[t] for t in theirs], dim=0)
        elif theirs in state:
            out[ours] = state[theirs].t().contiguous() if how == "T" else state[theirs]
    return out


# ---- loading into a network
def load_into(net: nn.Module, init_from: str, keep_new: tuple[str, ...]) -> list[str]:
    """Copy hf:<...> weights into `net` (attnlab.nn.bert.* or attnlab.nn.gpt.*). `keep_new`: prefixes of `net`'s
    own parts the weights need not have (a new classification head). -> the keys left at their initialization."""
    from attnlab.nn.bert import BertEncoder

    folder = resolve(init_from)
    config = read_config(folder, init_from)
    family = config["model_type"]
    wants = "bert" if isinstance(net, BertEncoder) else "gpt2"
    if family != wants:
        hint = ("model=gpt_classifier (a GPT with a head on the last token)" if family == "gpt2"
                else "model=bert_classifier, or model=bert_small for masked-LM pretraining")
        raise UserError(f"model.init_from={init_from} holds {FAMILIES[family]} weights, but this run's network is "
                        f"{type(net).__name__} ({FAMILIES[wants].split(' ')[0]}): use {hint}.")
    theirs = to_attnlab(read_weights(folder), family, int(config.get("num_hidden_layers", config.get("n_layer"))))
    target = net.state_dict()
    for key in ("embed.pos.wpe.weight",):
        if key in theirs and key in target and theirs[key].shape[0] != target[key].shape[0]:
            have, want = theirs[key].shape[0], target[key].shape[0]
            if want > have:
                raise UserError(f"model.init_from={init_from} has {have} positions but the run asks for {want}: "
                                f"set data.max_length (or data.block_size) to at most {have}.")
            theirs[key] = theirs[key][:want]  # the first positions, as nanoGPT's crop_block_size
    for key in ("embed.wte.weight", "lm_head.weight", "decoder.weight", "decoder_bias"):
        if key in theirs and key in target and 0 < theirs[key].shape[0] < target[key].shape[0]:
            padded = target[key].clone()      # a vocabulary padded for speed (pad_vocab_multiple): the extra rows
            padded[: theirs[key].shape[0]] = theirs[key]  # keep their initialization
            theirs[key] = padded
    theirs = {k: v for k, v in theirs.items() if k in target}  # heads the run does not have (MLM head, pooler)
    if getattr(getattr(net, "config", None), "tie_weights", False):
        theirs.pop("lm_head.weight", None)
        theirs.pop("decoder.weight", None)
    missing = [k for k in target if k not in theirs and not k.startswith(keep_new)
               and not _tied(net, k)]
    shapes = [f"{k} {tuple(v.shape)} vs {tuple(target[k].shape)}" for k, v in theirs.items()
              if v.shape != target[k].shape]
    if missing or shapes:
        raise UserError(f"model.init_from={init_from}: the weights do not fit the network "
                        + (f"(the network's tensors they lack: {', '.join(missing[:6])}) " if missing else "")
                        + (f"(shapes, weights vs network: {', '.join(shapes[:4])}) " if shapes else "")
                        + "— the run's model settings were changed after they were read from the weights' "
                        "config.json; leave n_layer, n_head, n_embd, ffn, norm, bias at what init_from sets.")
    net.load_state_dict(theirs, strict=False)
    left = sorted(k for k in target if k not in theirs and not _tied(net, k))
    log.info("model.init_from: loaded %s (%s, %d tensors)%s", init_from, family, len(theirs),
             f"; newly initialized: {', '.join(left)}" if left else "")
    return left


def _tied(net: nn.Module, key: str) -> bool:
    return key in ("lm_head.weight", "decoder.weight") and getattr(net.config, "tie_weights", False)
