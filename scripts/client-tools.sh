#!/usr/bin/env bash
# Installs what the Python and TypeScript clients (clients/) are generated,
# built and tested with, under target/client-tools/, and prints where it is:
#
#   bin=$(scripts/client-tools.sh python)   # a virtual environment's bin directory:
#   "$bin/python" -c 'import mneme_client'  #   the client installed from clients/python,
#   "$bin/datamodel-codegen" --help         #   and the generator of its models
#   nm=$(scripts/client-tools.sh node)      # a node_modules directory:
#   "$nm/.bin/tsc" --version                #   typescript, openapi-typescript, @types/node
#
# Every version is pinned: Python's by clients/python/constraints.txt (each
# package the generator and the client pull in, exactly), Node's by
# clients/typescript/package-lock.json (npm ci), so a generated file or a
# test's result does not change under it. A finished install is marked and
# not repeated; the Python client itself is installed again (with
# `pip install ./clients/python`, as a user would) whenever its sources
# change. A fresh machine needs python3 and node with npm, or Debian's
# packages for them (installed when missing), and PyPI and the npm
# registry. Progress goes to stderr; stdout is the one path only.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tools=${MNEME_CLIENT_TOOLS:-$root/target/client-tools}

apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}

# A digest of the files named (relative to the repository), for a marker.
digest() {
    (cd "$root" && sha256sum "$@" | sha256sum | cut -c1-16)
}

python_tools() {
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        echo "client-tools: python3 with venv missing; installing Debian's packages" >&2
        apt_install python3 python3-venv
    fi
    local venv="$tools/python"
    local constraints=clients/python/constraints.txt
    local mark
    mark="$venv/.installed-$(digest "$constraints")"
    mkdir -p "$tools"
    # Several tests may ask at once: one installs, the others wait for it.
    exec 9>"$tools/python.lock"
    flock 9
    if [ ! -f "$mark" ]; then
        echo "client-tools: installing the Python tools ($constraints) into $venv" >&2
        rm -rf "$venv"
        python3 -m venv "$venv" >&2
        # The generator, the client's dependencies, what builds the client
        # (no build isolation, so reinstalling it needs no download) and
        # what type-checks it; what they pull in is pinned too.
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            -c "$constraints" datamodel-code-generator httpx pydantic setuptools mypy >&2 \
            || { echo "client-tools: pip install failed (is PyPI reachable?)" >&2; exit 1; }
        touch "$mark"
    fi
    # The client, as `pip install ./clients/python` installs it: again
    # whenever a file of it changes.
    local sources
    sources=$(cd "$root" && find clients/python -type f \( -name '*.py' -o -name '*.toml' -o -name '*.typed' -o -name '*.md' \) \
        -not -path '*/tests/*' -not -path '*/__pycache__/*' -not -path '*/build/*' | sort)
    # shellcheck disable=SC2086 # one path a line, none with spaces
    local client_mark="$venv/.client-$(digest $sources)"
    if [ ! -f "$client_mark" ]; then
        echo "client-tools: installing clients/python into $venv" >&2
        rm -f "$venv"/.client-*
        # Built in a copy: pip would leave build/ and *.egg-info in the tree.
        local copy="$tools/python-client-src"
        rm -rf "$copy"
        mkdir -p "$copy"
        (cd "$root/clients/python" && tar --exclude=tests --exclude=__pycache__ --exclude=build --exclude='*.egg-info' -cf - .) \
            | (cd "$copy" && tar -xf -)
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-deps --no-build-isolation --force-reinstall "$copy" >&2 \
            || { echo "client-tools: pip install ./clients/python failed" >&2; exit 1; }
        touch "$client_mark"
    fi
    echo "$venv/bin"
}

node_tools() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "client-tools: node or npm missing; installing Debian's packages" >&2
        local pkgs=()
        command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
        command -v npm >/dev/null 2>&1 || pkgs+=(npm)
        apt_install "${pkgs[@]}"
    fi
    local dir="$tools/node"
    local lock=clients/typescript/package-lock.json
    local mark
    mark="$dir/.installed-$(digest clients/typescript/package.json "$lock")"
    mkdir -p "$tools"
    exec 9>"$tools/node.lock"
    flock 9
    if [ ! -f "$mark" ]; then
        echo "client-tools: installing the TypeScript tools ($lock) into $dir" >&2
        rm -rf "$dir"
        mkdir -p "$dir"
        cp "$root/clients/typescript/package.json" "$root/$lock" "$dir/"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2) \
            || { echo "client-tools: npm ci failed (is the npm registry reachable?)" >&2; exit 1; }
        touch "$mark"
    fi
    echo "$dir/node_modules"
}

case "${1:-}" in
python) python_tools ;;
node) node_tools ;;
*)
    echo "usage: $0 python|node" >&2
    exit 2
    ;;
esac
