#!/usr/bin/env bash
# Makes sure python3 and its venv module are here, installing Debian's
# packages (python3, python3-venv) where either is missing, and prints
# python3's path. The wheel test and scripts/function-tools.sh use it.
set -euo pipefail
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "python3: python3 with venv missing; installing Debian's packages" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    # One apt at a time: tests may ask at once.
    exec 9>/tmp/mneme-apt-python3.lock
    flock 9
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        $sudo apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3 python3-venv >&2
    fi
fi
command -v python3
