"""SLURM's own judgement of a job before it is submitted: the batch script that Hydra's submitit launcher would submit,
given to `sbatch --test-only`, with each refusal mapped to the setting to change; and submitit's own submission
errors as the same paragraphs."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from attnlab.errors import UserError

# sbatch's refusals (lower case) -> the settings that decide them, and what to do
_REFUSALS = [
    ("invalid partition", "launcher.partition", "name one of the partitions `sinfo` lists"),
    ("qos policy", "launcher.qos", "the account's or QOS's limits refuse this job: fewer nodes (trainer.num_nodes), "
     "a shorter launcher.timeout_min, or another launcher.qos"),
    ("invalid account", "launcher.account", "use one of your accounts (`sacctmgr show assoc user=$USER`), or "
     "launcher.account=null for your default"),
    ("invalid qos", "launcher.qos", "use a QOS of your account (`sacctmgr show assoc user=$USER "
     "format=account,qos`), or launcher.qos=null"),
    ("more processors requested than permitted", "launcher.cpus_per_task",
     "ask fewer CPUs per task (launcher.cpus_per_task=auto fits them to the nodes), or fewer tasks per node "
     "(trainer.devices)"),
    ("node count specification invalid", "trainer.num_nodes", "ask for no more nodes than the partition has"),
    ("generic resource", "launcher.gpus_per_node", "ask for GPUs only on a partition that has them "
     "(launcher.gpus_per_node=auto: only when the trainer uses them)"),
    ("time limit", "launcher.timeout_min", "set a time limit within the partition's (launcher.timeout_min=auto takes "
     "the partition's own)"),
    ("memory", "launcher.mem_gb", "ask for less memory per node (launcher.mem_gb=null: SLURM's default)"),
    ("node configuration is not available", "launcher.cpus_per_task",
     "no node of the partition has all that one node is asked for: fewer CPUs per task (launcher.cpus_per_task), "
     "fewer tasks (trainer.devices), less memory (launcher.mem_gb) or fewer GPUs (launcher.gpus_per_node)"),
    ("feature specification", "hydra.launcher.constraint", "name features the partition's nodes have "
     "(`sinfo -o '%P %f'`), or leave the constraint out"),
    ("job array", "the number of jobs in the sweep", "split the sweep into smaller ones (at most the cluster's "
     "MaxArraySize jobs each: `scontrol show config | grep MaxArraySize`)"),
    ("access denied", "launcher.partition", "this user may not submit there: another launcher.partition or "
     "launcher.account"),
    ("not permitted", "launcher.partition", "this user may not submit there: another launcher.partition or "
     "launcher.account"),
]


def test_only(params: dict[str, Any], settings: dict[str, Any]) -> None:
    """`sbatch --test-only` on the script that would be submitted; a refusal is a UserError naming the setting."""
    from attnlab.cluster.submitit_bridge import batch_script

    with tempfile.TemporaryDirectory(prefix="attnlab-sbatch-") as tmp:
        script = Path(tmp) / "job.sh"
        text = batch_script(params, Path(tmp), "true", "attnlab-fit-check")  # the launcher's executor, its parameters
        script.write_text(text)
        try:
            out = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60,
                                 cwd=tmp)
        except subprocess.TimeoutExpired:
            raise UserError("`sbatch --test-only` did not answer within 60 s: SLURM's controller is busy or "
                            "unreachable. Try again in a moment.") from None
    if out.returncode != 0:
        raise refusal(out.stderr or out.stdout, script_flags(text), settings)


def script_flags(script_text: str) -> str:
    """The flags of a batch script (`--nodes=2 --ntasks-per-node=1 ...`), without those naming its files."""
    flags = [line.split(None, 1)[1] for line in script_text.splitlines() if line.startswith("#SBATCH ")]
    files = ("--output", "--error", "--open-mode", "--job-name", "--wckey")
    return " ".join(f for f in flags if not f.startswith(files))


def refusal(stderr: str, flags: str, settings: dict[str, Any]) -> UserError:
    """sbatch's error lines -> one paragraph: what SLURM said, the setting that decides it, what to do."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [re.sub(r"^(sbatch: error: |allocation failure: |sbatch: )", "", ln) for ln in lines
              if "error" in ln.lower() or "failure" in ln.lower()] or lines[-1:] or ["(no message)"]
    said = "; ".join(dict.fromkeys(errors))
    low = said.lower()
    key, hint = next(((k, h) for pattern, k, h in _REFUSALS if pattern in low), (None, None))
    where = f"partition {settings.get('launcher.partition')}" if settings.get("launcher.partition") else "SLURM"
    value = settings.get(key)
    fix = (f"The setting: {key}{'=' + str(value) if value is not None else ''}; {hint}." if key else
           "Change the launcher.* settings (or trainer.num_nodes) that the message names, and run the command again.")
    return UserError(f"sbatch refuses the job this run would submit to {where}: \"{said}\" (sbatch {flags}). {fix}")


def explain_submission(err: BaseException, settings: dict[str, Any] | None = None) -> UserError | None:
    """submitit's error when sbatch refused a submission (FailedJobError carrying sbatch's stderr), or when sbatch
    is missing, as one paragraph; None for other errors."""
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    if isinstance(err, FileNotFoundError) and "sbatch" in str(err):
        from attnlab.cluster.nodes import require_slurm

        try:
            require_slurm()
        except UserError as e:
            return e
    if isinstance(err, (FailedJobError, FailedSubmissionError)):
        return refusal(str(err), "", settings or {})
    return None
