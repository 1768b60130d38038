#!/usr/bin/env bash
# Builds the release binary for GPU hosts without a compiler and packs it:
#   scripts/package.sh   ->   target/package/gpuflame-<version>-<arch>-linux.tar.gz
# The binary links libelf, zlib and liblzma statically (cargo feature `static`), so that it needs
# only glibc; it is stripped of debug info (84 MB with it, 14.6 MB without) and carries the CUPTI
# library as every build does. The tarball holds it, README.md, LICENSE if there is one, and deploy/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup-build.sh"
export PATH="$HOME/.cargo/bin:$PATH"

# libbpf-sys takes libelf.a and libz.a only from directories it is told of; Debian's libelf-dev
# and zlib1g-dev ship them in the multiarch directory that pkg-config names.
LIBBPF_SYS_LIBRARY_PATH=${LIBBPF_SYS_LIBRARY_PATH:-$(pkg-config --variable=libdir libelf)}
export LIBBPF_SYS_LIBRARY_PATH
cargo build --release --locked --quiet --manifest-path "$root/Cargo.toml" -p gpuflame --features static
target=${CARGO_TARGET_DIR:-$root/target}
bin="$target/release/gpuflame"

# Anything but glibc and libgcc_s (Rust's unwinder; on every glibc system) would have to be
# installed on the GPU host: refuse to pack such a binary.
extra=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
    grep -Ev '^(libc|libm|libdl|libpthread|librt|libgcc_s)\.so\.[0-9]+$|^ld-linux-x86-64\.so\.2$' || true)
if [ -n "$extra" ]; then
    echo "package: $bin needs $(echo $extra) besides glibc" >&2
    exit 1
fi

version=$("$bin" --version | awk '{print $2}')
name="gpuflame-$version-$(uname -m)-linux"
out="$target/package"
rm -rf "${out:?}/$name" "$out/$name.tar.gz"
mkdir -p "$out/$name"
objcopy --strip-debug "$bin" "$out/$name/gpuflame"
cp "$root/README.md" "$out/$name/"
[ ! -f "$root/LICENSE" ] || cp "$root/LICENSE" "$out/$name/"
cp -r "$root/deploy" "$out/$name/"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$out" -czf "$out/$name.tar.gz" "$name"
echo "$out/$name.tar.gz"
