#!/usr/bin/env bash
# One-shot check of the embedded engine on a CUDA GPU (H200: under 8 minutes), or its CPU rehearsal.
#
#   bash benchmarks/gpu_check.sh [--dry-run] [--out DIR] [gpu_check.py options]
#
# Writes DIR/gpu_check.json (DIR: --out, else $OUT, else .) and prints a table: environment,
# greedy correctness cold / device hit / host reload / prefetched, lru vs kvflow-evict vs kvflow vs
# gpu-only on a Llama-3.1-8B-shaped random-weight model (--dry-run: tiny configs on the CPU, under
# 3 minutes; CI runs it), the simulator's error per system, and checks that kvflow's mechanism ran.
# Exits non-zero (after writing the JSON) when a correctness or mechanism check fails.
#
# Runs from the checkout (PYTHONPATH=.), not pip-installed. Needs PYTHON (default python3) with torch,
# numpy, safetensors, tokenizers and jinja2; pydantic and its dependencies come from the wheels in
# .whl/ (benchmarks/gpu_wheels.sh) when that Python lacks them, installed into a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=0
for arg in "$@"; do [ "$arg" = "--dry-run" ] && DRY=1; done
fail() { echo "gpu_check.sh: FAILED: $*" >&2; exit 1; }

"$PY" -c "import sys; assert sys.version_info >= (3, 11)" 2>/dev/null || fail "$PY is missing or older than 3.11"
"$PY" -c "import torch, numpy, safetensors, tokenizers, jinja2" 2>/dev/null \
  || fail "$PY lacks one of torch, numpy, safetensors, tokenizers, jinja2"
EXTRA=""
if ! "$PY" -c "import pydantic" 2>/dev/null; then
  compgen -G ".whl/*.whl" >/dev/null || fail "$PY has no pydantic and .whl/ holds no wheels (run benchmarks/gpu_wheels.sh where PyPI is reachable)"
  EXTRA=$(mktemp -d /tmp/kvflow-site.XXXXXX)
  "$PY" -m pip install -q --no-index --no-deps --target "$EXTRA" .whl/*.whl || fail "installing .whl/*.whl into $EXTRA"
  echo "installed $(ls .whl/*.whl | wc -l) wheels from .whl/ into $EXTRA"
fi
export PYTHONPATH="$PWD${EXTRA:+:$EXTRA}${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import pydantic, kvflow_orch.protocol" || fail "cannot import the wire contract (pydantic)"
if [ "$DRY" = 0 ]; then
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
  "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || fail "torch sees no CUDA device (use --dry-run on a CPU)"
  LIMIT=540
else
  LIMIT=175
fi
echo "host memory: $(awk '/MemTotal/ {printf "%.0f GiB total", $2 / 1048576} /MemAvailable/ {printf ", %.0f GiB available", $2 / 1048576}' /proc/meminfo)"
START=$(date +%s)
set +e
timeout "$LIMIT" "$PY" benchmarks/gpu_check.py "$@"
rc=$?
set -e
echo "gpu_check.sh: exit $rc after $(( $(date +%s) - START )) s"
[ "$rc" = 124 ] && echo "gpu_check.sh: FAILED: over the ${LIMIT}s limit" >&2
exit "$rc"
