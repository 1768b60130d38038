#!/usr/bin/env bash
# Installs what building and running gpuflame need on Debian/Ubuntu, as root: a C toolchain with
# clang for the BPF programs, libelf, zlib, pkg-config and Rust; and python3 for the README's demo.
# Needs nothing outside this repository; does nothing that is already there, so it is cheap to
# run before every build.
set -euo pipefail

need=()
for pkg in clang llvm libelf-dev zlib1g-dev pkg-config build-essential curl ca-certificates; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# The README's demo (examples/demo.py) runs on python3; building does not need it, nor does the
# agent's image (deploy/Dockerfile installs the list above).
command -v python3 >/dev/null 2>&1 || need+=(python3)
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
