#!/usr/bin/env bash
# One GPU check for a machine with a single NVIDIA GPU; installs nothing from the network.
#   bash benchmarks/gpu_check.sh            # dense_0.12b and dense_1b x baseline and unified, bf16 FSDP2 + compile
#   bash benchmarks/gpu_check.sh --dry-run  # tiny sizes on CPU (the test suite runs this)
# Logs and the table go to $OUT (default benchmarks/out). Needs torch and PyYAML only.
# The table's syncs/step column counts host-device synchronizations in the timed steps
# (torch.cuda.set_sync_debug_mode("warn"); call sites in gpu_check.json); the library's loop needs none.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
"$PY" -c "import torch, yaml; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/env.txt"
nvidia-smi >> "$OUT/env.txt" 2>&1 || true
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
