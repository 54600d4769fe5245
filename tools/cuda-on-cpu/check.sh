#!/usr/bin/env bash
# The CUDA build's GPU tests, on this machine's CPU (README.md in this folder): the
# `families` GPU test (every family on suffixd's kernels, f32 and bf16, from a directory
# and from GGUF: logits against the CPU's pass, and the same bits alone, in a chain, in a
# tree, after a kept branch, after a prefix restored from device blocks and in a 40-row
# pass; the device argmax), about two minutes; the same again with the persistent pass
# (SUFFIXD_CUDA_PERSISTENT=on, on 4 emulated SMs so that blocks take turns and a missing
# wait shows; PERSISTENT=0 leaves it out); then the `verify` tests named in VERIFY
# (none unless set) that switch to the device under SUFFIXD_TEST_DEVICE=cuda, on the
# default 135M model: slow here (`the_gpu_pass_agrees_with_the_cpu_pass`, a 300-token
# prefill in f32 and bf16, took 25 minutes). Builds the test binaries first
# (tools/build-cuda.sh). Exits non-zero if a test fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERIFY="${VERIFY:-}"
CARGO_COMMAND=test tools/build-cuda.sh --no-run --test families --test verify 2>&1 | tail -3
binary() { ls -t target/cuda/release/deps/"$1"-* | grep -v '\.d$' | head -1; }
export LD_LIBRARY_PATH="$PWD/.cuda-toolkit/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
tools/cuda-on-cpu/run.sh "$(binary families)" on_a_gpu --nocapture --test-threads=1 2>&1 \
  | grep -v 'no version information' || status=1
if [ "${PERSISTENT:-1}" = 1 ]; then
  echo "== the same with SUFFIXD_CUDA_PERSISTENT=on"
  SUFFIXD_CUDA_PERSISTENT=on CUDA_ON_CPU_SMS=4 tools/cuda-on-cpu/run.sh "$(binary families)" on_a_gpu \
    --nocapture --test-threads=1 2>&1 | grep -v 'no version information' || status=1
fi
for t in $VERIFY; do
  tools/cuda-on-cpu/run.sh "$(binary verify)" "$t" --exact --nocapture --test-threads=1 2>&1 \
    | grep -v 'no version information' || status=1
done
exit $status
