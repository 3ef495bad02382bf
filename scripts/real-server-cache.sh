#!/usr/bin/env bash
# Prefix-cache misses explained against llama.cpp's own server: a session
# whose server is restarted between two turns (the cause must be
# `evicted`), and a fork of it with another system prompt (`system prompt
# changed`). Needs the llama-server and model that
# ../shared/real-server/setup.sh builds under $LLAMA_DIR (default /tmp/llama).
#
#   scripts/real-server-cache.sh [MNEME]     # default target/debug/mneme
#
# Prints `mneme replay --cache` for both sessions and exits 0 only if each
# names the cause it must; everything lives under a temporary directory.
set -euo pipefail
MNEME=$(readlink -f "${1:-target/debug/mneme}")
LLAMA_DIR=${LLAMA_DIR:-/tmp/llama}
PORT=${PORT:-8093}
SERVER="$LLAMA_DIR/build/bin/llama-server"
MODEL=$(ls "$LLAMA_DIR"/model/*.gguf 2>/dev/null | head -n1 || true)
SRC=$(ls -d "$LLAMA_DIR"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -n1 || true)
[ -x "$SERVER" ] && [ -n "$MODEL" ] && [ -n "$SRC" ] \
    || { echo "real-server-cache: run ../shared/real-server/setup.sh first" >&2; exit 2; }
[ -x "$MNEME" ] || { echo "real-server-cache: no mneme binary at $MNEME" >&2; exit 2; }
work=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"' EXIT
export MNEME_DATA_DIR="$work/data"

start_server() {
    # The template has a tools section; the model's own drops them.
    "$SERVER" -m "$MODEL" --jinja --chat-template-file "$SRC/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja" \
        -c 8192 -np 1 -t 1 -n 32 --no-ui --host 127.0.0.1 --port "$PORT" >>"$work/server.log" 2>&1 &
    server=$!
    for _ in $(seq 120); do
        curl -sf "127.0.0.1:$PORT/health" >/dev/null && return 0
        sleep 0.5
    done
    echo "real-server-cache: llama-server did not start (see $work/server.log)" >&2
    exit 1
}

# A system prompt long enough (~350 tokens) that a miss is past the slack.
rule=$(printf 'Keep every figure exact; never round. %.0s' $(seq 40))
agent() {
    printf 'name = "sums"\nsystem = "You are a %s assistant. Answer in one short sentence. %s"\n[model]\nprovider = "openai"\nbase_url = "http://127.0.0.1:%s/v1"\nmodel = "local"\ntemperature = 0.0\n' \
        "$1" "$rule" "$PORT" >"$work/$1.toml"
    echo "$work/$1.toml"
}
terse=$(agent terse)
verbose=$(agent verbose)

start_server
id=$("$MNEME" run --agent "$terse" "What is 2 plus 2?" 2>&1 >/dev/null | sed -n 's/^session \([0-9a-f-]*\).*/\1/p' | head -n1)
"$MNEME" run --session "$id" "And 3 plus 3?" >/dev/null 2>&1
kill "$server"; wait "$server" 2>/dev/null || true
start_server                                   # its cache is gone
"$MNEME" run --session "$id" "And 4 plus 4?" >/dev/null 2>&1
"$MNEME" run --session "$id" "And 5 plus 5?" >/dev/null 2>&1
head=$("$MNEME" log --json "$id" | tail -n1 | sed -n 's/.*"seq":\([0-9]*\).*/\1/p')
fork=$("$MNEME" fork "$id" --at "$head" --agent "$verbose")
"$MNEME" run --session "$fork" "And 6 plus 6?" >/dev/null 2>&1

echo "session $id (server restarted before its third turn):"
"$MNEME" replay --cache "$id" | tee "$work/original"
echo "fork $fork (another system prompt):"
"$MNEME" replay --cache "$fork" | tee "$work/fork"
grep -q ': evicted,' "$work/original" \
    || { echo "real-server-cache: the restart's miss is not named evicted" >&2; exit 1; }
tail -n1 "$work/fork" | grep -q 'system prompt changed,' \
    || { echo "real-server-cache: the fork's miss is not named by its system prompt" >&2; exit 1; }
echo "real-server-cache: both misses named by their cause"
