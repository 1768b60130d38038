#!/usr/bin/env bash
# Installs what the tests need on top of what building needs (scripts/setup-build.sh): sys/sdt.h
# (systemtap-sdt-dev, for the stand-in libc10_cuda's USDT probes), go (for
# `go tool pprof`), Debian's CPython 3.13, 3.14 and 3.15 (from ../shared/tools), py-spy, and numpy for
# pyenv's Python 3.11. As root; does nothing that is already there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/setup-build.sh"

need=()
for pkg in golang-go util-linux openssl python3 python3-pip binutils xz-utils debuginfod systemtap-sdt-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]} for the tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Debian's CPython 3.13, 3.14 and 3.15 builds, which the Python tests profile (bookworm has none).
pythons=${GPUFLAME_TEST_PYTHONS:-/opt/gpuflame-pythons}
get_python="$(cd "$here/../.." && pwd)/shared/tools/get-python.sh"
for v in 3.13 3.14 3.15; do
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

# The real CUPTI 12 and 13 headers (with the CUDA headers they include: cuda.h from the runtime
# wheel, crt/ from nvcc's for 12 and cuda-crt's for 13), from NVIDIA's wheels on PyPI, which a test
# compiles the injection library's record layout against. Headers only, no GPU: 64 MB of wheels,
# of which only the include directories are kept.
cupti=${GPUFLAME_CUPTI_HEADERS:-/opt/gpuflame-cupti}
for spec in "12 nvidia-cuda-cupti-cu12==12.8.90 nvidia-cuda-runtime-cu12==12.8.90 nvidia-cuda-nvcc-cu12==12.8.93" \
    "13 nvidia-cuda-cupti==13.2.86 nvidia-cuda-runtime==13.2.75 nvidia-cuda-crt==13.2.78"; do
    set -- $spec
    major=$1
    shift
    dest="$cupti/$major/include"
    if [ ! -f "$dest/cupti_activity.h" ] || [ ! -f "$dest/cuda.h" ] || [ ! -f "$dest/crt/host_defines.h" ]; then
        echo "setup: fetching the CUPTI $major headers from PyPI into $dest" >&2
        tmp=$(mktemp -d)
        python3 -m pip download --quiet --no-deps --only-binary=:all: "$@" -d "$tmp" >&2
        mkdir -p "$dest"
        python3 - "$dest" "$tmp"/*.whl <<'PY'
import sys, zipfile
dest, wheels = sys.argv[1], sys.argv[2:]
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for m in z.infolist():
            parts = m.filename.split("/")
            if "include" in parts and not m.is_dir():
                rel = "/".join(parts[parts.index("include") + 1:])
                target = f"{dest}/{rel}"
                import os
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(m) as src, open(target, "wb") as out:
                    out.write(src.read())
PY
        rm -rf "$tmp"
    fi
done
