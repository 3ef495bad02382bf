#!/usr/bin/env bash
# Installs what the example tool servers need, under target/function-tools/,
# and prints where they are:
#
#   bin=$(scripts/function-tools.sh python)       # a venv's bin directory, with
#                                                 # examples/python-tools/requirements.txt
#   server=$(scripts/function-tools.sh typescript)  # examples/typescript-tools/server.ts
#                                                 # compiled: dist/server.js beside its node_modules
#
# The Python one is the official MCP Python SDK (`mcp`), the TypeScript one
# the official MCP TypeScript SDK (`@modelcontextprotocol/sdk`) and tsc,
# each at the version the example pins (requirements.txt, package.json), so
# a test's result does not change under it. A fresh machine needs only
# python3 (with venv) or Node.js and npm; where one is missing, Debian's
# packages are installed. A finished install is marked (by the hash of what
# it installed from) and not repeated. Progress goes to stderr; stdout is
# the path only.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=${MNEME_FUNCTION_TOOLS:-$root/target/function-tools}

apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}

hash_of() { cat "$@" | sha256sum | cut -c1-16; }

python_tools() {
    local venv=$dir/python req=$root/examples/python-tools/requirements.txt
    local mark="$venv/.installed-$(hash_of "$req")"
    [ -f "$mark" ] && { echo "$venv/bin"; return; }
    scripts/python3.sh >/dev/null
    mkdir -p "$dir"
    # Several tests may ask at once: one installs, the others wait for it.
    exec 9>"$venv.lock"
    flock 9
    if [ ! -f "$mark" ]; then
        echo "function-tools: installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv" >&2
        rm -rf "$venv"
        python3 -m venv "$venv" >&2
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2 \
            || { echo "function-tools: pip install failed (is PyPI reachable?)" >&2; exit 1; }
        touch "$mark"
    fi
    echo "$venv/bin"
}

typescript_tools() {
    local out=$dir/typescript src=$root/examples/typescript-tools
    local mark="$out/.installed-$(hash_of "$src/package.json")"
    local built="$out/.built-$(hash_of "$src/package.json" "$src/server.ts" "$src/tsconfig.json")"
    [ -f "$built" ] && [ -f "$mark" ] && { echo "$out/dist/server.js"; return; }
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "function-tools: node or npm missing; installing Debian's packages" >&2
        local pkgs=()
        command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
        command -v npm >/dev/null 2>&1 || pkgs+=(npm)
        apt_install "${pkgs[@]}"
    fi
    mkdir -p "$dir"
    exec 9>"$out.lock"
    flock 9
    if [ ! -f "$mark" ]; then
        echo "function-tools: npm install (examples/typescript-tools/package.json) into $out" >&2
        rm -rf "$out"
        mkdir -p "$out"
        cp "$src/package.json" "$out/"
        npm install --prefix "$out" --no-audit --no-fund --loglevel=error >&2 \
            || { echo "function-tools: npm install failed (is the npm registry reachable?)" >&2; exit 1; }
        touch "$mark"
    fi
    if [ ! -f "$built" ]; then
        echo "function-tools: compiling examples/typescript-tools/server.ts" >&2
        rm -f "$out"/.built-*
        cp "$src/server.ts" "$src/tsconfig.json" "$out/"
        (cd "$out" && node_modules/.bin/tsc -p .) >&2 \
            || { echo "function-tools: tsc failed on examples/typescript-tools/server.ts" >&2; exit 1; }
        chmod +x "$out/dist/server.js"
        touch "$built"
    fi
    echo "$out/dist/server.js"
}

case "${1:-}" in
python) python_tools ;;
typescript) typescript_tools ;;
*)
    echo "usage: $0 python|typescript" >&2
    exit 2
    ;;
esac
