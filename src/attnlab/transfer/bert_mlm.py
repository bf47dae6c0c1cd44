"""The network of a language-model pretraining run into attnlab's text classifiers, for fine-tuning and linear
probing: a masked-LM run's encoder (model=bert_*) into `model=bert_classifier`, a causal LM's decoder (model=gpt*)
into `model=gpt_classifier` (`model.init_from=<its checkpoint or run folder>`). The LM head is dropped; the
tokenizer comes from the checkpoint, so the classifier reads text with the vocabulary its network learned."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.checkpoints.reading import find_checkpoint, load_checkpoint, run_config
from attnlab.errors import UserError

log = logging.getLogger("attnlab")

MLM_TARGET = "attnlab.tasks.language_model.MaskedLM"
LM_TARGET = "attnlab.tasks.language_model.CausalLM"
LM_HEADS = ("head_dense.", "head_norm.", "decoder.", "decoder_bias", "lm_head.")
WHAT = {MLM_TARGET: "a BERT masked-LM pretraining run (`python train.py experiment=bert_sst2_mlm`, or any run with "
                    "model=bert_*), or hf:<BERT weights>",
        LM_TARGET: "a GPT language-model run (`python train.py experiment=gpt_shakespeare_char`, or any run with "
                   "model=gpt*), or hf:<GPT-2 weights>"}


def read_mlm(init_from: str, wants: str = MLM_TARGET) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor],
                                                                 str | None]:
    """-> (the checkpoint's path, its model config, the network's state dict without its LM head, the tokenizer as
    JSON). `wants`: the pretraining task the classifier's network comes from."""
    path = find_checkpoint(init_from, "model.init_from", WHAT[wants])
    ckpt = load_checkpoint(path, "model.init_from")
    config = run_config(ckpt) or {}
    target = config.get("model", {}).get("_target_")
    if target != wants:
        what = f"a checkpoint of task {target}" if target else "not a checkpoint written by attnlab's train.py"
        hint = {LM_TARGET: " A GPT is a decoder: fine-tune it with model=gpt_classifier.",
                MLM_TARGET: " A BERT is an encoder: fine-tune it with model=bert_classifier."}.get(target, "")
        raise UserError(f"model.init_from={path} is {what}: this classifier starts from {WHAT[wants]}.{hint} To "
                        "continue training a classifier from its own checkpoint use ckpt_path= instead.")
    state = {k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()
             if k.startswith("net.") and not k.removeprefix("net.").startswith(LM_HEADS)}
    return path, config["model"], state, ckpt.get("tokenizer")


def init_tokenizer(init_from: str) -> str | None:
    """The tokenizer of an attnlab LM checkpoint (masked or causal) or of hf:<weights>."""
    from attnlab.transfer import hf

    if hf.is_hf(init_from):
        return hf.read_tokenizer(init_from)
    path = find_checkpoint(init_from, "model.init_from", WHAT[MLM_TARGET])
    return load_checkpoint(path, "model.init_from").get("tokenizer")


def _summarize(keys: list[str], limit: int = 8) -> str:
    grouped = list(dict.fromkeys(re.sub(r"^(blocks\.\d+)\..*", r"\1.*", k) for k in keys))
    return ", ".join(grouped[:limit]) + (f" (and {len(grouped) - limit} more)" if len(grouped) > limit else "")


SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "ffn", "ffn_mult", "norm", "norm_position", "positional", "bias",
              "max_length", "block_size", "norm_eps", "type_vocab_size")


def load_mlm_encoder(net: nn.Module, init_from: str) -> list[str]:
    """Copy a masked-LM checkpoint's encoder into `net` (attnlab.nn.bert.BertClassifier), or a causal LM's decoder
    into attnlab.nn.gpt.GPTClassifier, or hf:<weights> into either. Returns the keys left at their initialization
    (segment embeddings, pooler, classifier)."""
    from attnlab.nn.bert import BertEncoder
    from attnlab.transfer import hf

    own_new = ("segment.", "pooler.", "classifier.")
    if hf.is_hf(init_from):
        return hf.load_into(net, init_from, keep_new=own_new)
    path, mlm_cfg, state, _ = read_mlm(init_from, MLM_TARGET if isinstance(net, BertEncoder) else LM_TARGET)
    target = net.state_dict()
    pos, own = state.get("embed.pos.wpe.weight"), target.get("embed.pos.wpe.weight")
    if pos is not None and own is not None and pos.shape[0] > own.shape[0] and pos.shape[1] == own.shape[1]:
        state["embed.pos.wpe.weight"] = pos[: own.shape[0]]  # learned positions: the first max_length rows
        log.info("model.init_from: the positional table's first %d of %d positions are used", own.shape[0],
                 pos.shape[0])
    unexpected = [k for k in state if k not in target]
    missing = [k for k in target if k not in state and not k.startswith(own_new)]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(target[k].shape)}"
              for k in state if k in target and state[k].shape != target[k].shape]
    if unexpected or missing or shapes:
        settings = ", ".join(f"model.{k}={mlm_cfg[k]}" for k in SHAPE_KEYS if k in mlm_cfg)
        problems = [f"keys of the checkpoint the classifier lacks: {_summarize(unexpected)}" if unexpected else "",
                    f"keys of the classifier the checkpoint lacks: {_summarize(missing)}" if missing else "",
                    f"shapes that differ (checkpoint vs classifier): {_summarize(shapes, 6)}" if shapes else ""]
        raise UserError(f"model.init_from={path}: the pretrained network does not match the classifier's — "
                        + "; ".join(p for p in problems if p)
                        + f". Build the classifier like the encoder: {settings}.")
    net.load_state_dict(state, strict=False)
    left = sorted(set(target) - set(state))
    log.info("model.init_from: loaded the pretrained network of %s (%d tensors); newly initialized: %s", path,
             len(state), _summarize(left))
    return left
