#!/usr/bin/env bash
# Download the wheels benchmarks/gpu_check.sh needs on the GPU machine into .whl/ (git-ignored).
#
#   bash benchmarks/gpu_wheels.sh      # PIP="python3 -m pip" to choose the pip (default .venv's, else python3's)
#
# That machine has Python 3.12 with torch, numpy, safetensors, tokenizers, jinja2 and httpx, and no
# package registry; the check imports kvflow_orch.protocol, which needs pydantic. The set below is
# pinned (the versions this repo's CI runs), for cp312 manylinux x86_64, no dependencies resolved:
# pydantic's own dependencies are listed. typing_extensions travels too: pydantic needs a newer one
# than torch may have brought. The total must stay under 50 MiB (a run carries at most 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  pydantic==2.14.4
  pydantic_core==2.50.5
  annotated_types==0.8.0
  typing_inspection==0.4.5
  typing_extensions==4.16.0
)
LIMIT_MIB=50
PYVER=${GPU_PYTHON_VERSION:-3.12}  # another version only to rehearse the install with a local Python
ABI=cp${PYVER/./}
if [ -n "${PIP:-}" ]; then
  read -r -a PIP_CMD <<<"$PIP"
elif [ -x .venv/bin/python ]; then
  PIP_CMD=(.venv/bin/python -m pip)
else
  PIP_CMD=(python3 -m pip)
fi
mkdir -p .whl
"${PIP_CMD[@]}" download -q --only-binary=:all: --no-deps --platform manylinux2014_x86_64 \
  --python-version "$PYVER" --implementation cp --abi "$ABI" -d .whl "${WHEELS[@]}" \
  || { echo "gpu_wheels.sh: FAILED: pip download (needs PyPI)" >&2; exit 1; }
for spec in "${WHEELS[@]}"; do
  name=${spec%%==*}; version=${spec#*==}
  ls .whl/"${name}-${version}"-*.whl >/dev/null 2>&1 || { echo "gpu_wheels.sh: FAILED: no wheel for $spec in .whl/" >&2; exit 1; }
done
ls -l .whl/*.whl
total=$(du -cb .whl/*.whl | tail -n 1 | cut -f1)
echo "total: $total bytes ($(( total / 1048576 )) MiB) in .whl/"
if [ "$total" -gt $(( LIMIT_MIB * 1048576 )) ]; then
  echo "gpu_wheels.sh: FAILED: .whl/ holds more than $LIMIT_MIB MiB (remove stale wheels or shrink the set)" >&2
  exit 1
fi
