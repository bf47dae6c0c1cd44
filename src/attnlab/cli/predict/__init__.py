"""python predict.py ckpt_path=<path|last> [input=<file|folder>] [text=...] [prompt=...]

The checkpoint names its task; the task's predictor does the rest: `attnlab.cli.predict.<task module>.predict(model,
cfg, run_cfg)` for attnlab's tasks (one module per task module, next to this one), or the dotted path in a task
class's `predictor` attribute (a user's own LightningModule)."""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from attnlab.cli.command_line import entry_point


FREE_TEXT = ("text", "prompt")


def quote_free_text(argv: list[str]) -> list[str]:
    """`text=Ein Mann fährt Fahrrad.` as the shell passes it (quotes gone) is not a valid Hydra value (spaces,
    non-ASCII letters, punctuation): quote the free-text options so any sentence or prompt goes through."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        quoted = value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1
        if sep and key.lstrip("+~") in FREE_TEXT and not quoted:
            value = "'" + value.replace("'", "\\'") + "'"
            arg = f"{key}={value}"
        out.append(arg)
    return out


def text_lines(cfg: DictConfig, model_kind: str, per_line: str = "sentence") -> list[str]:
    """The texts a text model predicts for: `text="..."`, or the lines of the file `input`."""
    from pathlib import Path

    from attnlab.errors import UserError

    if cfg.get("text"):
        return [str(cfg.text)]
    if not cfg.get("input"):
        raise UserError(f'predict.py for {model_kind} needs text="a sentence" or input=<file with one {per_line} '
                        "per line>.")
    path = Path(str(cfg.input)).expanduser()
    if not path.is_file():
        raise UserError(f"input={path} does not exist: give a text file with one {per_line} per line, or "
                        'text="a sentence".')
    return path.read_text(encoding="utf-8").splitlines()


def predictor_for(task_cls: type) -> Callable:
    """The predict function of a task class: its `predictor` (a dotted path), else attnlab's module of that name."""
    from attnlab.errors import UserError

    from attnlab.protocols import task as task_hooks

    path = task_hooks.predictor(task_cls)
    if path is None and task_cls.__module__.startswith("attnlab.tasks."):
        path = f"{__name__}.{task_cls.__module__.rsplit('.', 1)[1]}.predict"
    if path is None:
        raise UserError(f"predict.py does not know how {task_cls.__qualname__} predicts: give the class a `predictor` "
                        "attribute, the dotted path of a function `predict(model, cfg, run_cfg)` (e.g. "
                        "predictor = \"mypkg.predict.run\"), or use its own code to predict.")
    from hydra.utils import get_method

    return get_method(path)


def predict(cfg: DictConfig):
    import torch
    from omegaconf import OmegaConf

    from attnlab.cli import builders
    from attnlab.checkpoints.resume import read_run_metadata
    from attnlab.errors import UserError

    from attnlab.cli.app import begin
    from attnlab.devices import uses_gpu

    begin(cfg)
    ckpt = builders.required_checkpoint(cfg, "predict.py")
    device = str(cfg.get("device", "auto"))
    if device == "auto":
        device = "cuda" if uses_gpu("auto") else "cpu"
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={device}, but this machine has no CUDA GPU visible to PyTorch: use device=cpu "
                        "(or device=auto, which takes a GPU when there is one).")
    meta = read_run_metadata(ckpt)
    model = builders.load_task(ckpt, meta)
    model = model.to(device).eval()
    return predictor_for(type(model))(model, cfg, OmegaConf.create(meta["config"]))


# the `predict.py` script and the `attnlab-predict` command: main(), then the process ends without teardown; text="..."
# quoted as the user typed it, whatever it holds
main, run = entry_point("predict", predict, prepare=quote_free_text)
