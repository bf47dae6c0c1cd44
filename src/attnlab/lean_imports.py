"""Lightning without the optional packages torchmetrics imports for metrics no run of attnlab computes.

Lightning imports torchmetrics, whose `__init__` imports every metric module, and those import the optional packages
they could use when installed: torchvision (and with it `torch._dynamo`, for image-quality metrics such as ARNIQA and
LPIPS), transformers (BERTScore, InfoLM), `scipy.signal` (a patch for SRMR) and matplotlib (`Metric.plot`). On 2 CPU
cores that is about 2.5 s and 0.3 GB of a run's start that a GPT or BERT run never uses; a run that uses them
(an image run's torchvision, a Hugging Face export's transformers) imports them itself when it needs them.

`import_lightning()` imports Lightning with torchmetrics seeing those packages as absent, then puts the checks back,
so that a torchmetrics module imported later sees them again. Only the metric modules torchmetrics imports from its
own `__init__` keep the narrower view. `train.py` imports Lightning this way for attnlab's own tasks (none of which
logs such a metric); a LightningModule of your own (`model._target_` outside attnlab) gets the whole import, as does
any run under `ATTNLAB_LEAN_IMPORTS=0`.
"""

from __future__ import annotations

import os
import re
import sys

# the optional packages torchmetrics would import at import time
DEFERRED = frozenset({"torchvision", "transformers", "scipy", "matplotlib"})


def import_lightning() -> None:
    """Import lightning.pytorch, deferring DEFERRED's imports from torchmetrics' own `__init__` (see above)."""
    if "torchmetrics" in sys.modules or os.environ.get("ATTNLAB_LEAN_IMPORTS", "1") == "0":
        import lightning.pytorch  # noqa: F401

        return
    from lightning_utilities.core import imports as checks

    requirement_bool, package_available = checks.RequirementCache.__bool__, checks.package_available

    def deferred(name: str | None) -> bool:
        return re.split(r"[^A-Za-z0-9_]", name or "", maxsplit=1)[0] in DEFERRED

    def requirement_met(self) -> bool:
        return False if deferred(self.requirement or self.module) else requirement_bool(self)

    checks.RequirementCache.__bool__ = requirement_met
    checks.package_available = lambda name: False if deferred(name) else package_available(name)
    try:
        import torchmetrics  # noqa: F401
        import lightning.pytorch  # noqa: F401
    finally:
        checks.RequirementCache.__bool__, checks.package_available = requirement_bool, package_available
