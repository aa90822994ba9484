#!/bin/bash
# Runs on a Linux GPU machine with CUDA 13 (driver, /usr/local/cuda headers, and a python3
# whose site-packages hold the nvidia-* CUDA 13 wheels, as PyTorch's do), from the repo root,
# with target/cuda-carry from repack.sh, on the GPU: STEPS (default "pair gate dist costs") of
# pair (the default pair's speed and greedy identity), gate (greedy parity, every row), dist
# (the distribution gate's default-pair condition), costs (v(k), drafter round, prefill with a
# drafter) and bench (mid-size plain decode and prefill against mlx-lm). Each step has a time
# limit (PAIR_S, GATE_S, DIST_S, COSTS_S, BENCH_S); the defaults fit one 10-minute call with the
# unpacking, so a 15-minute lease runs STEPS="pair gate dist costs" and then STEPS=bench.
# Output goes to $OUT: the log, the bench JSONs, and cuda-tables.md (every table the steps
# printed, ready for docs/cuda.md, with the line `greedy median N.NNx` of the default pair).
set -u
C=$PWD/target/cuda-carry
M=/tmp/cudamlx
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
main() {
  log start; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
  SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p $M
  # The mlx wheel first: pip --target would replace an existing mlx/ folder.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $M $C/pyw/*.whl
  mkdir -p $M/mlx/lib
  xz -dc $C/libmlx.so.xz > $M/mlx/lib/libmlx.so
  tar xJf $C/mlx-extra.tar.xz -C $M
  # libmlx.so looks for its CUDA libraries in ../../nvidia/*/lib (the pip layout). The pip
  # headers lack crt/ (MLX's JIT 4-bit kernels include crt/mma.h), so headers come from the toolkit.
  mkdir -p $M/nvidia/cu13
  for d in $SITE/nvidia/*; do [ "$(basename $d)" = cu13 ] || ln -sfn $d $M/nvidia/; done
  for d in $SITE/nvidia/cu13/*; do [ "$(basename $d)" = include ] || ln -sfn $d $M/nvidia/cu13/; done
  ln -sfn ${CUDA_HOME:-/usr/local/cuda}/include $M/nvidia/cu13/include
  ldd $M/mlx/lib/libmlx.so | grep "not found"
  # xtask finds its sources (py/bench.py, the default model) under the path it was built in.
  BUILT=$(cat $C/built-in)
  [ -n "$BUILT" ] && [ "$BUILT" != "$PWD" ] && [ ! -e "$BUILT" ] && { mkdir -p "$(dirname $BUILT)"; ln -s $PWD "$BUILT"; }
  xz -dc $C/xtask.xz > /tmp/xtask && chmod +x /tmp/xtask
  export LD_LIBRARY_PATH=$M/mlx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=$M XTASK_REFERENCE_PYTHON=python3
  export DSPARK_HOME=/tmp/dspark-home
  python3 -c "import mlx.core as mx; print('python mlx', mx.__version__, mx.default_device())"
  for step in ${STEPS:-pair gate dist costs}; do
    log $step
    case $step in
      pair) timeout ${PAIR_S:-150} /tmp/xtask bench --default --device gpu --dir /tmp/bench ;;
      gate) timeout ${GATE_S:-240} /tmp/xtask gates --only greedy-parity --device gpu --dir /tmp/gates ;;
      dist) timeout ${DIST_S:-90} /tmp/xtask gates --only distribution-default-pair --samples ${DIST_N:-4000} --device gpu --dir /tmp/gates ;;
      costs) timeout ${COSTS_S:-90} /tmp/xtask bench --costs --device gpu --dir /tmp/bench ;;
      bench) timeout ${BENCH_S:-300} /tmp/xtask bench --device gpu --dir /tmp/bench ;;
      *) echo "unknown step $step (expected pair, gate, dist, costs or bench)" ;;
    esac
    log "$step rc $?"
  done
  cp /tmp/bench/*.json "$OUT"/ 2>/dev/null
  log end
}
main 2>&1 | tee "$OUT/log"
# The tables for docs/cuda.md: headings and table rows as printed, then the default pair's
# greedy median speedup on its own line.
{
  echo "# GPU run $(date -u +%F) ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
  grep -E '^(#+ |\|)' "$OUT/log"
  awk -F'|' '/^\| greedy \|/ && NF > 4 { gsub(/ /, "", $4); sub(/×/, "x", $4); print "\ngreedy median " $4; exit }' "$OUT/log"
} > "$OUT/cuda-tables.md"
