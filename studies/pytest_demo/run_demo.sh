#!/usr/bin/env bash
# The plugin as a user meets it (issue 37): a fresh directory holding only test_my_server.py, servescope
# installed, pytest pointed at a running server. Usage (figures to report: under the CPU lock):
#   flock /tmp/ss-cpu.lock studies/pytest_demo/run_demo.sh targets   # ours (dummy:tiny), then llama-server
#   flock /tmp/ss-cpu.lock studies/pytest_demo/run_demo.sh llama     # llama-server only (LLAMA_THREADS, default 2)
#   flock /tmp/ss-cpu.lock studies/pytest_demo/run_demo.sh baseline  # autosave, compare: same, then slowed
# Env: PYTHON (a venv with servescope[pytest]), LLAMA_SERVER, GGUF, DEMO_DIR (default /tmp/plugin-demo).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python}
LLAMA_SERVER=${LLAMA_SERVER:-/work/peers/llama/build-vnni/bin/llama-server}
GGUF=${GGUF:-$HOME/.cache/servescope/SmolLM2-135M-Instruct.Q4_1.gguf}
DEMO_DIR=${DEMO_DIR:-/tmp/plugin-demo}
PORT=${PORT:-8431}
SLOWED_MS=${SLOWED_MS:-200}
COMPARE_FAIL=${COMPARE_FAIL:-median:100%}
TOKENS_FAIL=${TOKENS_FAIL:-output_tokens_per_s:50%}
LLAMA_THREADS=${LLAMA_THREADS:-2}
URL=http://127.0.0.1:$PORT
SERVER_PID=

fresh_dir() {  # only the user's test file (and, for the baseline phase, what pytest-benchmark stores)
    rm -rf "$DEMO_DIR" && mkdir -p "$DEMO_DIR" && cp "$HERE/test_my_server.py" "$DEMO_DIR/"
}

start() {  # start a server in the background and wait for /v1/models
    "$@" > "$DEMO_DIR/../plugin-demo-server-$PORT.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 300); do
        curl -sf "$URL/v1/models" > /dev/null && return 0
        kill -0 "$SERVER_PID" 2> /dev/null || { echo "server exited"; return 1; }
        sleep 1
    done
    echo "server not up after 300 s"; return 1
}

stop() { kill "$SERVER_PID" 2> /dev/null; wait "$SERVER_PID" 2> /dev/null; SERVER_PID=; }
trap stop EXIT

ours() { start "$PYTHON" -m loadtests.cli serve --model dummy:tiny --seed 0 --host 127.0.0.1 --port "$PORT" "$@"; }

run_pytest() {  # pytest in the fresh directory; the exit status and the pass/fail lines are what is shown
    echo "\$ (cd $DEMO_DIR && pytest $*)   # $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$DEMO_DIR" && "$PYTHON" -m pytest -p no:cacheprovider "$@")
    echo "exit status: $?"
}

case "${1:-}" in
targets)
    fresh_dir
    ours && run_pytest -rA --benchmark-skip --llm-target "$URL"; stop
    ;&
llama)
    fresh_dir
    start "$LLAMA_SERVER" -m "$GGUF" --metrics -a smollm2-135m -t "$LLAMA_THREADS" -np 4 --port "$PORT" --host 127.0.0.1 \
        && run_pytest -rA --benchmark-skip --llm-target "$URL"; stop
    ;;
baseline)
    fresh_dir
    ours && run_pytest --benchmark-only --benchmark-autosave --llm-target "$URL" \
        && run_pytest --benchmark-only --benchmark-compare "--benchmark-compare-fail=$COMPARE_FAIL" \
               --llm-compare-fail "$TOKENS_FAIL" --llm-target "$URL"
    stop
    ours --host-overhead-ms "$SLOWED_MS" && run_pytest --benchmark-only --benchmark-compare \
        "--benchmark-compare-fail=$COMPARE_FAIL" --llm-compare-fail "$TOKENS_FAIL" --llm-target "$URL"
    stop
    ;;
*) echo "usage: $0 targets|llama|baseline" >&2; exit 2 ;;
esac
