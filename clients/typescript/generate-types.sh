#!/usr/bin/env bash
# Generates the TypeScript client's types from an OpenAPI document:
#   generate-types.sh NODE_MODULES DOCUMENT OUT.ts
# with the pinned openapi-typescript (clients/generate.sh calls it; so does
# the drift test, into a temp file).
set -euo pipefail
nm=$1 document=$2 out=$3
node "$nm/openapi-typescript/bin/cli.js" "$document" --output "$out" --empty-objects-unknown >/dev/null
