#!/usr/bin/env bash
# One GPU check: every GPU comparison of attnlab with nanoGPT and timm on this card, printed as one table
# (benchmarks/gpu_check.py): GPT-2 124M vs nanoGPT's bench.py, ViT-B/16 and Swin-T vs timm's benchmark.py in bf16,
# trainer=ddp vs trainer=gpu on one card, and the image loader per worker. About 8 minutes on one H100/H200.
#
#   bash benchmarks/gpu_check.sh [--out results.json] [gpu_check.py's options]
#   bash benchmarks/gpu_check.sh --tiny        # any machine: tiny models on CPU, the script's own check
#
# The references are read from NANOGPT (a nanoGPT checkout: bench.py, model.py, configurator.py) and TIMM_REPO (a
# timm checkout: benchmark.py), by default .ref/nanoGPT and .ref/pytorch-image-models when they are there.
# On a machine with torch, lightning and timm but no package index, the wheels that ../shared/tools/gpu-wheels.sh
# collects in .whl/ (hydra-core, omegaconf, pydantic, ...) are installed into /tmp/site first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
if ! "$PY" -c "import hydra, omegaconf, pydantic" 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "hydra-core, omegaconf or pydantic is missing: pip install -e . (or carry .whl/)"; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import attnlab" 2>/dev/null || export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
refs=()
nano=${NANOGPT:-.ref/nanoGPT}
[ -f "$nano/bench.py" ] && refs+=(--nanogpt "$nano")
timm_repo=${TIMM_REPO:-.ref/pytorch-image-models}
[ -f "$timm_repo/benchmark.py" ] && refs+=(--timm "$timm_repo")
exec "$PY" benchmarks/gpu_check.py ${refs[@]+"${refs[@]}"} "$@"
