#!/usr/bin/env bash
# The gpuflame a benchmark measures: $GPUFLAME_BIN, else a release build of this checkout (built
# now, quietly). Prints its path.
set -euo pipefail
if [ -n "${GPUFLAME_BIN:-}" ]; then
  echo "$GPUFLAME_BIN"
  exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p gpuflame >&2
echo "$root/target/release/gpuflame"
