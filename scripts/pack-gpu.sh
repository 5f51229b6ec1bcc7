#!/usr/bin/env bash
# Packs binaries built here for the GPU machine (which has no Rust and no zstd): strips each one,
# compresses it with xz into .gpu/ (scripts/device-unpack.sh unpacks it there with python3's
# lzma), and copies ../shared/bench/cub_baseline.py and, with SLT=1, ../shared/datafusion-slt
# beside them. Names lose cargo's hash suffix (target/release/deps/gpu-1a2b... -> .gpu/gpu).
#
#   scripts/pack-gpu.sh target/release/deps/gpu-* target/release/deps/paper-*
set -eu
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)
grep -qxF "/.gpu/" "$exclude" 2>/dev/null || echo "/.gpu/" >> "$exclude"
rm -rf .gpu && mkdir -p .gpu
# Oldest first: where a glob matches several builds of one binary, the newest is the one kept.
for b in $(ls -tr "$@"); do
  case "$b" in *.d|*.rlib|*.rmeta) continue ;; esac
  [ -x "$b" ] || continue
  name=$(basename "$b" | sed -E 's/-[0-9a-f]{16}$//')
  cp "$b" ".gpu/$name"
  strip ".gpu/$name" 2>/dev/null || true
  xz -f -6 -T2 ".gpu/$name"
done
cp ../shared/bench/cub_baseline.py .gpu/
if [ "${SLT:-0}" = 1 ]; then cp -r ../shared/datafusion-slt .gpu/; fi
du -sh .gpu; ls -la .gpu
