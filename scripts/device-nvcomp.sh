#!/usr/bin/env bash
# Runs on the GPU machine: puts nvCOMP's library where device-unpack.sh finds it for the
# commands after this one (files outlive a command while the machine stays warm). .gpu/ holds
# libnvcomp.so.6.xz, repacked here from the nvidia-libnvcomp-cu13 wheel (too big to carry with
# the binaries in one command):
#   pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 -d W nvidia-libnvcomp-cu13
#   unzip -p W/nvidia_libnvcomp_cu13-*.whl nvidia/libnvcomp/lib64/libnvcomp.so.6 | xz -9 -T2 > .gpu/libnvcomp.so.6.xz
set -eu
mkdir -p /tmp/nvcomp
python3 - <<'PY'
import lzma, shutil
with lzma.open(".gpu/libnvcomp.so.6.xz") as src, open("/tmp/nvcomp/libnvcomp.so.6", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 24)
PY
rm .gpu/libnvcomp.so.6.xz
ls -la /tmp/nvcomp
