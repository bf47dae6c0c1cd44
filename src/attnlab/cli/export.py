"""python export.py ckpt_path=<path|last> format=safetensors|hf

A checkpoint's network, written into the output folder: format=hf (BERT and GPT checkpoints) as a folder that
transformers' `from_pretrained` loads; format=safetensors (any task) as `model.safetensors`, a `config.json` with the
registered network and its settings (`attnlab.nn.registry.create_network(config["net"], config["settings"])[0]`
rebuilds it, `safetensors.torch.load_model` fills it), and the tokenizer(s) the checkpoint carries."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from attnlab.cli.command_line import entry_point


FORMATS = ("safetensors", "hf")


def export(cfg: DictConfig) -> Path:
    import inspect

    from safetensors.torch import save_model

    from attnlab.cli import builders
    from attnlab.checkpoints.resume import read_run_metadata
    from attnlab.cli.app import begin
    from attnlab.errors import UserError
    from attnlab.nn.registry import network_settings
    from attnlab.protocols import task as task_hooks

    begin(cfg)
    fmt = str(cfg.get("format"))
    if fmt not in FORMATS:
        raise UserError(f"format={fmt} is not an export format attnlab writes: use {' or '.join(FORMATS)}.")
    ckpt = builders.required_checkpoint(cfg, "export.py")
    meta = read_run_metadata(ckpt)
    model = builders.load_task(ckpt, meta)
    net = task_hooks.network(model)
    if net is None:
        raise UserError(f"export.py writes a task's network (its `net` attribute); {type(model).__qualname__} has "
                        "none. Keep the network in `self.net`, or export the checkpoint's state_dict yourself.")
    hparams = dict(model.hparams)
    name = hparams.get("net")
    if name is None:  # a task whose network has a default name (checkpoints from before `net`)
        param = inspect.signature(type(model).__init__).parameters.get("net")
        name = param.default if param is not None and param.default is not param.empty else None
    known = network_settings(name) if isinstance(name, str) else {}
    settings = {k: hparams[k] for k in known if k in hparams}
    out = Path(cfg.paths.output_dir)
    if fmt == "hf":
        from attnlab.transfer.hf_export import export_hf

        written = export_hf(model, out)
        print(f"exported {ckpt} ({type(net).__name__}) for transformers' from_pretrained: "
              + ", ".join(str(p) for p in written), flush=True)
        return out
    out.mkdir(parents=True, exist_ok=True)
    save_model(net, str(out / "model.safetensors"), metadata={"format": "pt", "attnlab_net": str(name)})
    config = {"task": meta["config"]["model"]["_target_"], "net": name, "settings": settings}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
    written = [out / "model.safetensors", out / "config.json"]
    for key, text in task_hooks.tokenizers(model).items():
        data = json.loads(text)
        (out / f"{key}.json").write_text(json.dumps(data.get("tokenizer", data)))
        written.append(out / f"{key}.json")
    print(f"exported {ckpt} ({type(net).__name__}, {sum(p.numel() for p in net.parameters()):,} parameters): "
          + ", ".join(str(p) for p in written), flush=True)
    return out


# the `export.py` script and the `attnlab-export` command: main(), then the process ends without teardown
main, run = entry_point("export", export)
