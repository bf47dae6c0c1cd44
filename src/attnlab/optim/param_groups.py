"""Split parameters into a decayed and a non-decayed group, optionally per layer with layer-wise lr decay.

No decay on biases and other 1-d parameters (norm scales), on embedding tables, and on whatever a timm-style
model names in `no_weight_decay()` (positional embeddings, class tokens, ...).

Layer-wise lr decay (BEiT's param_groups_lrd, used by MAE fine-tuning): the network's layers are numbered by timm's
`group_matcher()` (for a ViT: 0 = patch embedding, class token and positional embedding, i + 1 = blocks.i,
depth + 1 = the final norm and the head), and each group gets `lr_scale = layer_decay ** (num_layers - 1 - layer_id)`:
1 for the head, layer_decay for the last block, and the smallest scale for the embeddings.
"""

from __future__ import annotations

from torch import nn

from attnlab.errors import UserError


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """Full names of the parameters that the model's own `no_weight_decay()` hooks list."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        hook = getattr(module, "no_weight_decay", None)
        if callable(hook):
            names.update(f"{prefix}.{n}" if prefix else n for n in hook())
    return names


def layer_ids(model: nn.Module) -> tuple[dict[str, int], int]:
    """-> ({full parameter name: layer id}, number of layers) from the first submodule with timm's group_matcher();
    parameters it does not name (the final norm and the head) get the last layer."""
    from timm.models import group_parameters

    for prefix, module in model.named_modules():
        matcher = getattr(module, "group_matcher", None)
        if callable(matcher):
            ids = group_parameters(module, matcher(coarse=False), reverse=True)
            # timm numbers a token-pooled ViT's final norm with the last block: it trains with the head at the full
            # lr instead, as in BEiT's and MAE's recipes
            top = max(ids.values())
            ids = {n: top if n.startswith(("norm.", "fc_norm.")) else i for n, i in ids.items()}
            pre = f"{prefix}." if prefix else ""
            return {pre + n: i for n, i in ids.items()}, top + 1
    raise UserError(
        "optimizer.layer_decay needs a network whose layers can be numbered from the input up: a timm model with "
        "group_matcher(), such as a ViT (model=vit with a timm vit_* backbone). This model has none: remove "
        "optimizer.layer_decay (or set it to null)."
    )


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """Decay / no-decay groups; with `layer_decay`, one pair per layer, each with its `lr_scale`."""
    skip = no_weight_decay_names(model)
    ids, num_layers = layer_ids(model) if layer_decay is not None else ({}, 1)
    groups: dict[tuple[int, bool], list] = {}
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            no_decay = p.ndim <= 1 or isinstance(module, nn.Embedding) or any(full.endswith(s) for s in skip)
            groups.setdefault((ids.get(full, num_layers - 1), not no_decay), []).append(p)
    if layer_decay is None:
        out = [{"params": groups.get((0, True), []), "weight_decay": weight_decay}]
        if groups.get((0, False)):
            out.append({"params": groups[(0, False)], "weight_decay": 0.0})
        return out
    return [{"params": params, "weight_decay": weight_decay if decay else 0.0,
             "lr_scale": layer_decay ** (num_layers - 1 - layer), "layer_id": layer}
            for (layer, decay), params in sorted(groups.items(), key=lambda kv: (kv[0][0], not kv[0][1]))]
