#!/usr/bin/env bash
# Builds the one file a GPU box needs, target/dist/kvbench (Cargo profile `dist`: release code,
# no debug info, stripped), checks it is under 16 MiB, and prints what it needs at run time: the
# shared libraries it links (`readelf -d`, NEEDED) and the newest glibc (and libstdc++, libgcc)
# symbol versions it asks for, so the box's C library can be checked against them. No CUDA
# library is among them: the driver, NVRTC and cuBLAS are opened at run time.
#
# Usage: scripts/build-gpu-binary.sh        Exit: 0 built and within the size; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --profile dist --locked --bin kvbench
BIN=target/dist/kvbench
LIMIT_BYTES=$((16 << 20))
size=$(stat -c %s "$BIN")
echo "binary: $BIN, $size bytes ($(( size >> 20 )) MiB; limit $(( LIMIT_BYTES >> 20 )) MiB)"
echo "runtime dependencies (readelf -d, NEEDED):"
readelf -d "$BIN" | sed -n 's/.*Shared library: \[\(.*\)\]/  \1/p'
for lib in GLIBC GLIBCXX GCC; do
  v=$(readelf -W --version-info "$BIN" | grep -o "${lib}_[0-9][0-9.]*" | sort -Vu | tail -n 1 || true)
  [ -n "$v" ] && echo "newest ${lib} symbol version: $v"
done
if [ "$size" -ge "$LIMIT_BYTES" ]; then
  echo "build-gpu-binary: $BIN is $size bytes, over the ${LIMIT_BYTES}-byte limit" >&2
  exit 1
fi
