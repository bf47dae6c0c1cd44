"""`export.py format=hf`: a BERT or GPT checkpoint as a folder `transformers` loads with `from_pretrained`
(`config.json`, `model.safetensors`, `tokenizer.json` + `tokenizer_config.json`), through the key tables of
attnlab.transfer.hf."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from attnlab.data.text.tokenizers import CLS, EOT, MASK, PAD, SEP, UNK
from attnlab.errors import UserError
from attnlab.transfer.hf import table

HF_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
LAYOUT = {"bert": {"positional": "learned", "norm": "layernorm", "norm_position": "post"},
          "gpt2": {"positional": "learned", "norm": "layernorm", "norm_position": "pre"}}


def _architecture(net: torch.nn.Module) -> tuple[str, str]:
    from attnlab.nn.bert import BertClassifier, BertMLM
    from attnlab.nn.gpt import GPT, GPTClassifier

    for cls, family, arch in ((BertMLM, "bert", "BertForMaskedLM"),
                              (BertClassifier, "bert", "BertForSequenceClassification"),
                              (GPTClassifier, "gpt2", "GPT2ForSequenceClassification"),
                              (GPT, "gpt2", "GPT2LMHeadModel")):
        if isinstance(net, cls):
            return family, arch
    raise UserError(f"format=hf writes BERT and GPT checkpoints (model=bert_*, bert_classifier, gpt*, "
                    f"gpt_classifier) in transformers' layout; this checkpoint's network is {type(net).__name__}. "
                    "Use format=safetensors, which writes any task's network.")


def export_hf(model: Any, out: Path) -> list[Path]:
    net = model.net
    family, arch = _architecture(net)
    c = net.config
    wrong = {k: getattr(c, k) for k, v in LAYOUT[family].items() if getattr(c, k) != v}
    if c.ffn not in HF_ACT:
        wrong["ffn"] = c.ffn
    if wrong:
        layout = ", ".join(f"{k}={v}" for k, v in LAYOUT[family].items())
        raise UserError(f"format=hf: transformers' {arch} computes {layout} with ffn one of {', '.join(HF_ACT)}; "
                        f"this model has {', '.join(f'model.{k}={v}' for k, v in wrong.items())}, "
                        "which it cannot express. Use format=safetensors (attnlab's own layout), or train with those "
                        "settings.")
    ours = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    V = c.vocab_size
    for key in ("embed.wte.weight", "lm_head.weight"):
        if key in ours:
            ours[key] = ours[key][:V]  # a vocabulary padded for speed: the real rows
    rows = table(family, c.n_layer)
    state = _to_hf(ours, rows, c)
    if family == "bert" and "cls.predictions.bias" in state:
        state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    config = _config(family, arch, c, model)
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out / "model.safetensors", out / "config.json", *_tokenizer(model, family, out)]


def _to_hf(ours: dict[str, torch.Tensor], rows: list, c) -> dict[str, torch.Tensor]:
    """attnlab tensors under transformers' keys; what attnlab leaves out (biases of a bias-free network, BERT's
    token-type table of a network trained without one) written as zeros, which computes the same."""
    state: dict[str, torch.Tensor] = {}
    for o, theirs, how in rows:
        t = ours.get(o)
        if how == "qkv":
            weight = ours.get(o.replace(".bias", ".weight"))
            if weight is None:
                continue
            parts = t.chunk(3, dim=0) if t is not None else [torch.zeros(c.n_embd)] * 3
            state |= {k: p.clone() for k, p in zip(theirs, parts)}
        elif t is not None:
            state[theirs] = (t.t() if how == "T" else t).clone()
        elif o.endswith(".bias") and o.replace(".bias", ".weight") in ours:
            state[theirs] = torch.zeros(ours[o.replace(".bias", ".weight")].shape[0])
        elif o == "segment.weight":
            state[theirs] = torch.zeros(2, c.n_embd)
    if "lm_head.weight" not in state and "transformer.wte.weight" in state and "score.weight" not in state:
        state["lm_head.weight"] = state["transformer.wte.weight"].clone()  # tied
    if "cls.predictions.transform.dense.weight" in state and "cls.predictions.decoder.weight" not in state:
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
    return state


def _config(family: str, arch: str, c, model) -> dict[str, Any]:
    tok = getattr(model, "tokenizer", None)
    ids = {name: tok.token_to_id(t) for name, t in (("pad_token_id", PAD), ("eos_token_id", EOT))} if tok else {}
    labels = {}
    if arch.endswith("SequenceClassification"):
        names = list(getattr(model, "class_names", None) or range(c.num_classes))
        labels = {"id2label": {str(i): str(n) for i, n in enumerate(names)},
                  "label2id": {str(n): i for i, n in enumerate(names)}}
    if family == "bert":
        return {"architectures": [arch], "model_type": "bert", "vocab_size": c.vocab_size,
                "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
                "intermediate_size": int(c.ffn_mult * c.n_embd), "hidden_act": HF_ACT[c.ffn],
                "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.dropout,
                "max_position_embeddings": c.max_length, "type_vocab_size": max(2, c.type_vocab_size),
                "layer_norm_eps": c.norm_eps or 1e-5, "initializer_range": 0.02, "position_embedding_type": "absolute",
                "pad_token_id": ids.get("pad_token_id") or 0, "tie_word_embeddings": c.tie_weights, **labels}
    eos = ids.get("eos_token_id")
    return {"architectures": [arch], "model_type": "gpt2", "vocab_size": c.vocab_size, "n_positions": c.block_size,
            "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": int(c.ffn_mult * c.n_embd),
            "activation_function": HF_ACT[c.ffn], "resid_pdrop": c.dropout, "embd_pdrop": c.dropout,
            "attn_pdrop": c.dropout, "layer_norm_epsilon": c.norm_eps or 1e-5, "initializer_range": 0.02,
            "tie_word_embeddings": c.tie_weights, "bos_token_id": eos, "eos_token_id": eos,
            "pad_token_id": eos if eos is not None else 0, **labels}


def _tokenizer(model, family: str, out: Path) -> list[Path]:
    """tokenizer.json (with BERT's [CLS] a [SEP] template, which attnlab's data adds itself) and
    tokenizer_config.json; a character tokenizer has no transformers equivalent and is left out."""
    text = getattr(model, "tokenizer_json", None)
    data = json.loads(text) if text else {}
    if "tokenizer" not in data:
        print("format=hf: this checkpoint's tokenizer is attnlab's character tokenizer, which transformers has no "
              "class for: the folder holds the weights and config only (format=safetensors keeps the tokenizer).")
        return []
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_str(json.dumps(data["tokenizer"]))
    specials: dict[str, str] = {}
    if family == "bert" and tok.token_to_id(CLS) is not None and tok.token_to_id(SEP) is not None:
        cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}", pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, cls_id), (SEP, sep_id)])
        specials = {"cls_token": CLS, "sep_token": SEP, "pad_token": PAD, "mask_token": MASK, "unk_token": UNK,
                    "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}
    elif tok.token_to_id(EOT) is not None:
        specials = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    specials = {k: v for k, v in specials.items() if not isinstance(v, str) or tok.token_to_id(v) is not None}
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": getattr(model.net.config, "max_length",
                                                                                  None) or model.net.config.block_size,
         **specials}, indent=2) + "\n")
    return [out / "tokenizer.json", out / "tokenizer_config.json"]
