#!/usr/bin/env bash
# The CUDA build's GPU tests, on this machine's CPU (README.md in this folder): the
# `families` GPU test (every family on suffixd's kernels, f32 and bf16, from a directory
# and from GGUF: logits against the CPU's pass, and the same bits alone, in a chain, in a
# tree and after a prefix restored from device blocks), then the `verify` tests named in
# VERIFY that switch to the device under SUFFIXD_TEST_DEVICE=cuda. Builds the test
# binaries first (tools/build-cuda.sh). Prints each test's result; exits non-zero if one
# fails. About ten minutes on two cores, most of it the 135M model's passes.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERIFY="${VERIFY:-the_gpu_pass_agrees_with_the_cpu_pass the_greedy_argmax_is_the_cpus_on_every_device}"
CARGO_COMMAND=test tools/build-cuda.sh --no-run --test families --test verify 2>&1 | tail -3
binary() { ls -t target/cuda/release/deps/"$1"-* | grep -v '\.d$' | head -1; }
export LD_LIBRARY_PATH="$PWD/.cuda-toolkit/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
tools/cuda-on-cpu/run.sh "$(binary families)" on_a_gpu --nocapture --test-threads=1 2>&1 \
  | grep -v 'no version information' || status=1
for t in $VERIFY; do
  tools/cuda-on-cpu/run.sh "$(binary verify)" "$t" --exact --nocapture --test-threads=1 2>&1 \
    | grep -v 'no version information' || status=1
done
exit $status
