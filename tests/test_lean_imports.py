"""attnlab.lean_imports answers as the machine is while it defers torchvision, transformers and scipy: a package that is not
installed is absent, a submodule or name that does not exist fails at the import, and what exists resolves to the
real objects at first use. Each check runs in a new process (not a fork of the tests' preloaded server), since what
it checks is what an import sees first."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A machine without transformers: PathFinder less transformers (spec and metadata), at sys.meta_path[0] before
# attnlab is imported. While torchmetrics imports with the deferring finder installed, the finder asked for a
# torchmetrics module asks the availability checks what they see, once.
WITHOUT_TRANSFORMERS = """
import importlib.machinery, importlib.metadata, importlib.util, sys

PathFinder = importlib.machinery.PathFinder
probed = {}


def probe():
    from lightning_utilities.core.imports import RequirementCache, package_available
    probed['find_spec'] = importlib.util.find_spec('transformers')
    probed['package_available'] = package_available('transformers')
    probed['RequirementCache'] = bool(RequirementCache('transformers'))
    probed['torchvision'] = importlib.util.find_spec('torchvision') is not None
    for stmt in ('import transformers', 'from transformers import AutoModel', 'import transformers.models'):
        try:
            exec(stmt, {})
            probed[stmt] = 'imported'
        except ImportError as e:
            probed[stmt] = type(e).__name__


class NoTransformers:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition('.')[0] == 'transformers':
            return None
        deferring = any(type(f).__name__ == '_DeferringFinder' for f in sys.meta_path)
        if deferring and not probed and name.startswith('torchmetrics.') and \\
                'lightning_utilities.core.imports' in sys.modules:
            probe()
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, context=importlib.metadata.DistributionFinder.Context()):
        if (context.name or '').lower() == 'transformers':
            return iter(())
        return (d for d in PathFinder.find_distributions(context) if d.metadata['Name'].lower() != 'transformers')

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


sys.meta_path.remove(PathFinder)
sys.meta_path.insert(0, NoTransformers)
assert importlib.util.find_spec('transformers') is None

import attnlab.lean_imports as lean
lean.import_lightning()

from lightning_utilities.core.imports import package_available
from torchmetrics.utilities import imports as tm
try:
    import transformers
    after = 'imported'
except ModuleNotFoundError:
    after = 'ModuleNotFoundError'
print(sorted(probed.items()))
print(bool(tm._TRANSFORMERS_GREATER_EQUAL_4_4), bool(tm._TRANSFORMERS_AVAILABLE), bool(tm._TORCHVISION_AVAILABLE),
      package_available('transformers'), after, 'transformers' in sys.modules,
      [n for n, m in sys.modules.items() if isinstance(m, lean.DeferredModule)])
"""


def run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    return out.stdout.strip().splitlines()


def test_a_package_that_is_not_installed_is_absent_while_lightning_imports():
    probed, after = run(WITHOUT_TRANSFORMERS)
    assert probed == str(sorted({
        "find_spec": None, "package_available": False, "RequirementCache": False, "torchvision": True,
        "import transformers": "ModuleNotFoundError", "from transformers import AutoModel": "ModuleNotFoundError",
        "import transformers.models": "ModuleNotFoundError"}.items()))
    assert after == "False False True False ModuleNotFoundError False []"


# transformers and torchvision installed: inside the deferred period, what does not exist fails at the import and
# nothing is imported for real; what exists is the real object at first use
WITH_BOTH = """
import importlib.util, sys
from attnlab.lean_imports import Deferred, DeferredModule, deferring


def fails(stmt):
    try:
        exec(stmt, {})
        return 'imported'
    except ImportError as e:
        return type(e).__name__


with deferring():
    print(importlib.util.find_spec('torchvision') is not None, importlib.util.find_spec('transformers') is not None,
          importlib.util.find_spec('torchvision.no_such_module'))
    print(fails('from transformers import NoSuchThing'), fails('import torchvision.no_such_module'),
          fails('from torchvision import no_such_submodule'), fails('from torchvision.models import no_such_net'),
          fails('import transformers.no_such_module'))
    from torchvision import transforms
    from torchvision.models import resnet50
    from torchvision.ops import box_iou
    from transformers import Apache, CLIPModel, PreTrainedModel  # Apache: in the license header, never bound
    import torchvision.transforms.functional as F
    import scipy.signal
    print(sorted(n for n, m in sys.modules.items() if n.partition('.')[0] in ('torchvision', 'transformers', 'scipy')
                 and not isinstance(m, DeferredModule)))
print([n for n, m in sys.modules.items() if isinstance(m, DeferredModule)], isinstance(CLIPModel, Deferred))
import torchvision, transformers
import torchvision.transforms.functional
print(transforms.Compose is torchvision.transforms.Compose, resnet50.resolve() is torchvision.models.resnet50,
      box_iou.resolve() is torchvision.ops.box_iou, CLIPModel.resolve() is transformers.CLIPModel,
      PreTrainedModel.resolve() is transformers.PreTrainedModel, F.resize.resolve() is torchvision.transforms.functional.resize)
stand_in = scipy.signal
import scipy.signal
print(isinstance(stand_in, DeferredModule), stand_in.windows.hamming is scipy.signal.windows.hamming)
try:
    Apache.resolve()
    print('resolved')
except ImportError as e:
    print(type(e).__name__)
"""


def test_what_does_not_exist_fails_at_the_import_and_what_does_is_the_real_object_at_first_use():
    assert run(WITH_BOTH) == [
        "True True None",
        "ImportError ModuleNotFoundError ImportError ImportError ModuleNotFoundError",
        "[]",
        "[] True",
        "True True True True True True",
        "True True",
        "ImportError",
    ]


def test_scipy_is_imported_for_real_where_gammatone_is_installed(tmp_path, monkeypatch):
    """torchmetrics gives scipy.signal a `hamming` for gammatone where scipy has none: with gammatone installed,
    scipy is not deferred, so that torchmetrics can see whether it has one."""
    import importlib

    from attnlab.lean_imports import deferred_packages

    assert deferred_packages() == ("torchvision", "transformers", "scipy", "torchmetrics.utilities.plot")
    (tmp_path / "gammatone").mkdir()
    (tmp_path / "gammatone" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert deferred_packages() == ("torchvision", "transformers", "torchmetrics.utilities.plot")


# a rank of srun or torchrun, as Hydra's logging set-up meets it (`${rank_suffix:}`) before the entry point imports
LAUNCHED = {
    "srun": {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_JOB_NAME": "train"},
    "torchrun": {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "GROUP_RANK": "1", "LOCAL_RANK": "0",
                 "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2"},
}
RANK_SUFFIX = """
import sys
from attnlab.utils.launch import rank_suffix
print(rank_suffix(), 'lightning.pytorch' in sys.modules,
      sorted(m for m in ('transformers', 'scipy', 'matplotlib', 'torchvision') if m in sys.modules))
"""


@pytest.mark.parametrize("launcher", list(LAUNCHED))
def test_a_launched_rank_imports_lightning_the_lean_way_when_hydra_names_its_log(launcher):
    """A rank of srun or torchrun asks Lightning's cluster environments for its rank while Hydra sets up logging,
    before the entry point imports anything: Lightning comes with the same packages deferred as in a lone run, not
    with every optional package of torchmetrics (about 3.5 CPU-s of each rank's start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    out = subprocess.run([sys.executable, "-c", RANK_SUFFIX], capture_output=True, text=True, timeout=300,
                         env=env | LAUNCHED[launcher])
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["_rank1", "True", "[]"], out.stdout


DATAMODULE = """
import sys
from attnlab.data.digits import DigitsDataModule
print('lightning.pytorch' in sys.modules, sorted(m for m in ('transformers', 'scipy', 'matplotlib') if m in sys.modules))
"""


@pytest.mark.parametrize("lean", ["1", "0"])
def test_a_script_importing_a_datamodule_gets_the_same_lean_lightning(lean):
    """A process that imports attnlab's modules without an entry point (a benchmark's child process, a user's
    script) first imports Lightning where a datamodule's module imports it: importing attnlab installed the finder
    that makes that import the lean one. ATTNLAB_LEAN_IMPORTS=0 imports everything, as a plain import does."""
    out = subprocess.run([sys.executable, "-c", DATAMODULE], capture_output=True, text=True, timeout=300,
                         env=os.environ | {"ATTNLAB_LEAN_IMPORTS": lean})
    assert out.returncode == 0, out.stderr[-3000:]
    deferred = "[]" if lean == "1" else "['matplotlib', 'scipy', 'transformers']"
    assert out.stdout.strip().split(maxsplit=1) == ["True", deferred], out.stdout
