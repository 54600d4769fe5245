#!/usr/bin/env bash
# Run a command of suffixd's CUDA build on this machine's CPU, through the emulated driver
# in this folder (README.md): builds it into target/cuda-on-cpu/ when its sources are newer,
# then runs the command with that folder first on the library path, so that the binary's
# libcuda.so.1, libnvrtc, libcublas, libcublasLt and libcurand are all the emulator.
#   tools/cuda-on-cpu/run.sh target/cuda/release/deps/families-HASH on_a_gpu --nocapture
# Needs the CUDA toolkit's headers (tools/build-cuda.sh installs them) and g++.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
toolkit="${SUFFIXD_CUDA_TOOLKIT:-$root/.cuda-toolkit}/nvidia/cu13"
out="$root/target/cuda-on-cpu"
library="$out/libcuda-on-cpu.so"
include="$toolkit/include"
[ -e "$include/cuda.h" ] || { echo "no CUDA headers under $include: run tools/build-cuda.sh once" >&2; exit 1; }

if [ ! -e "$library" ] || [ -n "$(find "$here" -newer "$library" -name "*.[ch]*")" ]; then
  mkdir -p "$out"
  # Every entry point the headers declare, as a weak stub that names itself and fails;
  # driver.cpp's definitions take their place.
  {
    echo 'int emu_stub(const char* name);'
    for h in cuda.h nvrtc.h cublas_v2.h cublasLt.h curand.h; do gcc -E -P -I "$include" "$include/$h"; done \
      | grep -oE '\b(cu|nvrtc|cublas|curand)[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d ' (' | sort -u \
      | awk '{ print "__attribute__((weak)) int " $1 "(void) { return emu_stub(\"" $1 "\"); }" }'
  } >"$out/stubs.c"
  gcc -O1 -fPIC -c "$out/stubs.c" -o "$out/stubs.o"
  g++ -std=c++17 -O2 -fPIC -shared -I "$include" -I "$here" "$here"/{driver,threads,candle}.cpp "$out/stubs.o" -ldl -o "$library.tmp"
  mv "$library.tmp" "$library"
  cp "$here/shim.h" "$out/shim.h"
  for name in libcuda.so.1 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
    ln -sf libcuda-on-cpu.so "$out/$name"
  done
  echo "built $library" >&2
fi
[ $# -gt 0 ] || exit 0
export LD_LIBRARY_PATH="$out${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SUFFIXD_TEST_DEVICE="${SUFFIXD_TEST_DEVICE:-cuda}"
exec "$@"
