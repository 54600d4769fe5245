// suffixd's device kernels for the forward pass of every family (Llama, Mistral, Qwen 2
// and 3, Gemma 3), compiled at run time by NVRTC (src/model/cuda/mod.rs). Every one is
// row-invariant: a row's result is computed by the same operations in the same order
// whatever else is in the pass (how many rows, which sequences, where the row sits in its
// tile), so a token verified inside a draft gets the bits plain decoding gives it. The
// rules that buy this:
//   - each output is one thread's or one warp's fixed-order chain of explicit fmaf
//     (compiled with --fmad=false, so nothing is contracted behind our back), reduced
//     across the warp by a fixed xor butterfly;
//   - a row's arithmetic is the same in every tile size and tile position (a short tile
//     repeats its last row and drops the copies), and nothing is split along K by row
//     count, so the host may pick the tile (1, 4 or 8 rows) by the pass's row count;
//   - attention walks a row's keys in chunks fixed by the key's absolute index, so the
//     committed prefix and the draft's ancestors chunk exactly as plain decoding does;
//     chunk c goes to split c mod ATTN_SPLITS, a constant, and the splits' partial
//     softmaxes are combined in split order, whichever block finishes last;
//   - the greedy argmax's ties go to the lowest index, as on the CPU.
// Weights are f32 or bf16 (raw 16-bit words, widened by a shift: exact).

typedef unsigned short bf16_t;
typedef unsigned long long u64;

// Tuning constants; the host may pass others as -D options (mod.rs). Each is fixed for a
// process, never picked per pass, so it changes speed (and, for ATTN_SPLITS, which
// order attention's sums take), never row invariance.
#ifndef WARPS_PER_BLOCK
#define WARPS_PER_BLOCK 4
#endif
#ifndef ATTN_SPLITS
#define ATTN_SPLITS 16
#endif
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 16));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 8));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return v;
}

// ---- Programmatic dependent launch (sm_90 and later, when DEPENDENT_LAUNCH is 1) ----
// The host may launch a pass's kernels so that each one's blocks start while the kernel
// before it drains (cudaLaunchAttributeProgrammaticStreamSerialization; launch.rs). Every
// kernel a pass launches begins with `let_next_kernel_start`, which lets the next kernel
// launch once every block of this one has begun (so it fills this one's last wave), and
// `wait_for_previous_kernel`, which returns when the kernel before has finished and its
// writes are visible. Between the two a projection only asks L2 for its weights, which no
// kernel writes; nothing before the wait reads or writes anything a kernel writes. Every
// block waits before it may return, so a kernel's completion still implies its
// predecessors', as in plain stream order. No sum changes order: the same bits. A kernel
// launched without the attribute returns from the wait at once; below sm_90, or with
// DEPENDENT_LAUNCH 0, none of the three is compiled. Only kernel parameters (constant
// memory) are read before the wait.
#ifndef DEPENDENT_LAUNCH
#define DEPENDENT_LAUNCH 0
#endif
#if DEPENDENT_LAUNCH && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ON 1
#else
#define PDL_ON 0
#endif

__device__ __forceinline__ void let_next_kernel_start() {
#if PDL_ON
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_kernel() {
#if PDL_ON
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Ask L2 for the 128-byte line holding `p` (weights only: see above). Callers ask only
// where something overlaps the loads: a dependent launch's wait (PDL_ON), or the
// persistent pass's wait for the stage before (persistent.cu).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// Ask L2 for `rows` whole weight rows of `row_bytes` bytes, row i starting at
// w + row_at(i) * row_bytes, each line by one of `threads` threads (this one is `t`).
template <typename RowAt>
__device__ __forceinline__ void prefetch_rows_l2(const void* w, int row_bytes, int rows, RowAt row_at,
                                                 int t, int threads) {
    const int lines = (row_bytes + 127) / 128;
    for (int i = t; i < rows * lines; i += threads) {
        const int row = row_at(i / lines);
        if (row >= 0) prefetch_l2((const char*)w + (size_t)row * row_bytes + (size_t)(i % lines) * 128);
    }
}

// ---- Where a body runs: a kernel of its own, or a stage of the persistent pass ----
// The tensor-core projections, attention and qkv_heads are written once, as bodies that
// take their block's coordinates, their block barrier and their wait for the work before
// them from a grid type G: KernelGrid when the body is its own kernel (its blockIdx,
// __syncthreads, the dependent-launch entry above), StageGrid (persistent.cu) when it
// runs as one stage of the persistent pass. A block's arithmetic is the same either way.
struct Idx3 {
    unsigned x, y, z;
};

struct KernelGrid {
    // Ask L2 for the weights before the wait only where the wait lets them overlap.
    static constexpr bool PREFETCH = PDL_ON;
    __device__ __forceinline__ Idx3 block() const { return Idx3{blockIdx.x, blockIdx.y, blockIdx.z}; }
    __device__ __forceinline__ Idx3 dims() const { return Idx3{gridDim.x, gridDim.y, gridDim.z}; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
    __device__ __forceinline__ void start_next() const { let_next_kernel_start(); }
    __device__ __forceinline__ void wait_previous() const { wait_for_previous_kernel(); }
};

__device__ __forceinline__ float bf16_to_f32(bf16_t b) {
    return __uint_as_float(((unsigned)b) << 16);
}

// A sequence's KV buffer holds [layer][key|value][capacity][kv_heads * head_dim] floats.
__device__ __forceinline__ float* kv_row(u64 base, int cap, int kvw, int layer, int kind, int slot) {
    return (float*)base + ((size_t)(layer * 2 + kind) * cap + slot) * kvw;
}

// What every projection takes. Pointers first (8 bytes each), then 4-byte fields, so the
// host's #[repr(C)] copy (MatmulArgs in mod.rs) has the same layout.
struct MatmulArgs {
    const float* x;          // input rows, rows_in x k
    const int* row_map;      // output row r reads input row row_map[r]; null: r
    const float* norm_w;     // fused RMS norm of the input row; null: none
    const void* w;           // weights, n x k (f32 or bf16)
    float* out;              // output rows, out_stride apart
    const float* resid;      // MODE_RESIDUAL: added to the product (may equal out)
    const float* cos_tab;    // MODE_QKV: RoPE tables, [position][head_dim / 2]
    const float* sin_tab;
    const int* meta;         // MODE_QKV: the pass's per-row fields (see ROW_* below)
    float* q_out;            // MODE_QKV: queries, rows x q_width
    int k;
    int groups;              // column groups of 4 (2 outputs each in MODE_SILU)
    int rows;
    int out_stride;
    float eps;
    int q_width;             // MODE_QKV: heads * head_dim
    int kv_width;            // MODE_QKV: kv_heads * head_dim; MODE_SILU: the ffn width
    int head_dim;
    int layer;
    int meta_rows;           // rows in meta's per-row arrays
};

// The per-row arrays of a pass, one after another in `meta` (each meta_rows long).
#define ROW_POS 0      // position in the sequence
#define ROW_SLOT 1     // KV slot its key and value go to
#define ROW_CAP 2      // its sequence's KV capacity
#define ROW_BASE_LO 3  // its sequence's KV buffer address, low and high words
#define ROW_BASE_HI 4
#define ROW_CTX 5      // committed tokens before the pass
#define ROW_ANC_OFF 6  // where its in-pass keys start in the ancestor list
#define ROW_ANC_LEN 7  // how many in-pass keys (ancestors, then itself)
#define ROW_FIELDS 8

__device__ __forceinline__ int meta_of(const int* meta, int rows, int field, int r) {
    return meta[field * rows + r];
}
__device__ __forceinline__ u64 base_of(const int* meta, int rows, int r) {
    return (u64)(unsigned)meta_of(meta, rows, ROW_BASE_LO, r)
         | ((u64)(unsigned)meta_of(meta, rows, ROW_BASE_HI, r) << 32);
}

// Where output n of row r of the q|k|v projection goes: the row's query, or its key or
// value slot in its sequence's KV cache (n and n + 1 land side by side for even n).
__device__ __forceinline__ float* qkv_out(const MatmulArgs& a, int r, int n) {
    if (n < a.q_width) return a.q_out + (size_t)r * a.q_width + n;
    const int kind = n < a.q_width + a.kv_width ? 0 : 1;
    const int col = n - a.q_width - kind * a.kv_width;
    return kv_row(base_of(a.meta, a.meta_rows, r), meta_of(a.meta, a.meta_rows, ROW_CAP, r),
                  a.kv_width, a.layer, kind, meta_of(a.meta, a.meta_rows, ROW_SLOT, r)) + col;
}

#define MODE_PLAIN 0
#define MODE_RESIDUAL 1
#define MODE_SILU 2
#define MODE_QKV 3

// Loads 4 consecutive weights (f32) or 8 (bf16) of row `row` at column `col`.
template <typename W> struct Vec;
template <> struct Vec<float> {
    static constexpr int N = 4;
    __device__ static __forceinline__ void load(const void* w, int k, int row, int col, float* v) {
        float4 a = *(const float4*)((const float*)w + (size_t)row * k + col);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    }
};
template <> struct Vec<bf16_t> {
    static constexpr int N = 8;
    __device__ static __forceinline__ void load(const void* w, int k, int row, int col, float* v) {
        uint4 a = *(const uint4*)((const bf16_t*)w + (size_t)row * k + col);
        unsigned p[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = __uint_as_float(p[i] << 16);
            v[2 * i + 1] = __uint_as_float(p[i] & 0xffff0000u);
        }
    }
};

// One warp computes four weight rows' dot products with every row of the pass, ROW_TILE
// rows at a time, and writes them as MODE says. Lane l reads columns l*N.., then
// l*N + 32*N.., and so on; its partial sums meet in warp_sum.
template <typename W, int MODE, int ROW_TILE>
__device__ __forceinline__ void matmul_warp(const MatmulArgs& a) {
    constexpr int N = Vec<W>::N;
    const int lane = threadIdx.x & 31;
    const int g = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    // Weight row c of this warp's four: rows 4g..4g+3, or in MODE_SILU gate rows 2g,
    // 2g+1, then the matching up rows.
    auto row_of = [&](int c) {
        return MODE == MODE_SILU ? (c < 2 ? 2 * g + c : a.kv_width + 2 * g + c - 2) : 4 * g + c;
    };
    let_next_kernel_start();
    if (PDL_ON && g < a.groups) prefetch_rows_l2(a.w, a.k * (int)sizeof(W), 4, row_of, lane, 32);
    wait_for_previous_kernel();
    if (g >= a.groups) return;
    int wrow[4];
#pragma unroll
    for (int c = 0; c < 4; c++) wrow[c] = row_of(c);
    for (int r0 = 0; r0 < a.rows; r0 += ROW_TILE) {
        const float* xr[ROW_TILE];
        float inv[ROW_TILE];
#pragma unroll
        for (int j = 0; j < ROW_TILE; j++) {
            int r = min(r0 + j, a.rows - 1);
            int ri = a.row_map ? a.row_map[r] : r;
            xr[j] = a.x + (size_t)ri * a.k;
            inv[j] = 1.0f;
        }
        if (a.norm_w) {
            // Every row's sum of squares in the same lane order; the rows side by side so
            // their loads overlap.
            float ss[ROW_TILE];
#pragma unroll
            for (int j = 0; j < ROW_TILE; j++) ss[j] = 0.0f;
#pragma unroll 4
            for (int col = lane * 4; col < a.k; col += 128) {
#pragma unroll
                for (int j = 0; j < ROW_TILE; j++) {
                    float4 v = *(const float4*)(xr[j] + col);
                    ss[j] = fmaf(v.x, v.x, ss[j]);
                    ss[j] = fmaf(v.y, v.y, ss[j]);
                    ss[j] = fmaf(v.z, v.z, ss[j]);
                    ss[j] = fmaf(v.w, v.w, ss[j]);
                }
            }
#pragma unroll
            for (int j = 0; j < ROW_TILE; j++) {
                float total = warp_sum(ss[j]);
                inv[j] = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)a.k), a.eps)));
            }
        }
        float acc[ROW_TILE][4];
#pragma unroll
        for (int j = 0; j < ROW_TILE; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[j][c] = 0.0f;
        // Unrolled so that a one-row tile has several chunks' weight loads in flight
        // at once: its time is their latency, not arithmetic. (Unrolling keeps every
        // chain's order.) Wider tiles have the registers for one chunk only.
#pragma unroll(ROW_TILE == 1 ? 4 : 1)
        for (int col = lane * N; col < a.k; col += 32 * N) {
            float wv[4][N];
#pragma unroll
            for (int c = 0; c < 4; c++) Vec<W>::load(a.w, a.k, wrow[c], col, wv[c]);
            float gv[N];
            if (a.norm_w) {
#pragma unroll
                for (int e = 0; e < N; e += 4) {
                    float4 t = *(const float4*)(a.norm_w + col + e);
                    gv[e] = t.x; gv[e + 1] = t.y; gv[e + 2] = t.z; gv[e + 3] = t.w;
                }
            }
#pragma unroll
            for (int j = 0; j < ROW_TILE; j++) {
                float xv[N];
#pragma unroll
                for (int e = 0; e < N; e += 4) {
                    float4 t = *(const float4*)(xr[j] + col + e);
                    xv[e] = t.x; xv[e + 1] = t.y; xv[e + 2] = t.z; xv[e + 3] = t.w;
                }
                if (a.norm_w) {
#pragma unroll
                    for (int e = 0; e < N; e++) xv[e] = __fmul_rn(__fmul_rn(xv[e], inv[j]), gv[e]);
                }
#pragma unroll
                for (int c = 0; c < 4; c++)
#pragma unroll
                    for (int e = 0; e < N; e++) acc[j][c] = fmaf(xv[e], wv[c][e], acc[j][c]);
            }
        }
#pragma unroll
        for (int j = 0; j < ROW_TILE; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[j][c] = warp_sum(acc[j][c]);
        // Lane 4j + c writes row r0 + j's output c (all lanes hold every sum).
        const int j = lane >> 2, c = lane & 3;
        const int r = r0 + j;
        float mine = 0.0f, pair_even = 0.0f, pair_odd = 0.0f, up = 0.0f;
#pragma unroll
        for (int jj = 0; jj < ROW_TILE; jj++)
#pragma unroll
            for (int cc = 0; cc < 4; cc++)
                if (jj == j && cc == c) {
                    mine = acc[jj][cc];
                    pair_even = acc[jj][cc & 2];
                    pair_odd = acc[jj][(cc & 2) + 1];
                    up = acc[jj][(cc & 1) + 2];
                }
        if (j >= ROW_TILE || r >= a.rows) continue;
        if (MODE == MODE_PLAIN) {
            a.out[(size_t)r * a.out_stride + 4 * g + c] = mine;
        } else if (MODE == MODE_RESIDUAL) {
            size_t at = (size_t)r * a.out_stride + 4 * g + c;
            a.out[at] = __fadd_rn(a.resid[at], mine);
        } else if (MODE == MODE_SILU) {
            if (c < 2) {
                // silu(gate) * up, with the gate's exp in the same order every time.
                float gate = mine;
                float s = __fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate)));
                a.out[(size_t)r * a.out_stride + 2 * g + c] = __fmul_rn(s, up);
            }
        } else {  // MODE_QKV
            const int n = 4 * g + c;
            const int pos = meta_of(a.meta, a.meta_rows, ROW_POS, r);
            float value = mine;
            const bool rotate = n < a.q_width + a.kv_width;
            if (rotate) {
                const int half = a.head_dim / 2;
                const int i = (n % a.head_dim) / 2;
                const float cs = a.cos_tab[(size_t)pos * half + i];
                const float sn = a.sin_tab[(size_t)pos * half + i];
                value = (c & 1) == 0
                    ? __fsub_rn(__fmul_rn(pair_even, cs), __fmul_rn(pair_odd, sn))
                    : __fadd_rn(__fmul_rn(pair_even, sn), __fmul_rn(pair_odd, cs));
            }
            *qkv_out(a, r, n) = value;
        }
    }
}

#define MATMUL_KERNEL(name, W, MODE, TILE) \
    extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * 32) name##_r##TILE(MatmulArgs a) { \
        matmul_warp<W, MODE, TILE>(a); \
    }
#define MATMUL_TILES(name, W, MODE) \
    MATMUL_KERNEL(name, W, MODE, 1) MATMUL_KERNEL(name, W, MODE, 4) MATMUL_KERNEL(name, W, MODE, 8)
MATMUL_TILES(matmul_plain_f32, float, MODE_PLAIN)
MATMUL_TILES(matmul_plain_bf16, bf16_t, MODE_PLAIN)
MATMUL_TILES(matmul_residual_f32, float, MODE_RESIDUAL)
MATMUL_TILES(matmul_residual_bf16, bf16_t, MODE_RESIDUAL)
MATMUL_TILES(matmul_silu_f32, float, MODE_SILU)
MATMUL_TILES(matmul_silu_bf16, bf16_t, MODE_SILU)
MATMUL_TILES(matmul_qkv_f32, float, MODE_QKV)
MATMUL_TILES(matmul_qkv_bf16, bf16_t, MODE_QKV)

// ---- The projections on the tensor cores (bf16 weights, sm_80 and later) ----
// mma.m16n8k16 multiplies a tile of 16 activation rows by 8 weight rows, 16 columns at a
// time, accumulating in f32. Activations are f32: each enters as two bf16, its rounding
// `hi` and the rest `lo` (x - hi is exact; it is rounded again), so the product keeps
// about 16 bits of every activation. A row's value depends on its own inputs alone: it
// takes the same instructions in the same order whichever slot of whichever tile holds
// it, and however many tiles a block carries, so the host picks 1, 2 or 4 tiles of 16
// rows by the pass's row count (a pass past one block's rows is spread over blocks along
// the grid's y), and a draft of 16 rows streams the weights once, as one row does. The fused RMS norm scales the product by the row's 1/rms after it (the sum
// of squares is gathered from the same loads, in a fixed order), and multiplies the
// norm's weight into the activations before it.
//
// One block of KSPLIT warps computes one tile of 8 outputs. K is cut into chunks of 32
// columns; warp w takes chunks w, w + KSPLIT, ... (a split fixed for the matrix, never
// by the row count), several chunks' weights loaded at once, so a one-row projection
// waits for memory about once rather than once per chunk, and each warp converts only
// its own chunks' activations. The warps' partial sums meet in shared memory, added in
// warp order. KSPLIT is MMA_KSPLIT for the layers' projections and MMA_HEAD_KSPLIT for
// the head (host-tuned; docs/gpu.md).
#ifndef MMA_KSPLIT
#define MMA_KSPLIT 8
#endif
#ifndef MMA_HEAD_KSPLIT
#define MMA_HEAD_KSPLIT 4
#endif
// Chunks whose weights a warp loads before it multiplies any of them. (Loading their
// activations early too was slower on an H100: the registers cost more warps than the
// waits they saved.)
#define MMA_PREFETCH 4

// Two activations as (hi, lo) bf16 pairs, the first in the low half of each register:
// hi is each one rounded to nearest even, lo the rest (x - hi is exact), rounded again.
// One cvt.rn.bf16x2.f32 per pair (sm_80 and later), which rounds as round-to-nearest-
// even always does; only a NaN's payload may differ from a hand-written rounding, and a
// row's arithmetic is the same whichever pass it is in either way.
__device__ __forceinline__ unsigned bf16x2_rn(float low, float high) {
#ifdef SUFFIXD_CUDA_ON_CPU  // tools/cuda-on-cpu: the same rounding in C++
    return emu_bf16x2_rn(low, high);
#else
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
    return packed;
#endif
}
__device__ __forceinline__ void split_pair(float x0, float x1, unsigned& hi, unsigned& lo) {
    hi = bf16x2_rn(x0, x1);
    lo = bf16x2_rn(__fsub_rn(x0, __uint_as_float(hi << 16)),
                   __fsub_rn(x1, __uint_as_float(hi & 0xffff0000u)));
}

// Not volatile: the product has no side effect, and the compiler may then hoist the next
// chunks' loads above it.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#ifdef SUFFIXD_CUDA_ON_CPU  // tools/cuda-on-cpu: the warp's product, fragment by fragment
    emu_mma_bf16(d, a, b0, b1);
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// A lane's 8 activations of one row (zeros for a row past the pass) at column k0.
__device__ __forceinline__ void load_row8(const float* xr, int k0, float (&xv)[8]) {
    if (xr) {
        const float4 p = *(const float4*)(xr + k0);
        const float4 q = *(const float4*)(xr + k0 + 4);
        xv[0] = p.x; xv[1] = p.y; xv[2] = p.z; xv[3] = p.w;
        xv[4] = q.x; xv[5] = q.y; xv[6] = q.z; xv[7] = q.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) xv[e] = 0.0f;
    }
}

// The weight row that row g (0..7) of output tile `tile` multiplies: 8 consecutive rows,
// or in MODE_SILU 4 gates and their 4 ups.
template <int MODE>
__device__ __forceinline__ int mma_weight_row(const MatmulArgs& a, int tile, int g) {
    return MODE == MODE_SILU ? (g < 4 ? 4 * tile + g : a.kv_width + 4 * tile + g - 4) : 8 * tile + g;
}

// Tiles tile0 .. tile0 + NT - 1 of 8 outputs each (MODE_SILU: 4 gates and their 4 ups)
// for the rows of this block's row groups, 16 * TILES rows at a time. Lane (g = lane / 4,
// t = lane % 4) feeds weight row g of each tile and activation rows g and g + 8 of each
// row tile, columns 8t..8t+7 of each chunk of 32: the mma's k slots 2t, 2t+1, 2t+8, 2t+9
// take columns 8t+0..3 in its first k16 step and 8t+4..7 in its second, for A and B
// alike, so every column meets its own weight. Needs k a multiple of 32.
//
// NT (output tiles per block) changes how often the activations are read and converted,
// never an output's arithmetic: each output takes the same products in the same order
// from its warp's chunks, and the same warp-order sum, whether its block holds one tile
// or four. A block of NT = 1 streams the weights with the most blocks in flight (a
// one-row step waits on memory); NT > 1 reads and splits each activation once for NT
// tiles, which is what a pass of many rows costs (the host picks by row count).
template <int MODE, int TILES, int NT, int KSPLIT, typename G>
__device__ __forceinline__ void matmul_mma_block(const MatmulArgs& a, const G& grid) {
    // Per warp, per row tile: 4 products of each output tile, then the 2 rows' sums of
    // squares.
    __shared__ float parts[KSPLIT][TILES][4 * NT + 2][32];
    // Chunks whose weights a warp loads before it multiplies any: about four weight
    // loads in flight per lane whatever NT is.
    constexpr int PREFETCH = NT >= MMA_PREFETCH ? 1 : MMA_PREFETCH / NT;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const Idx3 block = grid.block();
    const int tile0 = block.x * NT;
    grid.start_next();
    // The blocks of other row groups (block.y) read the same weights.
    if (G::PREFETCH && block.y == 0)
        prefetch_rows_l2(a.w, a.k * 2, 8 * NT, [&](int i) {
            const int tile = tile0 + i / 8;
            return tile < a.groups ? mma_weight_row<MODE>(a, tile, i % 8) : -1;
        }, threadIdx.x, KSPLIT * 32);
    grid.wait_previous();
    if (tile0 >= a.groups) return;  // the whole block: no barrier is left waiting
    const bf16_t* wp[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int tile = tile0 + j;
        // A tile past the matrix (when NT does not divide it) multiplies zeros.
        wp[j] = tile < a.groups
            ? (const bf16_t*)a.w + (size_t)mma_weight_row<MODE>(a, tile, g) * a.k + 8 * t
            : nullptr;
    }
    const float* gp = a.norm_w ? a.norm_w + 8 * t : nullptr;
    const int chunks = a.k / 32;
    for (int r0 = 16 * TILES * block.y; r0 < a.rows; r0 += 16 * TILES * grid.dims().y) {
        const float* xr[TILES][2];
#pragma unroll
        for (int i = 0; i < TILES; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = r0 + 16 * i + 8 * h + g;
                xr[i][h] = nullptr;  // a row past the pass: zeros, its output dropped
                if (r < a.rows) xr[i][h] = a.x + (size_t)(a.row_map ? a.row_map[r] : r) * a.k + 8 * t;
            }
        float acc[TILES][NT][4], ss[TILES][2];
#pragma unroll
        for (int i = 0; i < TILES; i++) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;
            ss[i][0] = 0.0f; ss[i][1] = 0.0f;
        }
        // Halves of a tile past the pass's rows (a one-row pass fills one row of the
        // first half) enter as zeros without being loaded or converted: the same bits.
        bool half_live[TILES][2];
#pragma unroll
        for (int i = 0; i < TILES; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) half_live[i][h] = r0 + 16 * i + 8 * h < a.rows;
        for (int c0 = warp; c0 < chunks; c0 += KSPLIT * PREFETCH) {
            // The group's weights are all in flight before the first product.
            uint4 wv[PREFETCH][NT];
#pragma unroll
            for (int u = 0; u < PREFETCH; u++) {
                const int c = c0 + u * KSPLIT;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    wv[u][j] = make_uint4(0u, 0u, 0u, 0u);
                    if (c < chunks && wp[j]) wv[u][j] = __ldg((const uint4*)(wp[j] + 32 * c));
                }
            }
#pragma unroll
            for (int u = 0; u < PREFETCH; u++) {
                const int c = c0 + u * KSPLIT;
                if (c >= chunks) break;
                const int k0 = 32 * c;
                float gw[8];
                if (gp) {
                    const float4 g0 = *(const float4*)(gp + k0), g1 = *(const float4*)(gp + k0 + 4);
                    gw[0] = g0.x; gw[1] = g0.y; gw[2] = g0.z; gw[3] = g0.w;
                    gw[4] = g1.x; gw[5] = g1.y; gw[6] = g1.z; gw[7] = g1.w;
                }
#pragma unroll
                for (int i = 0; i < TILES; i++) {
                    unsigned hi[2][4], lo[2][4];  // [k16 step][A register]
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (!half_live[i][h]) {
                            hi[0][h] = lo[0][h] = hi[0][2 + h] = lo[0][2 + h] = 0u;
                            hi[1][h] = lo[1][h] = hi[1][2 + h] = lo[1][2 + h] = 0u;
                            continue;
                        }
                        float xv[8];
                        load_row8(xr[i][h], k0, xv);
                        if (gp) {
#pragma unroll
                            for (int e = 0; e < 8; e++) {
                                ss[i][h] = fmaf(xv[e], xv[e], ss[i][h]);
                                xv[e] = __fmul_rn(xv[e], gw[e]);
                            }
                        }
                        // A register h holds row g + 8h at slots 2t, 2t+1; register 2 + h
                        // at slots 2t+8, 2t+9.
                        split_pair(xv[0], xv[1], hi[0][h], lo[0][h]);
                        split_pair(xv[2], xv[3], hi[0][2 + h], lo[0][2 + h]);
                        split_pair(xv[4], xv[5], hi[1][h], lo[1][h]);
                        split_pair(xv[6], xv[7], hi[1][2 + h], lo[1][2 + h]);
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        mma_bf16(acc[i][j], hi[0], wv[u][j].x, wv[u][j].y);
                        mma_bf16(acc[i][j], lo[0], wv[u][j].x, wv[u][j].y);
                        mma_bf16(acc[i][j], hi[1], wv[u][j].z, wv[u][j].w);
                        mma_bf16(acc[i][j], lo[1], wv[u][j].z, wv[u][j].w);
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < TILES; i++) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) parts[warp][i][4 * j + c][lane] = acc[i][j][c];
            parts[warp][i][4 * NT][lane] = ss[i][0];
            parts[warp][i][4 * NT + 1][lane] = ss[i][1];
        }
        grid.sync();
        // (Row tile i, output tile j)'s epilogue is warp (i * NT + j) mod KSPLIT's; every
        // warp sums the parts in warp order.
        for (int p = warp; p < TILES * NT; p += KSPLIT) {
            const int i = p / NT, j = p % NT, tile = tile0 + j;
            if (tile >= a.groups) continue;  // warp-uniform
            float sum[6];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                sum[c] = parts[0][i][4 * j + c][lane];
#pragma unroll
                for (int w = 1; w < KSPLIT; w++) sum[c] = __fadd_rn(sum[c], parts[w][i][4 * j + c][lane]);
            }
#pragma unroll
            for (int c = 4; c < 6; c++) {
                sum[c] = parts[0][i][4 * NT + c - 4][lane];
#pragma unroll
                for (int w = 1; w < KSPLIT; w++) sum[c] = __fadd_rn(sum[c], parts[w][i][4 * NT + c - 4][lane]);
            }
            // Lane (g, t) holds outputs 2t, 2t+1 of rows g (sum[0..1]) and g+8 (sum[2..3]).
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float v0 = sum[2 * h], v1 = sum[2 * h + 1];
                if (gp) {
                    // The row's sum of squares: its four lanes' parts, by a butterfly
                    // every lane sums in the same order.
                    float s = sum[4 + h];
                    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));
                    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
                    const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(s, (float)a.k), a.eps)));
                    v0 = __fmul_rn(v0, inv);
                    v1 = __fmul_rn(v1, inv);
                }
                float u0 = 0.0f, u1 = 0.0f;
                if (MODE == MODE_SILU) {
                    // Lane t < 2 holds gates 2t, 2t+1; lane t + 2 the matching ups.
                    u0 = __shfl_xor_sync(0xffffffffu, v0, 2);
                    u1 = __shfl_xor_sync(0xffffffffu, v1, 2);
                }
                const int r = r0 + 16 * i + 8 * h + g;
                if (r >= a.rows) continue;
                if (MODE == MODE_PLAIN) {
                    float* o = a.out + (size_t)r * a.out_stride + 8 * tile + 2 * t;
                    o[0] = v0;
                    o[1] = v1;
                } else if (MODE == MODE_RESIDUAL) {
                    const size_t at = (size_t)r * a.out_stride + 8 * tile + 2 * t;
                    a.out[at] = __fadd_rn(a.resid[at], v0);
                    a.out[at + 1] = __fadd_rn(a.resid[at + 1], v1);
                } else if (MODE == MODE_SILU) {
                    if (t < 2) {
                        float* o = a.out + (size_t)r * a.out_stride + 4 * tile + 2 * t;
                        o[0] = __fmul_rn(__fdiv_rn(v0, __fadd_rn(1.0f, expf(-v0))), u0);
                        o[1] = __fmul_rn(__fdiv_rn(v1, __fadd_rn(1.0f, expf(-v1))), u1);
                    }
                } else {  // MODE_QKV: outputs n, n+1 are a RoPE pair
                    const int n = 8 * tile + 2 * t;
                    float e0 = v0, e1 = v1;
                    if (n < a.q_width + a.kv_width) {
                        const int pos = meta_of(a.meta, a.meta_rows, ROW_POS, r);
                        const int half = a.head_dim / 2;
                        const int freq = (n % a.head_dim) / 2;
                        const float cs = a.cos_tab[(size_t)pos * half + freq];
                        const float sn = a.sin_tab[(size_t)pos * half + freq];
                        e0 = __fsub_rn(__fmul_rn(v0, cs), __fmul_rn(v1, sn));
                        e1 = __fadd_rn(__fmul_rn(v0, sn), __fmul_rn(v1, cs));
                    }
                    float* o = qkv_out(a, r, n);
                    o[0] = e0;
                    o[1] = e1;
                }
            }
        }
        // parts is written again by the next rows' products.
        grid.sync();
    }
}

// name_tT: one output tile per block, T row tiles at a time; name_wT: MMA_WIDE_NT output
// tiles per block (mod.rs picks by the pass's row count).
#ifndef MMA_WIDE_NT
#define MMA_WIDE_NT 4
#endif
#define MMA_KERNEL(name, MODE, TILES, KSPLIT) \
    extern "C" __global__ void __launch_bounds__(KSPLIT * 32) name##_t##TILES(MatmulArgs a) { \
        matmul_mma_block<MODE, TILES, 1, KSPLIT>(a, KernelGrid{}); \
    }
#define MMA_WIDE_KERNEL(name, MODE, TILES, KSPLIT) \
    extern "C" __global__ void __launch_bounds__(KSPLIT * 32) name##_w##TILES(MatmulArgs a) { \
        matmul_mma_block<MODE, TILES, MMA_WIDE_NT, KSPLIT>(a, KernelGrid{}); \
    }
#define MMA_TILES(name, MODE, KSPLIT) \
    MMA_KERNEL(name, MODE, 1, KSPLIT) MMA_KERNEL(name, MODE, 2, KSPLIT) MMA_KERNEL(name, MODE, 4, KSPLIT) \
    MMA_WIDE_KERNEL(name, MODE, 1, KSPLIT) MMA_WIDE_KERNEL(name, MODE, 2, KSPLIT)
MMA_TILES(mma_plain, MODE_PLAIN, MMA_HEAD_KSPLIT)  // the head alone
MMA_TILES(mma_residual, MODE_RESIDUAL, MMA_KSPLIT)
MMA_TILES(mma_silu, MODE_SILU, MMA_KSPLIT)
MMA_TILES(mma_qkv, MODE_QKV, MMA_KSPLIT)

// ---- Qwen's heads: q|k|v biases (Qwen 2) and per-head RMS norms of q and k (Qwen 3) ----
// For these layers the q|k|v projection writes its products to `raw` as they are
// (MODE_PLAIN, the input norm fused); this kernel, one warp per (row, head of q, k or v),
// adds the bias, norms the head, applies RoPE to queries and keys and writes the query
// out and the key and value into the cache, where MODE_QKV would have. Lane l holds the
// RoPE pairs l, l + 32, ... of its head; a head's sum of squares is each lane's in pair
// order, then the warp's butterfly: the same order in every row and every pass.
#define HEADS_MAX_PAIRS 4  // head_dim up to 256

struct HeadsArgs {
    const float* raw;      // rows x (q_width + 2 kv_width), the projection's products
    const float* bias;     // q_width + 2 kv_width biases; null: none
    const float* q_norm;   // head_dim weights of each query head's norm; null: none
    const float* k_norm;   // the same for keys
    const float* cos_tab;  // RoPE tables, [position][head_dim / 2]
    const float* sin_tab;
    const int* meta;       // the pass's per-row fields
    float* q_out;          // queries, rows x q_width
    int q_width;
    int kv_width;
    int head_dim;
    int layer;
    int meta_rows;
    float eps;
    int halves;            // RoPE pairs values j and j + head_dim / 2 (GGUF's Qwen and
                           // Gemma), else 2j and 2j + 1
};

template <typename G>
__device__ __forceinline__ void qkv_heads_warp(const HeadsArgs& a, const G& grid) {
    grid.start_next();
    grid.wait_previous();
    const Idx3 block = grid.block();
    const int r = block.x, h = block.y, lane = threadIdx.x;
    const int hd = a.head_dim, half = hd / 2;
    const int heads = a.q_width / hd, kv_heads = a.kv_width / hd;
    // 0: a query head, 1: a key head, 2: a value head (warp-uniform).
    const int kind = h < heads ? 0 : (h < heads + kv_heads ? 1 : 2);
    const int n0 = h * hd;
    const float* in = a.raw + (size_t)r * (a.q_width + 2 * a.kv_width) + n0;
    float v0[HEADS_MAX_PAIRS], v1[HEADS_MAX_PAIRS];
    float ss = 0.0f;
#pragma unroll
    for (int m = 0; m < HEADS_MAX_PAIRS; m++) {
        const int j = lane + 32 * m;
        const int i0 = a.halves ? j : 2 * j, i1 = a.halves ? j + half : 2 * j + 1;
        float x0 = 0.0f, x1 = 0.0f;
        if (j < half) {
            x0 = in[i0];
            x1 = in[i1];
            if (a.bias) {
                x0 = __fadd_rn(x0, a.bias[n0 + i0]);
                x1 = __fadd_rn(x1, a.bias[n0 + i1]);
            }
            ss = __fadd_rn(ss, __fmul_rn(x0, x0));
            ss = __fadd_rn(ss, __fmul_rn(x1, x1));
        }
        v0[m] = x0;
        v1[m] = x1;
    }
    const float* norm = kind == 0 ? a.q_norm : (kind == 1 ? a.k_norm : nullptr);
    if (norm) {
        ss = warp_sum(ss);
        const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)hd), a.eps)));
#pragma unroll
        for (int m = 0; m < HEADS_MAX_PAIRS; m++) {
            const int j = lane + 32 * m;
            const int i0 = a.halves ? j : 2 * j, i1 = a.halves ? j + half : 2 * j + 1;
            if (j < half) {
                v0[m] = __fmul_rn(__fmul_rn(v0[m], inv), norm[i0]);
                v1[m] = __fmul_rn(__fmul_rn(v1[m], inv), norm[i1]);
            }
        }
    }
    const int pos = meta_of(a.meta, a.meta_rows, ROW_POS, r);
    float* out;
    if (kind == 0) {
        out = a.q_out + (size_t)r * a.q_width + n0;
    } else {
        const int g = h - heads - (kind - 1) * kv_heads;
        out = kv_row(base_of(a.meta, a.meta_rows, r), meta_of(a.meta, a.meta_rows, ROW_CAP, r),
                     a.kv_width, a.layer, kind - 1, meta_of(a.meta, a.meta_rows, ROW_SLOT, r)) + g * hd;
    }
#pragma unroll
    for (int m = 0; m < HEADS_MAX_PAIRS; m++) {
        const int j = lane + 32 * m;
        if (j >= half) continue;
        const int i0 = a.halves ? j : 2 * j, i1 = a.halves ? j + half : 2 * j + 1;
        float e0 = v0[m], e1 = v1[m];
        if (kind < 2) {
            const float cs = a.cos_tab[(size_t)pos * half + j];
            const float sn = a.sin_tab[(size_t)pos * half + j];
            e0 = __fsub_rn(__fmul_rn(v0[m], cs), __fmul_rn(v1[m], sn));
            e1 = __fadd_rn(__fmul_rn(v0[m], sn), __fmul_rn(v1[m], cs));
        }
        out[i0] = e0;
        out[i1] = e1;
    }
}

extern "C" __global__ void __launch_bounds__(32) qkv_heads(HeadsArgs a) {
    qkv_heads_warp(a, KernelGrid{});
}

// ---- Gemma 3's parts: scaled embeddings, sandwich norms, the GELU gate ----

// x[i] *= s for the first n values (Gemma scales its embeddings by sqrt(width)).
extern "C" __global__ void scale_rows(float* x, int n, float s) {
    let_next_kernel_start();
    wait_for_previous_kernel();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

#define NORM_ADD_THREADS 256

// x[r] += rms_norm(y[r]) * w, one block per row (a sublayer's output through its post
// norm into the residual stream). The sum of squares: each thread's values in order,
// the warp's butterfly, then the warps in order: the same in every row and pass.
template <typename G>
__device__ __forceinline__ void norm_add_row(float* x, const float* y, const float* w, int width, float eps,
                                             const G& grid) {
    grid.start_next();
    grid.wait_previous();
    __shared__ float red[NORM_ADD_THREADS / 32];
    const int r = grid.block().x, t = threadIdx.x;
    const float* yr = y + (size_t)r * width;
    float* xr = x + (size_t)r * width;
    float ss = 0.0f;
    for (int i = t; i < width; i += NORM_ADD_THREADS) ss = fmaf(yr[i], yr[i], ss);
    ss = warp_sum(ss);
    if ((t & 31) == 0) red[t >> 5] = ss;
    grid.sync();
    float total = red[0];
    for (int k = 1; k < NORM_ADD_THREADS / 32; k++) total = __fadd_rn(total, red[k]);
    const float inv = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)width), eps)));
    for (int i = t; i < width; i += NORM_ADD_THREADS)
        xr[i] = __fadd_rn(xr[i], __fmul_rn(__fmul_rn(yr[i], inv), w[i]));
}

extern "C" __global__ void __launch_bounds__(NORM_ADD_THREADS) norm_add(float* x, const float* y, const float* w, int width, float eps) {
    norm_add_row(x, y, w, width, eps, KernelGrid{});
}

// out[r][i] = gelu_tanh(gate) * up for gate_up[r] = gate (ffn) | up (ffn), as the CPU's
// gelu_tanh_mul computes it: with e = exp(-2|y|), (1 + tanh y) / 2 is 1 / (1 + e) for
// y >= 0 and e / (1 + e) below, without cancellation near -1.
// Element k of out (each element's arithmetic is its own, whichever thread takes it).
__device__ __forceinline__ void gelu_mul_one(const float* gate_up, float* out, int ffn, size_t k) {
    const size_t r = k / ffn, i = k % ffn;
    const float g = gate_up[r * 2 * ffn + i], u = gate_up[r * 2 * ffn + ffn + i];
    const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float y = __fmul_rn(0.7978846f, __fadd_rn(g, cube));
    const float e = expf(__fmul_rn(-2.0f, fabsf(y)));
    const float numerator = y >= 0.0f ? g : __fmul_rn(g, e);
    out[k] = __fmul_rn(__fdiv_rn(numerator, __fadd_rn(1.0f, e)), u);
}

extern "C" __global__ void gelu_mul(const float* gate_up, float* out, int rows, int ffn) {
    let_next_kernel_start();
    wait_for_previous_kernel();
    const size_t n = (size_t)rows * ffn;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x)
        gelu_mul_one(gate_up, out, ffn, k);
}

// Row r of the pass takes row ids[r] of the embedding table.
extern "C" __global__ void embed_rows(const float* table, const int* ids, float* x, int width) {
    let_next_kernel_start();
    wait_for_previous_kernel();
    const int r = blockIdx.x;
    const float* src = table + (size_t)ids[r] * width;
    float* dst = x + (size_t)r * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

#define ARGMAX_THREADS 1024

// The greedy choice of each row of `logits` (rows x vocab), one block per row: the
// largest value, the lowest index among equal ones; NaN is never the largest (0 when
// every value is NaN). Order-free, so the same bits give the same index however the
// reduction is shaped, and the same index as the CPU's argmax_rows.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_rows(const float* logits, int vocab, int* out) {
    __shared__ float best_of[ARGMAX_THREADS / 32];
    __shared__ int index_of[ARGMAX_THREADS / 32];
    const int r = blockIdx.x, t = threadIdx.x;
    const float* row = logits + (size_t)r * vocab;
    float best = NEG_INF;
    int at = 0x7fffffff;
#pragma unroll 8
    for (int i = t; i < vocab; i += ARGMAX_THREADS) {
        const float x = row[i];
        if (x > best) { best = x; at = i; }
        else if (x == best && at == 0x7fffffff) at = i;  // the first -inf
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oa = __shfl_xor_sync(0xffffffffu, at, o);
        if (ob > best || (ob == best && oa < at)) { best = ob; at = oa; }
    }
    if ((t & 31) == 0) { best_of[t >> 5] = best; index_of[t >> 5] = at; }
    __syncthreads();
    if (t < 32) {
        best = t < ARGMAX_THREADS / 32 ? best_of[t] : NEG_INF;
        at = t < ARGMAX_THREADS / 32 ? index_of[t] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oa = __shfl_xor_sync(0xffffffffu, at, o);
            if (ob > best || (ob == best && oa < at)) { best = ob; at = oa; }
        }
        if (t == 0) out[r] = at == 0x7fffffff ? 0 : at;
    }
}

// Keep the accepted rows of the last pass: row accepted[j] (after the `len` committed)
// moves to slot len + j, for each layer's keys and values (one block each). Rows move in
// order with a barrier between them: accepted ascends, so a row is read before any later
// move can overwrite its slot.
extern "C" __global__ void kv_keep(u64 base, int cap, int kvw, int len, const int* accepted, int n) {
    float* region = (float*)base + (size_t)blockIdx.x * cap * kvw;
    for (int j = 0; j < n; j++) {
        const int src = len + accepted[j], dst = len + j;
        if (src != dst) {
            for (int e = threadIdx.x; e < kvw; e += blockDim.x) {
                float v = region[(size_t)src * kvw + e];
                region[(size_t)dst * kvw + e] = v;
            }
        }
        __syncthreads();
    }
}

// Copies `block_rows` positions of every layer's keys and values between a sequence's
// cache and prefix-cache blocks (each `[layer][key|value][block_rows][kvw]`): block b
// holds positions first + b × block_rows onward. One block of threads per layer's keys
// or values (x) and cached block (y); `to_blocks` picks the direction. Plain copies:
// the bits move unchanged.
extern "C" __global__ void kv_blocks(u64 base, int cap, int kvw, int first, const u64* blocks,
                                     int block_rows, int to_blocks) {
    const size_t span = (size_t)block_rows * kvw;
    float* cache = (float*)base + ((size_t)blockIdx.x * cap + first) * kvw + blockIdx.y * span;
    float* block = (float*)blocks[blockIdx.y] + blockIdx.x * span;
    for (size_t e = threadIdx.x; e < span; e += blockDim.x) {
        if (to_blocks) {
            block[e] = cache[e];
        } else {
            cache[e] = block[e];
        }
    }
}
