#!/usr/bin/env bash
# Regenerates what the clients take from the daemon's OpenAPI document:
#
#   clients/openapi.json                          the document, as the daemon serves it
#   clients/python/src/mneme_client/models.py     Python models (datamodel-code-generator)
#   clients/typescript/src/schema.ts              TypeScript types (openapi-typescript)
#   clients/typescript/dist/                      the TypeScript client, compiled (tsc)
#
# The document comes from a real daemon: the mneme binary ($MNEME_BIN, else
# target/debug/mneme, built with `cargo build -p mneme` if missing) serves
# on a free loopback port over a throwaway data directory, and is asked for
# /openapi.json. With --from-checked-in, the document already in
# clients/openapi.json is used instead (no daemon). The generators are the
# pinned ones scripts/client-tools.sh installs. cli/tests/clients.rs fails
# when any of these files differs from what this script would write.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ "${1:-}" != "--from-checked-in" ]; then
    bin=${MNEME_BIN:-$root/target/debug/mneme}
    if [ ! -x "$bin" ]; then
        echo "generate: building $bin" >&2
        cargo build -p mneme --quiet
    fi
    data=$(mktemp -d)
    trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$data"' EXIT
    token=generate-token-0123456789
    MNEME_TOKEN=$token "$bin" --data-dir "$data" serve --listen 127.0.0.1:0 2>"$data/serve.log" &
    pid=$!
    for _ in $(seq 200); do
        [ -s "$data/mneme.daemon" ] && break
        kill -0 "$pid" 2>/dev/null || { cat "$data/serve.log" >&2; exit 1; }
        sleep 0.05
    done
    python3 - "$data/mneme.daemon" "$token" "$root/clients/openapi.json" <<'PY'
import json, sys, urllib.request
note, token, out = sys.argv[1:4]
addr = json.load(open(note))["addr"]
request = urllib.request.Request(f"http://{addr}/openapi.json", headers={"Authorization": f"Bearer {token}"})
document = json.load(urllib.request.urlopen(request, timeout=10))
with open(out, "w", encoding="utf-8") as f:
    json.dump(document, f, indent=2, ensure_ascii=False)
    f.write("\n")
PY
    echo "generate: clients/openapi.json from $bin" >&2
fi

py=$(scripts/client-tools.sh python)
nm=$(scripts/client-tools.sh node)
clients/python/generate-models.sh "$py/datamodel-codegen" clients/openapi.json clients/python/src/mneme_client/models.py
clients/typescript/generate-types.sh "$nm" clients/openapi.json clients/typescript/src/schema.ts
clients/typescript/build.sh "$nm" clients/typescript/dist
echo "generate: models.py, schema.ts and dist/ written" >&2
