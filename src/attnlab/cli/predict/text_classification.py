"""predict.py for text classifiers: the label of `text` (and its probability), or the score of a regression
(STS-B's similarity), printed; or of each line of `input` (a text file; a pair per line as `a<TAB>b` for pair
tasks), written to predictions.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from attnlab.data.text.classification import PadBatch, join_texts
from attnlab.data.text.tokenizers import PAD
from attnlab.cli.predict import text_lines
from attnlab.errors import UserError
from attnlab.protocols.data import Target


def predict(model, cfg, run_cfg) -> list[dict]:
    tok = model.tokenizer
    if tok is None:
        raise UserError("this checkpoint holds no tokenizer: retrain with attnlab's text classification data.")
    lines = [t for t in text_lines(cfg, "a text classifier", "example (a<TAB>b for pairs)") if t.strip()]
    examples = []
    for line in lines:
        ids, segments = join_texts(tok, [tok.encode(part.strip()) for part in line.split("\t")[:2]],
                                   int(model.hparams.max_length))
        examples.append({"ids": ids, "segments": segments, "label": 0, "text": line})
    collate, batch_size, rows = PadBatch(tok.token_to_id(PAD)), int(cfg.get("batch_size") or 64), []
    with torch.inference_mode():
        for start in range(0, len(examples), batch_size):
            batch = collate(examples[start:start + batch_size])
            logits = model(*(batch[k].to(model.device) for k in ("input_ids", "attention_mask", "token_type_ids")))
            chunk = examples[start:start + batch_size]
            if model.target is Target.SCORES:
                for ex, score in zip(chunk, model.predictions(logits.float()).tolist()):
                    rows.append({"text": ex["text"], "score": score})
                    print(f"{score:.3f}: {ex['text']}", flush=True)
                continue
            probs, labels = logits.float().softmax(-1).max(-1)
            for ex, p, i in zip(chunk, probs.tolist(), labels.tolist()):
                rows.append({"text": ex["text"], "label": model.class_names[i], "probability": p})
                print(f"{model.class_names[i]} ({p:.3f}): {ex['text']}", flush=True)
    if cfg.get("input"):
        out = Path(cfg.paths.output_dir) / "predictions.csv"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["text", "label", "probability"])
            w.writeheader()
            w.writerows(rows)
        print(f"{len(rows)} prediction(s) written to {out}", flush=True)
    return rows
