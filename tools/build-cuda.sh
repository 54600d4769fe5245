#!/usr/bin/env bash
# Build suffixd with the `cuda` feature, on any x86_64 Linux machine, with or without a GPU.
#   tools/build-cuda.sh [extra cargo build flags]
#   CARGO_COMMAND=test tools/build-cuda.sh [cargo test flags]
#
# The CUDA toolkit comes from NVIDIA's packages on PyPI (nvcc with the crt headers and nvvm
# it needs, the runtime headers, CCCL, NVRTC, cuBLAS, cuRAND), installed into .cuda-toolkit/
# (not committed; reinstalled when the list below changes) and used as CUDA_HOME. Kernels are
# compiled for compute capability 90 (H100/H200) unless CUDA_COMPUTE_CAP says otherwise.
# Never enable candle's `flash-attn`: its build clones CUTLASS from GitHub, and it takes no
# arbitrary mask.
#
# The binary lands in target/cuda/release/suffixd (a target directory of its own, so that the
# CPU build in target/ is not rebuilt). To run it on a GPU machine, put the toolkit's lib/ on
# LD_LIBRARY_PATH (the script prints the line); the driver's libcuda comes from the machine.
set -euo pipefail
cd "$(dirname "$0")/.."

toolkit_root="${SUFFIXD_CUDA_TOOLKIT:-$PWD/.cuda-toolkit}"
# CUDA 13.0, the oldest 13.x: the GPU machines' driver runs 13.x, and the PTX that candle's
# kernels ship is JIT-compiled by that driver, which refuses PTX from a newer toolkit than
# itself. cudarc 0.19 also knows toolkits only up to 13.4.
packages=(
  "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*"
  "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*"
  "nvidia-cuda-nvrtc==13.0.*" "nvidia-cublas==13.0.*" "nvidia-curand==10.4.0.*"
)

cuda_home="$toolkit_root/nvidia/cu13"
stamp="$toolkit_root/.suffixd-packages"
if [ "$(cat "$stamp" 2>/dev/null)" != "${packages[*]}" ]; then
  echo "installing the CUDA toolkit from PyPI into $toolkit_root" >&2
  rm -rf "$toolkit_root"
  python3 -m pip install --quiet --no-deps --target "$toolkit_root" "${packages[@]}"
  echo "${packages[*]}" >"$stamp"
fi
[ -x "$cuda_home/bin/nvcc" ] || { echo "no nvcc under $cuda_home after the install" >&2; exit 1; }

# The wheels ship versioned sonames only; the linker and cudarc's loader want plain names.
for lib in "$cuda_home"/lib/lib*.so.*; do
  plain="${lib%%.so.*}.so"
  [ -e "$plain" ] || ln -s "$(basename "$lib")" "$plain"
done

# candle links the driver library (libcuda.so.1) by name. The driver comes with the GPU
# machine, not with the toolkit packages, so link against a stub that defines every driver
# entry point cuda.h declares and carries the driver's soname: at run time the machine's
# real libcuda.so.1 is the one loaded.
stubs="$cuda_home/lib/stubs"
if [ ! -e "$stubs/libcuda.so" ]; then
  mkdir -p "$stubs"
  gcc -E -P -I "$cuda_home/include" "$cuda_home/include/cuda.h" \
    | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d ' (' | sort -u \
    | awk '{ print "int " $1 "(void) { return 3; /* CUDA_ERROR_NOT_INITIALIZED */ }" }' >"$stubs/libcuda.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stubs/libcuda.so" "$stubs/libcuda.c"
fi
export LIBRARY_PATH="$stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"

export CUDA_HOME="$cuda_home" CUDA_PATH="$cuda_home" CUDA_ROOT="$cuda_home"
export PATH="$cuda_home/bin:$PATH"
export LD_LIBRARY_PATH="$cuda_home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
# nvcc's version, as cudarc spells it (13.5 -> 13050): spares cudarc its own probe.
release=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
read -r major minor <<<"$release"
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-$((major * 1000 + minor * 10))}"
echo "nvcc $major.$minor, compute capability $CUDA_COMPUTE_CAP, CUDARC_CUDA_VERSION=$CUDARC_CUDA_VERSION" >&2

# CARGO_COMMAND=test runs the tests of the CUDA build instead (NVRTC compiles the
# kernels without a GPU: `CARGO_COMMAND=test tools/build-cuda.sh --lib cuda`). On a
# machine without a driver the test binaries load the stub as libcuda.so.1 (every driver
# call then fails, which those tests never make); a machine with one keeps its own.
if [ "${CARGO_COMMAND:-build}" = test ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  ln -sf libcuda.so "$stubs/libcuda.so.1"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$stubs"
fi
cargo "${CARGO_COMMAND:-build}" --release --features cuda --target-dir target/cuda "$@"
[ "${CARGO_COMMAND:-build}" = build ] || exit 0
echo "built target/cuda/release/suffixd"
echo "on the GPU machine: export LD_LIBRARY_PATH=$cuda_home/lib:\$LD_LIBRARY_PATH"
