"""predict.py for translation: translates `text` or each line of the file `input`, printing the translations."""

from __future__ import annotations

import logging

import torch

from attnlab.cli.predict import text_lines
from attnlab.errors import UserError

log = logging.getLogger("attnlab")


def predict(model, cfg, run_cfg) -> list[str]:
    if model.tokenizers is None:
        raise UserError("this checkpoint holds no tokenizers: retrain with attnlab's translation data.")
    lines = text_lines(cfg, "a translation model")
    model.decode_cfg |= {k: v for k, v in dict(cfg.get("decode") or {}).items() if v is not None}
    src_tok = model.tokenizers[0]
    clean = _legacy_cleaning(src_tok, run_cfg)
    trained = ((run_cfg or {}).get("data") or {}).get("max_length")  # sentences were cut there in training
    limit = min(int(trained or 10**9), getattr(model.net.config, "max_len", 10**9))
    batch, out = int(cfg.get("batch_size") or 64), []
    for start in range(0, len(lines), batch):
        texts = [clean(t.strip()) for t in lines[start : start + batch]]
        encoded = [src_tok.encode(t) for t in texts]
        for n, e in enumerate(encoded):
            if len(e) > limit - 1:
                log.warning("line %d is %d tokens, longer than the model reads (%d): its end is left out",
                            start + n + 1, len(e), limit - 1)
        ids = [e[: limit - 1] + [model.hparams.eos_id] for e in encoded]
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(i) for i in ids], batch_first=True,
                                              padding_value=model.hparams.pad_id).to(model.device)
        with torch.inference_mode():
            hyps = model.translate(src)
        for hyp in hyps:
            print(hyp, flush=True)
        out.extend(hyps)
    return out


def _legacy_cleaning(tokenizer, run_cfg):
    """The cleaning a source line gets before it is encoded: none where the tokenizer normalizes itself (lowercasing,
    Unicode normalization), else the cleaning its run's data config names."""
    from attnlab.data.translation.parallel_text import clean_text

    if getattr(tokenizer, "normalizes", True) or run_cfg is None:
        return lambda text: text
    data = run_cfg.get("data") or {}
    return lambda text: clean_text(text, bool(data.get("lowercase")), data.get("normalize"))
