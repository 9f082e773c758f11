#!/usr/bin/env bash
# GPU readiness check (issue 14): one run on one H200, every number printed (--eager: checks 3-6 only,
# about 4 minutes there; the compiled decode step alone took 270 s).
#
#   bash bench/gpu_check.sh            # on the GPU machine (Qwen2-0.5B shapes)
#   bash bench/gpu_check.sh --tiny     # the CPU dry run: same code, tiny shapes
#
# The GPU machine has torch, transformers, peft and accelerate but no TRL and no internet: TRL's
# side needs the wheels `make bench-wheels` puts in bench/wheels/ (carry that folder there).
# They are installed with --no-deps --no-index into a scratch folder, never into the system.
# Results: gpu_check.json and gpu_check.md in $OUT (the device tool's folder) or out/gpu-check.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
WHEELS=${MTRL_WHEELS:-bench/wheels}
OUT_DIR=${OUT:-out/gpu-check}
LIMIT_S=${GPU_CHECK_TIMEOUT_S:-470}
args=("$@")

if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  if [[ " ${args[*]-} " != *" --tiny "* ]]; then
    echo "no GPU here: running the tiny CPU dry run (--tiny)"
    args+=(--tiny)
  fi
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

if ! "$PYTHON" -c 'import trl, datasets' 2>/dev/null; then
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    site=$(mktemp -d /tmp/mtrl-wheels.XXXXXX)
    "$PYTHON" -m pip install --quiet --no-deps --no-index --target "$site" "$WHEELS"/*.whl
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
    echo "wheels for TRL's side, from $WHEELS: $(ls "$WHEELS" | tr '\n' ' ')"
  else
    echo "no trl and no wheels in $WHEELS (make bench-wheels): TRL's side is skipped"
  fi
fi

"$PYTHON" -c 'import platform, torch, transformers, peft
print("python", platform.python_version(), "torch", torch.__version__, "transformers",
      transformers.__version__, "peft", peft.__version__)'
status=0
timeout "$LIMIT_S" "$PYTHON" bench/gpu_check.py --out-dir "$OUT_DIR" "${args[@]}" || status=$?
if [[ $status -ne 0 ]]; then
  echo "gpu_check.py exited $status (124: over ${LIMIT_S}s); what it measured so far:"
  cat "$OUT_DIR/gpu_check.md" 2>/dev/null || true
fi
echo "results: $OUT_DIR/gpu_check.json, $OUT_DIR/gpu_check.md"
exit $status
