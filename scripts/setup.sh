#!/usr/bin/env bash
# Installs what gpuflame needs to build and test on Debian/Ubuntu, as root; does nothing that is
# already there, so it is cheap to run before every build.
set -euo pipefail

need=()
for pkg in clang llvm libelf-dev zlib1g-dev pkg-config build-essential golang-go util-linux curl ca-certificates openssl python3 python3-pip binutils; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing packages ${need[*]}; run as root to install them" >&2
        exit 1
    fi
    echo "setup: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    echo "setup: installing the Rust toolchain with rustup" >&2
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
fi

# Debian's CPython 3.13 and 3.14 builds, which the Python tests profile (bookworm has neither).
pythons=${GPUFLAME_TEST_PYTHONS:-/opt/gpuflame-pythons}
get_python="$(cd "$(dirname "$0")/../.." && pwd)/shared/tools/get-python.sh"
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
