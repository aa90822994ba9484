#!/bin/bash
# Builds `xtask` against MLX 0.32.4's CUDA wheel on this (x86-64 Linux) machine and packs what
# a GPU machine needs to run it into target/cuda-carry (about 37 MB): libmlx.so with Hopper
# (sm_90) code only, its bundled libraries and JIT headers, mlx and mlx-lm wheels for the
# reference, and the stripped xtask. run-on-device.sh unpacks and runs it there. No CUDA is
# needed here: the CUDA libraries libmlx.so needs are left unresolved at link time (they come
# from the GPU machine's nvidia-* Python packages at run time). See docs/cuda.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ARCH=${ARCH:-90}
W=$ROOT/target/cuda-wheels
MLX=$ROOT/target/cuda-mlx
CARRY=$ROOT/target/cuda-carry
PLAT="--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64"
mkdir -p "$W" "$CARRY/pyw"
pip_get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d "$1" "$2"; }
[ -n "$(ls "$W"/mlx_cuda_13-0.32.4-*.whl 2>/dev/null)" ] || pip_get "$W" mlx-cuda-13==0.32.4
pip_get "$CARRY/pyw" mlx==0.32.4
pip_get "$CARRY/pyw" mlx-lm==0.32.2

rm -rf "$MLX" && mkdir -p "$MLX" && (cd "$MLX" && unzip -q "$W"/mlx_cuda_13-0.32.4-*.whl 'mlx/*' 'mlx_cuda_13.libs/*')
python3 "$ROOT/xtask/cuda/prune_fatbin.py" "$MLX/mlx/lib/libmlx.so" "$MLX/mlx/lib/libmlx.so.pruned" "$ARCH"
mv "$MLX/mlx/lib/libmlx.so.pruned" "$MLX/mlx/lib/libmlx.so"
xz -6 -T2 -c "$MLX/mlx/lib/libmlx.so" > "$CARRY/libmlx.so.xz"
(cd "$MLX" && tar cf - mlx/include mlx_cuda_13.libs | xz -6 -T2 > "$CARRY/mlx-extra.tar.xz")

# RUSTFLAGS replaces .cargo/config.toml's run-paths, so they are repeated here.
(cd "$ROOT" && MLX_DIR="$MLX/mlx" MLX_CORE_BLAS=none CARGO_TARGET_DIR="$ROOT/target/cuda" \
  RUSTFLAGS='-C link-arg=-Wl,--disable-new-dtags,-rpath,$ORIGIN:$ORIGIN/deps:$ORIGIN/../deps -C link-arg=-Wl,--allow-shlib-undefined' \
  cargo build --release -p xtask)
strip -o "$CARRY/xtask" "$ROOT/target/cuda/release/xtask"
xz -6 -T2 -f "$CARRY/xtask"
echo "$ROOT" > "$CARRY/built-in"  # xtask reads its sources (py/bench.py) under this path
du -sh "$CARRY"
