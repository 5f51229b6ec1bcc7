#!/usr/bin/env bash
# Packs binaries built here for the GPU machine (which has no Rust and no zstd): strips each one,
# compresses it with xz into .gpu/ (scripts/device-unpack.sh unpacks it there with python3's
# lzma), and copies the CUB baselines (crates/gpusort-cuda/benches/cub_baseline.py and
# cub_native.cu) beside them. With SLT=1 it also copies the `.slt` files of the
# datafusion-sqllogictest crate (from cargo's registry: the GPU machine has no cargo) into
# .gpu/datafusion-sqllogictest/; their data travels with the repository (testdata/datafusion-slt).
# Names lose cargo's hash suffix (target/release/deps/gpu-1a2b... -> .gpu/gpu).
#
#   scripts/pack-gpu.sh target/release/deps/gpu-* target/release/deps/paper-*
#   SLT=1 scripts/pack-gpu.sh target/release/deps/gpu_sql-*
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
cp crates/gpusort-cuda/benches/cub_baseline.py crates/gpusort-cuda/benches/cub_native.cu .gpu/
if [ "${SLT:-0}" = 1 ]; then
  # The crate's folder as cargo resolved it for this workspace.
  slt_crate=$(cargo metadata --format-version 1 --offline \
      --filter-platform "$(rustc -vV | sed -n 's/^host: //p')" | python3 -c '
import json, os, sys
packages = json.load(sys.stdin)["packages"]
print(next(os.path.dirname(p["manifest_path"]) for p in packages if p["name"] == "datafusion-sqllogictest"))')
  mkdir -p .gpu/datafusion-sqllogictest
  cp -r "$slt_crate/test_files" "$slt_crate/data" .gpu/datafusion-sqllogictest/
fi
du -sh .gpu; ls -la .gpu
