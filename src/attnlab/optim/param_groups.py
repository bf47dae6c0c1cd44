"""Split parameters into a decayed and a non-decayed group.

No decay on biases and other 1-d parameters (norm scales), on embedding tables, and on whatever a timm-style
model names in `no_weight_decay()` (positional embeddings, class tokens, ...).
"""

from __future__ import annotations

from torch import nn


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """Full names of the parameters that the model's own `no_weight_decay()` hooks list."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        hook = getattr(module, "no_weight_decay", None)
        if callable(hook):
            names.update(f"{prefix}.{n}" if prefix else n for n in hook())
    return names


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    skip = no_weight_decay_names(model)
    decay, no_decay, seen = [], [], set()
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if p.ndim <= 1 or isinstance(module, nn.Embedding) or any(full.endswith(s) for s in skip):
                no_decay.append(p)
            else:
                decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups
