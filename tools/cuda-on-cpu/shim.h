// CUDA C++ as the CPU runs it: what suffixd's kernels (src/model/cuda/*.cu) use of the
// device language, for the CPU emulator in this folder (README.md). A block's threads are
// fibers run by driver.cpp's scheduler one after another; `__syncthreads` and every warp
// operation (shuffles, the tensor-core product) are points where a thread waits for the
// others of its block or warp. Blocks run one at a time, so `__shared__` is a static; the
// driver fills the module's statics (its .bss: the kernels have no other) with 0xff bytes
// before each block, as a GPU's shared memory holds no earlier block's values either.
//
// Arithmetic is the CPU's IEEE single precision, rounded to nearest at every operation
// (compiled with -ffp-contract=off, as NVRTC compiles them with --fmad=false): the
// `__f*_rn` intrinsics are the plain operators, `fmaf` is one rounding. `expf` is the C
// library's, which may differ from CUDA's in the last place: bits can differ from a GPU's,
// never between two rows of one emulated pass.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <type_traits>
#include <utility>

#define SUFFIXD_CUDA_ON_CPU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__

struct dim3 {
    unsigned x, y, z;
};
struct float4 {
    float x, y, z, w;
} __attribute__((aligned(16)));
struct uint4 {
    unsigned x, y, z, w;
} __attribute__((aligned(16)));

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

// The running thread's coordinates (driver.cpp sets them before it resumes a fiber; one
// launch runs at a time in a process).
extern "C" {
extern dim3 emu_thread_idx, emu_block_idx, emu_block_dim, emu_grid_dim;
// Wait for every live thread of the block, or of the warp.
void emu_syncthreads();
// A warp exchange: this lane's 8 bytes in, lane `from`'s out (after every live lane of
// the warp has put its own in).
unsigned long long emu_shuffle(unsigned long long mine, int from_xor);
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, as the PTX ISA lays its fragments
// out over the warp's lanes.
void emu_mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1);
// bar.sync id, threads: wait until `threads` threads of the block have reached barrier `id`.
void emu_named_barrier(int id, int threads);
// A cooperative launch's counters: wait (letting other blocks run) until *counter reaches
// target; add one.
void emu_wait_for_count(const unsigned* counter, unsigned target);
void emu_count_one(unsigned* counter);
}
#define threadIdx emu_thread_idx
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim

inline void __syncthreads() { emu_syncthreads(); }
inline void __threadfence() {}

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    unsigned long long in = 0, out;
    std::memcpy(&in, &v, sizeof(T));
    out = emu_shuffle(in, lane_mask);
    T r;
    std::memcpy(&r, &out, sizeof(T));
    return r;
}

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
#include <math.h>  // expf, fabsf, fmaf, fmaxf as C declares them
using std::max;
using std::min;
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *(const volatile T*)p; }
inline int atomicAdd(int* p, int v) { int old = *p; *p = old + v; return old; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned old = *p; *p = old + v; return old; }
inline float atomicAdd(float* p, float v) { float old = *p; *p = old + v; return old; }

// cvt.rn.bf16x2.f32: `high` rounded to nearest even into the upper half, `low` into the
// lower; a NaN becomes the canonical one.
inline unsigned short emu_bf16_rn(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline unsigned emu_bf16x2_rn(float low, float high) {
    return ((unsigned)emu_bf16_rn(high) << 16) | emu_bf16_rn(low);
}

// A kernel's entry as the driver launches it: its parameters from the launch's array of
// pointers to their values, and their sizes (for copies into a captured graph).
template <typename F, F f> struct EmuEntry;
template <typename... A, void (*f)(A...)> struct EmuEntry<void (*)(A...), f> {
    template <size_t... I>
    static void call(void** p, std::index_sequence<I...>) {
        f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
    }
    static void run(void** params) { call(params, std::index_sequence_for<A...>{}); }
    static constexpr size_t sizes[sizeof...(A) + 1] = {sizeof(A)..., 0};
};

struct EmuKernel {
    const char* name;
    void (*run)(void** params);
    const size_t* param_sizes;  // ends with 0
};
#define EMU_KERNEL(name) {#name, &EmuEntry<decltype(&name), &name>::run, EmuEntry<decltype(&name), &name>::sizes}
