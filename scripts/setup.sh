#!/usr/bin/env bash
# Installs what the tests need on top of what building needs (scripts/setup-build.sh): go (for
# `go tool pprof`), Debian's CPython 3.13 and 3.14 (from ../shared/tools), py-spy, and numpy for
# pyenv's Python 3.11. As root; does nothing that is already there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/setup-build.sh"

need=()
for pkg in golang-go util-linux openssl python3 python3-pip binutils; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]} for the tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Debian's CPython 3.13 and 3.14 builds, which the Python tests profile (bookworm has neither).
pythons=${GPUFLAME_TEST_PYTHONS:-/opt/gpuflame-pythons}
get_python="$(cd "$here/../.." && pwd)/shared/tools/get-python.sh"
for v in 3.13 3.14; do
    if [ ! -x "$pythons/$v/usr/bin/python$v" ]; then
        if [ ! -f "$get_python" ]; then
            echo "setup: $get_python is missing; cannot install Python $v for the tests" >&2
            exit 1
        fi
        echo "setup: installing Debian's Python $v into $pythons" >&2
        bash "$get_python" "$v" "$pythons" >/dev/null
    fi
done

# py-spy, which a test compares gpuflame's Python stacks with.
if ! command -v py-spy >/dev/null 2>&1 && [ ! -x /root/.pyenv/shims/py-spy ]; then
    echo "setup: installing py-spy from PyPI" >&2
    python3 -m pip install --quiet py-spy >&2
fi

# numpy (OpenBLAS kernels without CFI) for pyenv's 3.11, which the stack tests run.
py311=$(ls -d /root/.pyenv/versions/3.11.*/bin/python3.11 2>/dev/null | sort -V | tail -n 1 || true)
if [ -n "$py311" ] && ! "$py311" -c "import numpy" >/dev/null 2>&1; then
    echo "setup: installing numpy for $py311" >&2
    "$py311" -m pip install --quiet numpy >&2
fi
