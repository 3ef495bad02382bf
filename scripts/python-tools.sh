#!/usr/bin/env bash
# Installs the Python tools the API contract tests run, into a virtual
# environment cached under target/, and prints the environment's bin
# directory:
#
#   bin=$(scripts/python-tools.sh)
#   "$bin/openapi-spec-validator" openapi.json
#
# The tools: openapi-spec-validator (checks a document against the OpenAPI
# specification) and openapi-python-client (generates a Python client from
# one). A fresh machine needs only python3; where python3 or its venv module
# is missing, Debian's packages are installed. The versions are pinned so a
# test's result does not change under it; a finished install is marked and
# not repeated. Progress goes to stderr; stdout is the bin directory only.
set -euo pipefail
cd "$(dirname "$0")/.."

VALIDATOR=openapi-spec-validator==0.9.0
GENERATOR=openapi-python-client==0.29.1
venv=${MNEME_PYTHON_TOOLS:-$PWD/target/python-tools}
mark="$venv/.installed-$(echo "$VALIDATOR $GENERATOR" | tr ' =' '_-')"

if [ -f "$mark" ]; then
    echo "$venv/bin"
    exit 0
fi

apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}

if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "python-tools: python3 with venv missing; installing Debian's packages" >&2
    apt_install python3 python3-venv
fi

# Several tests may ask at once: one installs, the others wait for it.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -f "$mark" ]; then
    echo "python-tools: installing $VALIDATOR $GENERATOR into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$VALIDATOR" "$GENERATOR" >&2 \
        || { echo "python-tools: pip install failed (is PyPI reachable?)" >&2; exit 1; }
    touch "$mark"
fi
echo "$venv/bin"
