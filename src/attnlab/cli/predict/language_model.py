"""predict.py for language models: a GPT continues `prompt` (streamed to stdout); a masked LM fills each [MASK] of
`text` with its top_k tokens."""

from __future__ import annotations

import torch

from attnlab.data.text.tokenizers import CLS, MASK, SEP, TextTokenizer
from attnlab.errors import UserError


def predict(model, cfg, run_cfg):
    if model.tokenizer is None:
        raise UserError("this checkpoint holds no tokenizer: retrain with attnlab's text data.")
    return generate(model, cfg) if model.objective == "causal" else fill_masks(model, cfg)


def generate(model, cfg) -> list[str]:
    """Streams `num_samples` continuations of `prompt` to stdout; returns them."""
    if cfg.get("input") or cfg.get("text"):
        raise UserError('a GPT checkpoint continues a prompt: give prompt="..." (input= and text= are for image, '
                        "translation and masked-LM checkpoints).")
    tok = model.tokenizer
    prompt = cfg.get("prompt")
    if prompt is None:  # start from a newline, as nanoGPT's sample.py, where the tokenizer has one
        prompt = "\n" if _encodes(tok, "\n") else ""
    max_new = int(_given(cfg, "max_new_tokens", 500))
    temperature = float(_given(cfg, "temperature", 0.8))
    top_k = int(_given(cfg, "top_k", 200))
    gen = torch.Generator(device=model.device)
    gen.manual_seed(int(_given(cfg, "seed", 1337)))
    idx = model.prompt_ids(prompt)
    texts = []
    for _ in range(int(_given(cfg, "num_samples", 1))):
        new_ids: list[int] = []
        shown = ""
        print(prompt, end="", flush=True)
        for t in model.net.stream(idx, max_new, temperature, top_k, gen):
            new_ids.append(int(t[0, 0]))
            text = tok.decode(new_ids)
            if not text.endswith("\ufffd"):  # print whole characters only (byte-level BPE)
                print(text[len(shown):], end="", flush=True)
                shown = text
        print(tok.decode(new_ids)[len(shown):], flush=True)
        print("---------------", flush=True)
        texts.append(prompt + tok.decode(new_ids))
    return texts


def fill_masks(model, cfg) -> list[list[tuple[str, float]]]:
    """The top_k fills of each [MASK] in `text`, printed; returns [(token, probability), ...] per mask."""
    from attnlab.tasks.language_model import show_tokens

    tok = model.tokenizer
    text = cfg.get("text")
    if not text or MASK not in text:
        raise UserError(f'predict.py for a masked LM needs text="... {MASK} ..." with at least one {MASK} '
                        "where a token should be filled in.")
    mask_id = tok.special_id(MASK, "predict.py")
    ids = [tok.special_id(CLS, "predict.py")]
    for j, piece in enumerate(text.split(MASK)):
        if j:
            ids.append(mask_id)
        ids.extend(tok.encode(piece) if piece.strip() or tok.kind == "char" else [])
    ids.append(tok.special_id(SEP, "predict.py"))
    if len(ids) > model.max_positions:
        raise UserError(f"text= is {len(ids)} tokens with [CLS] and [SEP], but this model reads at most "
                        f"{model.max_positions} (model.max_length): give a shorter text.")
    x = torch.tensor([ids], device=model.device)
    with torch.inference_mode():
        probs = model(x, torch.ones_like(x)).float().softmax(-1)[0]  # (T, V)
    k = int(_given(cfg, "top_k", 5))
    fills, best = [], list(ids)
    for pos in (x[0] == mask_id).nonzero().flatten().tolist():
        p, i = probs[pos].topk(k)
        fills.append([(tok.id_to_token(t), float(q)) for t, q in zip(i.tolist(), p.tolist())])
        best[pos] = i[0].item()
        print(f"{MASK} #{len(fills)}: " + "  ".join(f"{r + 1}. {t!r} {q:.3f}" for r, (t, q) in enumerate(fills[-1])),
              flush=True)
    print(f"filled: {show_tokens(tok, best[1:-1])}", flush=True)
    return fills


def _given(cfg, key: str, default):
    """cfg[key] unless it is missing or null (0 is a value)."""
    value = cfg.get(key)
    return default if value is None else value


def _encodes(tok: TextTokenizer, text: str) -> bool:
    try:
        return bool(tok.encode(text))
    except UserError:
        return False
