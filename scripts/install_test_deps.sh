#!/bin/sh
# Test-only system dependencies: Debian's chromium, for the headless-browser test of
# `strata report` (tests/test_report.py). Idempotent and quiet: does nothing when chromium
# is already there; needs root (or sudo) for apt-get otherwise. Never fails the build:
# without chromium the browser test skips and says why.
set -u
if [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_test_deps: no apt-get here; install chromium by hand for the browser test" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "install_test_deps: not root and no sudo; the browser test will skip" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -qq chromium >/dev/null 2>&1; then
    # A fresh container may have no package lists yet.
    $SUDO apt-get update -qq >/dev/null 2>&1 || true
    $SUDO apt-get install -y -qq chromium >/dev/null 2>&1 \
        || echo "install_test_deps: apt-get install chromium failed; the browser test will skip" >&2
fi
exit 0
