"""The encoder of a masked-LM pretraining run (model=bert_*) into attnlab's BERT classifier, for fine-tuning and
linear probing (`model=bert_classifier model.init_from=<its checkpoint or run folder>`). The MLM head is dropped;
the tokenizer comes from the checkpoint, so the classifier reads text with the vocabulary its encoder learned."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.checkpoints import find_checkpoint, read_checkpoint, run_config
from attnlab.errors import UserError

log = logging.getLogger("attnlab")

MLM_TARGET = "attnlab.tasks.language_model.MaskedLM"
MLM_HEAD = ("head_dense.", "head_norm.", "decoder.", "decoder_bias")
WHAT = "a BERT masked-LM pretraining run (`python train.py experiment=bert_sst2_mlm`, or any run with model=bert_*)"


def read_mlm(init_from: str) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor], str | None]:
    """-> (the checkpoint's path, its model config, the encoder's state dict, the tokenizer as JSON)."""
    path = find_checkpoint(init_from, "model.init_from", WHAT)
    ckpt = read_checkpoint(path, "model.init_from")
    config = run_config(ckpt) or {}
    target = config.get("model", {}).get("_target_")
    if target != MLM_TARGET:
        what = f"a checkpoint of task {target}" if target else "not a checkpoint written by attnlab's train.py"
        hint = (" A GPT is a decoder: fine-tune it with model=gpt_classifier." if target and "CausalLM" in target
                else "")
        raise UserError(f"model.init_from={path} is {what}, not of a masked-LM run: the BERT classifier starts from "
                        f"{WHAT}.{hint} To continue training a classifier from its own checkpoint use ckpt_path= "
                        "instead.")
    state = {k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()
             if k.startswith("net.") and not k.removeprefix("net.").startswith(MLM_HEAD)}
    return path, config["model"], state, ckpt.get("tokenizer")


def init_tokenizer(init_from: str) -> str | None:
    return read_mlm(init_from)[3]


def _summarize(keys: list[str], limit: int = 8) -> str:
    grouped = list(dict.fromkeys(re.sub(r"^(blocks\.\d+)\..*", r"\1.*", k) for k in keys))
    return ", ".join(grouped[:limit]) + (f" (and {len(grouped) - limit} more)" if len(grouped) > limit else "")


SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "ffn", "ffn_mult", "norm", "norm_position", "positional", "bias",
              "max_length")


def load_mlm_encoder(net: nn.Module, init_from: str) -> list[str]:
    """Copy a masked-LM checkpoint's encoder into `net` (attnlab.nn.bert.BertClassifier). Returns the keys left at
    their initialization (segment embeddings, pooler, classifier)."""
    path, mlm_cfg, state, _ = read_mlm(init_from)
    target = net.state_dict()
    pos, own = state.get("embed.pos.wpe.weight"), target.get("embed.pos.wpe.weight")
    if pos is not None and own is not None and pos.shape[0] > own.shape[0] and pos.shape[1] == own.shape[1]:
        state["embed.pos.wpe.weight"] = pos[: own.shape[0]]  # learned positions: the first max_length rows
        log.info("model.init_from: the positional table's first %d of %d positions are used", own.shape[0],
                 pos.shape[0])
    own_new = ("segment.", "pooler.", "classifier.")
    unexpected = [k for k in state if k not in target]
    missing = [k for k in target if k not in state and not k.startswith(own_new)]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(target[k].shape)}"
              for k in state if k in target and state[k].shape != target[k].shape]
    if unexpected or missing or shapes:
        settings = ", ".join(f"model.{k}={mlm_cfg[k]}" for k in SHAPE_KEYS if k in mlm_cfg)
        problems = [f"keys of the checkpoint the classifier lacks: {_summarize(unexpected)}" if unexpected else "",
                    f"keys of the classifier the checkpoint lacks: {_summarize(missing)}" if missing else "",
                    f"shapes that differ (checkpoint vs classifier): {_summarize(shapes, 6)}" if shapes else ""]
        raise UserError(f"model.init_from={path}: the masked-LM encoder does not match the classifier's network — "
                        + "; ".join(p for p in problems if p)
                        + f". Build the classifier like the encoder: {settings}.")
    net.load_state_dict(state, strict=False)
    left = sorted(set(target) - set(state))
    log.info("model.init_from: loaded the masked-LM encoder of %s (%d tensors); newly initialized: %s", path,
             len(state), _summarize(left))
    return left
