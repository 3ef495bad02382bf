#!/usr/bin/env bash
# Compiles the TypeScript client (src/) into OUT_DIR (clients/generate.sh
# writes the checked-in dist/; the drift test compiles into a temp
# directory and compares):
#   build.sh NODE_MODULES OUT_DIR
set -euo pipefail
nm=$1 out=$2
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
cd "$(dirname "$0")"
rm -rf "$out.tmp"
node "$nm/typescript/bin/tsc" -p tsconfig.json --outDir "$out.tmp"
rm -rf "$out"
mv "$out.tmp" "$out"
