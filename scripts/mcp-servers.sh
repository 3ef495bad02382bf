#!/usr/bin/env bash
# Installs the reference MCP servers the MCP client tests talk to, into
# target/mcp-servers/, and writes their entry points to
# target/mcp-servers/entry.env:
#
#   scripts/mcp-servers.sh && . target/mcp-servers/entry.env
#   node "$MCP_FS" /some/allowed/dir          # stdio
#   node "$MCP_MEMORY"                          # stdio (MEMORY_FILE_PATH=...)
#   PORT=3001 node "$MCP_EVERYTHING" streamableHttp
#
# The servers: @modelcontextprotocol/server-filesystem, server-memory and
# server-everything from the npm registry. A fresh machine needs only Node.js
# and npm; where either is missing, Debian's packages are installed. The
# versions are pinned so a test's result does not change under it; a finished
# install is marked and not repeated. Progress goes to stderr; stdout is empty.
set -euo pipefail
cd "$(dirname "$0")/.."

FS=@modelcontextprotocol/server-filesystem@2026.8.31
MEMORY=@modelcontextprotocol/server-memory@2026.8.31
EVERYTHING=@modelcontextprotocol/server-everything@2026.8.31
dir=${MNEME_MCP_SERVERS:-$PWD/target/mcp-servers}
mark="$dir/.installed-$(echo "$FS $MEMORY $EVERYTHING" | tr ' /@' '__-')"

installed() {
    [ -f "$mark" ] && [ -f "$dir/entry.env" ] && grep -q "^MCP_FS=$dir/" "$dir/entry.env"
}
if installed; then
    exit 0
fi

apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "mcp-servers: node or npm missing; installing Debian's packages" >&2
    # A node from elsewhere (such as NodeSource's nodejs, which ships npm
    # itself) is kept: only what is missing is asked for.
    pkgs=()
    command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
    command -v npm >/dev/null 2>&1 || pkgs+=(npm)
    apt_install "${pkgs[@]}"
fi

# Several tests may ask at once: one installs, the others wait for it.
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
if ! installed; then
    echo "mcp-servers: installing $FS $MEMORY $EVERYTHING into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
        "$FS" "$MEMORY" "$EVERYTHING" >&2 \
        || { echo "mcp-servers: npm install failed (is the npm registry reachable?)" >&2; exit 1; }
    # Each package's entry point is its package.json "bin" (dist/index.js).
    entry() {
        local pkg="${1%@*}" js
        js=$(node -e '
            const p = require(process.argv[1] + "/package.json");
            const b = typeof p.bin === "string" ? p.bin : Object.values(p.bin)[0];
            process.stdout.write(require("path").resolve(process.argv[1], b));
        ' "$dir/node_modules/$pkg")
        [ -f "$js" ] || { echo "mcp-servers: no entry point for $pkg ($js)" >&2; exit 1; }
        printf '%s' "$js"
    }
    fs=$(entry "$FS")
    memory=$(entry "$MEMORY")
    everything=$(entry "$EVERYTHING")
    printf 'MCP_FS=%s\nMCP_MEMORY=%s\nMCP_EVERYTHING=%s\n' "$fs" "$memory" "$everything" >"$dir/entry.env.tmp"
    mv "$dir/entry.env.tmp" "$dir/entry.env"
    touch "$mark"
fi
