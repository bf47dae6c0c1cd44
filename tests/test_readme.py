"""Every command in the bash blocks of README.md and docs/*.md, run as written with a few steps appended, so that a
documented command cannot silently break. Each block runs in order in a fresh folder (a later command uses the runs
of earlier ones: `ckpt_path=last`, `<run>/checkpoints/last.ckpt`), on the small made-up datasets (tests/fixtures.py).
Commands marked [SLURM] or [multi-node] (and nothing else) run for real: sbatch, srun and launcher=slurm on a real
two-node SLURM cluster on this machine (tools/slurm-cluster.sh), apart from the block's other commands, and torchrun's
agents side by side; those another test runs as the page shows them (ELSEWHERE) compose here. Commands marked [GPU], [ImageNet], [W&B account] or [network] need what this machine lacks:
their configs are composed instead. `python train.py|eval.py|predict.py` runs in-process through the entry points'
own functions (start-up would dominate otherwise), and with Hydra's flags (`-m`, `--config-dir`, `--rerun`) through
the script's own `main()`; `--cfg` (which imports no torch), `attnlab.compare` and the benchmarks run in new
processes. README.md is the front door: at most 300 lines; every relative link of these pages leads to a file (and
heading) that exists."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict
from PIL import Image

from attnlab.config import CONF_DIR
from conftest import ROOT, run_here
from fixtures import caption_pairs

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the pages whose bash blocks are run
README_MAX_LINES = 300
MARKS = ("GPU", "ImageNet", "multi-node", "SLURM", "W&B account", "network")
CLUSTER_MARKS = {"SLURM", "multi-node"}  # what the tests' real SLURM cluster gives (GPUs it does not)
# commands another test runs for real as the page shows them (conftest.docs_command): (page, how the command starts)
# -> that test's file; here their config composes, as for the [GPU] ones
ELSEWHERE = {
    ("docs/clusters.md", "sbatch -N 2 --ntasks-per-node=1 "): "test_multinode_launch.py",
    ("docs/clusters.md", "torchrun --nnodes 2 --node-rank "): "test_multinode_launch.py",
    ("docs/sweeps.md", "python train.py -m launcher=slurm hparams_search="): "test_slurm_sweeps.py",
}
MARK = re.compile(r"\[(" + "|".join(re.escape(m) for m in MARKS) + r")\]")
ENTRY = {"train.py": "train", "eval.py": "eval", "predict.py": "predict", "export.py": "export",
         "attnlab.train": "train", "attnlab.eval": "eval", "attnlab.predict": "predict"}
# a few steps of each run: train.py gets these (what a key the config lacks would need is left out)
TRAIN_BUDGET = {"trainer.max_steps": 2, "trainer.limit_train_batches": 2, "trainer.limit_val_batches": 1,
                "trainer.limit_test_batches": 1, "trainer.num_sanity_val_steps": 0, "data.num_workers": 0}
EVAL_BUDGET = {"trainer.limit_test_batches": 1, "trainer.limit_val_batches": 1}
BENCHMARK_BUDGET = {
    "classification_overhead.py": ["--epochs", "2", "--repeats", "1", "trainer.limit_train_batches=2"],
    "mt_multi30k.py": ["--out", "{cwd}/benchmark", "--only", "mt_transformer", "--epochs", "1", "--limit-train-batches", "2",
                       "trainer.limit_val_batches=1", "trainer.limit_test_batches=1"],
    "memory_estimate.py": ["--steps", "3", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "--only",
                          "vit_default"],
    "mae_cifar10.py": ["--out", "{cwd}/benchmark", "--pretrain-epochs", "1", "--finetune-epochs", "1", "trainer.limit_train_batches=2",
                       "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "data.num_workers=0"],
    "unet_membrane.py": ["trainer.max_epochs=1", "data.samples_per_epoch=8", "data.image_size=128",
                         "trainer.limit_val_batches=1", "trainer.limit_test_batches=1"],
    "optuna_pruning.py": ["--out", "{cwd}/benchmark", "--epochs", "2", "--smoke", "--trials", "4",
                          "trainer.limit_train_batches=8",
                          "trainer.limit_val_batches=2", "trainer.limit_test_batches=1"],
    "gpt2_gpu.py": [],      # [GPU] only
    "gpu_decode.py": [],    # [GPU] only
    "vision_gpu.py": ["--images", "24"],
    "imagenet_loader.py": ["--images", "24", "--batch", "4", "--workers", "0", "--rounds", "1",
                           "--root", "{cwd}/loader_benchmark"],
    # --tiny in the README (gpu_check.sh is its [GPU] run); the vision and ddp rows' train.py paths have their own
    # tests (test_train.py, test_cli.py): here the script's table, one train.py run and the loader
    "gpu_check.py": ["--repeats", "1", "--images", "24", "--only", "gpt", "loader"],
    "gpu_check.sh": [],
    "shards.py": ["--images", "40", "--rounds", "1", "--batch", "8", "--workers", "0", "--pipelines", "read",
                  "--root", "{cwd}/shards_benchmark"],
}


@dataclass
class Command:
    page: str  # README.md, docs/translation.md
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def marked(self) -> list[str]:
        return MARK.findall(self.text)

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    @property
    def on_cluster(self) -> bool:
        """Marked [SLURM] or [multi-node] only: run for real, on the SLURM cluster of tools/slurm-cluster.sh (two CPU
        nodes), or as torchrun's agents side by side on this machine."""
        return bool(self.marked) and set(self.marked) <= CLUSTER_MARKS

    @property
    def elsewhere(self) -> bool:
        """Run for real by tests/test_multinode_launch.py, as the page shows it."""
        return any(self.page == page and self.text.startswith(start) for page, start in ELSEWHERE)

    @property
    def needs_slurm(self) -> bool:
        """Run on the SLURM cluster: sbatch, srun or launcher=slurm."""
        return self.on_cluster and not self.elsewhere and (self.argv[0] in ("sbatch", "srun")
                                                            or "launcher=slurm" in self.argv)

    @property
    def reads_a_run(self) -> bool:
        """Whether it uses the runs of the block's earlier commands (Runner.materialize's placeholders, compare)."""
        return bool(re.search(r"<[^>]+>|=\.\.\./|=last\b", self.text)) or "attnlab.compare" in self.text


@dataclass
class Block:
    page: str
    line: int
    commands: list[Command] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def page_blocks(path: Path) -> list[Block]:
    """The ```bash blocks of one page, each with its commands (comment lines left out)."""
    page, blocks, current = page_name(path), [], None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            current = Block(page, n) if current is None and line.strip() == "```bash" else None
            if current is not None:
                blocks.append(current)
            continue
        if current is not None and line.strip() and not line.lstrip().startswith("#"):
            current.commands.append(Command(page, n, line.strip()))
    return blocks


def readme_blocks() -> list[Block]:
    """Every bash block of README.md, then of docs/*.md in name order."""
    return [b for path in PAGES for b in page_blocks(path)]


def on_slurm(block: Block) -> tuple[list[Command], list[Command]]:
    """A block's commands split in two: those run on the SLURM cluster's one test worker (what needs SLURM, and
    what after it reads an earlier run), and the rest, run beside the other tests."""
    first = next((i for i, c in enumerate(block.commands) if c.needs_slurm), len(block.commands))
    slurm = [c for i, c in enumerate(block.commands) if c.needs_slurm or (i > first and c.reads_a_run)]
    return slurm, [c for c in block.commands if c not in slurm]


BLOCKS = readme_blocks()
CLUSTER_BLOCKS = [b for b in BLOCKS if on_slurm(b)[0]]


def test_the_readme_shows_its_commands_in_bash_blocks():
    commands = [c for b in BLOCKS for c in b.commands]
    assert len(commands) >= 40 and all(c.argv for c in commands)
    programs = {c.argv[0] if c.argv[0] != "python" else c.argv[1] for c in commands if "=" not in c.argv[0]}
    assert programs >= {"make", "train.py", "eval.py", "predict.py", "-m", "wandb", "cd"}, programs
    pages = sorted({b.page for b in BLOCKS})
    assert "README.md" in pages and any(p.startswith("docs/") for p in pages), pages


def test_the_commands_run_elsewhere_are_run_there_as_the_page_shows_them():
    shown = [c for b in BLOCKS for c in b.commands if c.elsewhere]
    assert {(p, s) for p, s in ELSEWHERE if any(c.page == p and c.text.startswith(s) for c in shown)} == \
        set(ELSEWHERE), shown
    for (page, start), test in ELSEWHERE.items():
        runs = (ROOT / "tests" / test).read_text()
        assert f'docs_command("{page}", "{start}' in runs or f'docs_command("{page}", f"{start}' in runs, (page, start)


def test_the_readme_is_a_front_door():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move the rest to docs/"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page (fenced code left out)."""
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_relative_link_of_the_pages_leads_to_a_file():
    broken = []
    for path in PAGES:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                linked = (path.parent / file) if file else path
                if not linked.exists():
                    broken.append(f"{page_name(path)}:{n}: {target} (no such file)")
                elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                    broken.append(f"{page_name(path)}:{n}: {target} (no such heading)")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


# ---- running one block


class Runner:
    """Runs a block's commands in order in `cwd`, on the small datasets, with logs under cwd/logs."""

    def __init__(self, cwd: Path, data_dir: Path, monkeypatch):
        self.cwd, self.data_dir, self.last_run = cwd, data_dir, None
        self.pending: list[list[str]] = []  # the torchrun commands of the nodes of one launch, until all are there
        self.env = {"ATTNLAB_DATA_DIR": str(data_dir), "ATTNLAB_LOG_DIR": str(cwd / "logs"),
                    "ATTNLAB_CACHE_DIR": str(cwd / ".cache"), "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline",
                    "WANDB_SILENT": "true"}
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
        monkeypatch.chdir(cwd)
        self.monkeypatch = monkeypatch

    # placeholders of the README, made real: files it names, runs of the block's earlier commands
    def materialize(self, arg: str) -> str:
        key, sep, value = arg.partition("=")
        if not sep:
            return arg
        if "<run>" in value or value.startswith(".../"):
            assert self.last_run is not None, f"{arg}: no earlier run in this block"
            value = str(self.last_run / "checkpoints" / Path(value).name)
        elif "<" in value:  # logs/train/runs/<time>/...: the newest match
            matches = sorted(self.cwd.glob(re.sub(r"<[^>]+>", "*", value)), key=lambda p: p.stat().st_mtime)
            assert matches, f"{arg}: nothing matches"
            value = str(matches[-1])
        elif key in ("input", "data.root") and not Path(value).exists():
            value = self.make_input(value)
        return f"{key}={value}"

    def make_input(self, value: str) -> str:
        path = self.cwd / value.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".de":
            path.write_text("\n".join(caption_pairs(3, seed=5)[0]) + "\n")
        elif path.suffix == ".png":  # a membrane slice
            Image.open(sorted((self.data_dir / "isbi2012_em_membrane" / "image").glob("*.png"))[0]).save(path)
        else:  # a folder of class folders of images
            g = np.random.default_rng(0)
            for c, name in enumerate(("ant", "bee", "cat")):
                (path / name).mkdir(parents=True, exist_ok=True)
                for i in range(8):
                    pixels = (g.random((24, 24, 3)) * 80 + c * 80).astype("uint8")
                    Image.fromarray(pixels).save(path / name / f"{i}.png")
        return str(path)

    def run(self, cmd: Command) -> None:
        argv = cmd.argv
        env_prefix = {}
        while argv and re.match(r"^[A-Z_]+=", argv[0]):
            k, _, v = argv.pop(0).partition("=")
            env_prefix[k] = v
        if argv[0] == "cd":
            self.cwd = ROOT / argv[1]  # the user's folder of the example; runs still go to the block's logs
            self.monkeypatch.chdir(self.cwd)
            return
        if argv[0] == "make":  # make train: test_cli.py; make test: this suite; make install: what it runs in
            assert argv[1] in ("install", "train", "test", "test-fast"), cmd.text
            return
        if argv[0] == "wandb":
            assert cmd.marked, cmd.text
            if argv[1] == "sweep":  # its Hydra side is checked in test_sweeps.py
                assert (ROOT / argv[2]).is_file()
            return
        if cmd.on_cluster and not cmd.elsewhere:
            return self.on_cluster(cmd, argv, env_prefix)
        if argv[0] in ("sbatch", "torchrun") and cmd.marked:  # run for real in test_multinode_launch.py; here: the
            script = next(i for i, a in enumerate(argv) if (ROOT / a).is_file())  # script there, its config composes
            prefix = ["trainer=multinode"] if argv[script].endswith(".sbatch") else []
            return self.compose("train", prefix + argv[script + 1:])
        if argv[0] == "bash" and cmd.marked:  # a [GPU] script: the script is there, that is all
            assert (ROOT / argv[1]).is_file() and Path(argv[1]).name in BENCHMARK_BUDGET, cmd.text
            return
        if argv[0] == "python" and argv[1] == "-m":
            program, args = argv[2], argv[3:]
        else:
            assert argv[0] == "python", cmd.text
            program, args = argv[1], argv[2:]
        if program == "attnlab.compare":  # reads the runs of the block's earlier commands
            return self.subprocess(["-m", program, *args], env_prefix)
        if program == "attnlab.data.prepare":  # on a miniature of image-net.org's files (tests/imagenet_mini.py)
            return self.prepare(args)
        if program.startswith("benchmarks/") and cmd.marked:  # a [GPU] benchmark: the script is there, that is all
            assert (ROOT / program).is_file() and Path(program).name in BENCHMARK_BUDGET, cmd.text
            return
        if program.startswith("benchmarks/"):  # as written, then the budget (later flags win)
            budget = [a.format(cwd=self.cwd) for a in BENCHMARK_BUDGET[Path(program).name]]
            return self.subprocess([str(ROOT / program), *args, *budget], env_prefix)
        entry = ENTRY[Path(program).name if program.endswith(".py") else program]
        args = [self.materialize(a) for a in args]
        if cmd.marked:  # composes; a sweep's first job (key=a,b,c: key=a)
            sweep = "-m" in args
            return self.compose(entry, [_first_choice(a) if sweep else a for a in args if a != "-m"])
        if "# refused" in cmd.text:  # shown to be refused: one paragraph and exit code 2, before any budget matters
            return self.in_process(entry, args, refused=True)
        if "--cfg" in args:  # Hydra prints the config, in a new process: the page says it imports no torch
            return self.subprocess(["-m", f"attnlab.{entry}", *args], env_prefix)
        if any(a.startswith("-") for a in args):  # -m, --rerun, --config-dir: the script's own main(), here
            return self.main(entry, [*args, *budget_args(entry, args)], env_prefix)
        self.in_process(entry, args)

    def main(self, entry: str, args: list[str], env_prefix: dict) -> None:
        out = run_here(f"{entry}.py", *args, env=env_prefix, cwd=self.cwd, data_dir=self.data_dir)
        assert out.returncode == 0, f"{entry}.py {' '.join(args)}\n{out.stdout[-4000:]}"
        self.found_runs()

    def prepare(self, args: list[str]) -> None:
        """`python -m attnlab.data.prepare imagenet <dir> [--out <dir>]` (or `shards <dir> <out>`), in-process, its
        folders in this one; <dir> gets a miniature of the three ILSVRC2012 files (or a folder of class folders of
        images) unless it is there."""
        from attnlab.data.prepare import main
        from imagenet_mini import make_archives

        args = [a if i == 0 or a.startswith("-") else str(self.cwd / a.lstrip("/")) for i, a in enumerate(args)]
        if args[0] == "imagenet" and not Path(args[1]).exists():
            make_archives(Path(args[1]))
        elif args[0] == "shards" and not Path(args[1]).exists() and "--data=imagenet" in args:  # what it converts
            make_archives(Path(args[1]))
        elif args[0] == "shards" and not Path(args[1]).exists():
            self.make_input(str(Path(args[1]).relative_to(self.cwd)))
        main(args)

    def on_cluster(self, cmd: Command, argv: list[str], env_prefix: dict) -> None:
        """A [SLURM] or [multi-node] command for real, with the budget: `python train.py -m launcher=slurm ...` on the
        cluster, `sbatch --wait` of a batch script (its output in this folder), and the `torchrun` of each node
        started side by side with the next command's (one launch of several nodes, on a free port)."""
        env = os.environ | env_prefix | {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        if argv[0] == "python":
            assert argv[1] == "train.py", cmd.text
            return self.subprocess(["-m", "attnlab.train", *argv[2:], *budget_args("train", argv[2:])], env_prefix)
        if argv[0] == "sbatch":
            script = next(i for i, a in enumerate(argv) if (ROOT / a).is_file())
            run = [*argv[:script], "--wait", f"--output={self.cwd}/slurm-%j.out", str(ROOT / argv[script]),
                   *argv[script + 1:], *budget_args("train", [])]
            out = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
            logs = "".join(p.read_text() for p in self.cwd.glob("slurm-*.out"))
            assert out.returncode == 0, f"{' '.join(run)}: {out.stderr}\n{logs[-4000:]}"
            return self.found_run()
        assert argv[0] == "torchrun", cmd.text
        self.pending.append(argv)
        if len(self.pending) < int(argv[argv.index("--nnodes") + 1]):
            return  # the other nodes' commands follow
        port, procs = str(free_port()), []
        for node in self.pending:
            node = [port if prev == "--master-port" else a for prev, a in zip(["", *node], node)]
            script = next(i for i, a in enumerate(node) if a.endswith(".py"))
            run = [sys.executable, "-m", "torch.distributed.run", *node[1:script], str(ROOT / node[script]),
                   *node[script + 1:], *budget_args("train", [])]
            procs.append(subprocess.Popen(run, cwd=self.cwd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        self.pending = []
        for p in procs:
            out, _ = p.communicate(timeout=600)
            assert p.returncode == 0, out[-4000:]
        self.found_run()

    def found_run(self) -> None:
        runs = sorted(self.cwd.glob("logs/*/runs/*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        assert runs, "the run wrote no checkpoint"
        self.last_run = runs[-1].parents[1]

    def subprocess(self, argv: list[str], env_prefix: dict) -> None:
        out = subprocess.run([sys.executable, *argv], cwd=self.cwd, env=os.environ | env_prefix,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        assert out.returncode == 0, f"{' '.join(argv)}\n{out.stdout[-4000:]}"
        self.found_runs()

    def found_runs(self) -> None:
        runs = sorted(self.cwd.glob("logs/*/runs/*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if runs:
            self.last_run = runs[-1].parents[1]

    def compose(self, entry: str, args: list[str]):
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            return compose(config_name=entry, overrides=args, return_hydra_config=True)

    def in_process(self, entry: str, args: list[str], refused: bool = False) -> None:
        from attnlab.cli.app import run_app

        if entry == "predict":
            from attnlab.cli.predict import predict as fn, quote_free_text

            args = quote_free_text(args)
        elif entry == "eval":
            from attnlab.cli.eval import evaluate as fn
        elif entry == "export":
            from attnlab.cli.export import export as fn
        else:
            from attnlab.cli.training import train as fn
        cfg = self.compose(entry, args)
        budget = {} if refused else {"train": TRAIN_BUDGET, "eval": EVAL_BUDGET}.get(entry, {})
        with open_dict(cfg):
            for key, value in budget.items():
                group, _, name = key.partition(".")
                if group in cfg and (name in cfg[group] or group == "trainer"):
                    cfg[group][name] = value
            if entry == "train" and not refused:  # validation within the budget, at most 8 samples a batch
                vci = cfg.trainer.get("val_check_interval")
                if isinstance(vci, int) and vci > 2:
                    cfg.trainer.val_check_interval = 2
                if isinstance(cfg.data.get("batch_size"), int):
                    cfg.data.batch_size = min(cfg.data.batch_size, 8)
            out = Path(cfg.hydra.run.dir)
            out = out if out.is_absolute() else self.cwd / out
            # one process claims one run folder per second; runs of one block may start within a second
            while entry == "train" and out.is_dir() and any(out.iterdir()) and "hydra.run.dir" not in " ".join(args):
                out = out.with_name(out.name + "_")
            cfg.hydra.runtime.output_dir = str(out)
            cfg.hydra.job.num = 0
        HydraConfig().set_config(cfg)
        out.mkdir(parents=True, exist_ok=True)
        with open_dict(cfg):
            del cfg.hydra
        if entry == "train":  # what Hydra's run writes first (--rerun reads it)
            (out / ".hydra").mkdir(exist_ok=True)
            OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
        try:
            run_app(fn, cfg)
        except SystemExit as e:  # a UserError: its paragraph was printed
            if refused and e.code == 2:
                return
            pytest.fail(f"exited with {e.code}")
        assert not refused, "the page shows this command refused, but it ran"
        if entry == "train":
            self.last_run = out


def budget_args(entry: str, args: list[str]) -> list[str]:
    if entry != "train" or "--cfg" in args:
        return []
    extra = [f"{k}={v}" for k, v in TRAIN_BUDGET.items()]
    if any("hparams_search=" in a for a in args):
        extra.append("hydra.sweeper.n_trials=2")
    return extra


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("block", CLUSTER_BLOCKS, ids=lambda b: b.where)
def test_readme_cluster_block_runs(block, slurm_cluster, tmp_path, small_data, monkeypatch):
    """The commands of a block that need SLURM (sbatch, srun, launcher=slurm), on the real two-node SLURM cluster;
    the block's other commands run in test_readme_block_runs."""
    slurm_cluster(accounting=True)
    run_commands(on_slurm(block)[0], tmp_path, small_data, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if on_slurm(b)[1]], ids=lambda b: b.where)
def test_readme_block_runs(block, tmp_path, small_data, monkeypatch):
    run_commands(on_slurm(block)[1], tmp_path, small_data, monkeypatch)


def _first_choice(arg: str) -> str:
    key, eq, value = arg.partition("=")
    return f"{key}={value.split(',')[0]}" if eq and "," in value and not value.startswith(("[", "{")) else arg


def run_commands(commands: list[Command], tmp_path: Path, small_data: Path, monkeypatch) -> None:
    runner = Runner(tmp_path, small_data, monkeypatch)
    for cmd in commands:
        start = time.perf_counter()
        try:
            runner.run(cmd)
        except Exception as e:
            raise AssertionError(f"{cmd.where}: {cmd.text}") from e
        print(f"{cmd.where} {time.perf_counter() - start:5.1f} s  {cmd.text[:90]}")
