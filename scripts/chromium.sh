#!/usr/bin/env bash
# Makes sure a Chromium the browser tests can drive (tests/src/browser.rs) is
# installed: where neither `chromium` nor `chromium-browser` is on PATH (and
# MNEME_CHROMIUM names no executable), Debian's `chromium` package is
# installed. Running it again does nothing. Progress goes to stderr; stdout
# is empty.
#
#   scripts/chromium.sh && cargo test -p mneme-e2e ...
set -euo pipefail

have_chromium() {
    if [ -n "${MNEME_CHROMIUM:-}" ]; then
        [ -x "$MNEME_CHROMIUM" ]
    else
        command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
    fi
}
if have_chromium; then
    exit 0
fi
if [ -n "${MNEME_CHROMIUM:-}" ]; then
    echo "chromium: MNEME_CHROMIUM=$MNEME_CHROMIUM is not an executable" >&2
    exit 1
fi

apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
}

echo "chromium: not on PATH; installing Debian's chromium package" >&2
apt_install chromium \
    || { echo "chromium: apt-get install chromium failed" >&2; exit 1; }
if ! have_chromium; then
    echo "chromium: installed, but still no chromium on PATH" >&2
    exit 1
fi
echo "chromium: installed $(command -v chromium)" >&2
