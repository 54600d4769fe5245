// suffixd's device kernels for the llama forward pass, compiled at run time by NVRTC
// (src/verify/cuda/mod.rs). Every one is row-invariant: a row's result is computed by the
// same operations in the same order whatever else is in the pass (how many rows, which
// sequences, where the row sits in its tile), so a token verified inside a draft gets
// the bits plain decoding gives it. The rules that buy this:
//   - each output is one thread's or one warp's fixed-order chain of explicit fmaf
//     (compiled with --fmad=false, so nothing is contracted behind our back), reduced
//     across the warp by a fixed xor butterfly;
//   - a row's arithmetic is the same in every tile size and tile position (a short tile
//     repeats its last row and drops the copies), and nothing is split along K by row
//     count, so the host may pick the tile (1, 4 or 8 rows) by the pass's row count;
//   - attention walks a row's keys in chunks fixed by the key's absolute index, so the
//     committed prefix and the draft's ancestors chunk exactly as plain decoding does.
// Weights are f32 or bf16 (raw 16-bit words, widened by a shift: exact).

typedef unsigned short bf16_t;
typedef unsigned long long u64;

#define WARPS_PER_BLOCK 8
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
    if (g >= a.groups) return;
    int wrow[4];
    if (MODE == MODE_SILU) {
        // Gate rows 2g, 2g+1, then the matching up rows.
        wrow[0] = 2 * g; wrow[1] = 2 * g + 1;
        wrow[2] = a.kv_width + 2 * g; wrow[3] = a.kv_width + 2 * g + 1;
    } else {
#pragma unroll
        for (int c = 0; c < 4; c++) wrow[c] = 4 * g + c;
    }
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
            if (n < a.q_width) {
                a.q_out[(size_t)r * a.q_width + n] = value;
            } else {
                const int kind = n < a.q_width + a.kv_width ? 0 : 1;
                const int col = n - a.q_width - kind * a.kv_width;
                float* dst = kv_row(base_of(a.meta, a.meta_rows, r),
                                    meta_of(a.meta, a.meta_rows, ROW_CAP, r), a.kv_width,
                                    a.layer, kind, meta_of(a.meta, a.meta_rows, ROW_SLOT, r));
                dst[col] = value;
            }
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

// Row r of the pass takes row ids[r] of the embedding table.
extern "C" __global__ void embed_rows(const float* table, const int* ids, float* x, int width) {
    const int r = blockIdx.x;
    const float* src = table + (size_t)ids[r] * width;
    float* dst = x + (size_t)r * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

#define ATTN_THREADS 256
#define ATTN_CHUNK 256
#define ATTN_MAX_HEAD_DIM 128

struct AttentionArgs {
    const float* q;      // rows x heads*head_dim
    float* out;          // rows x heads*head_dim
    const int* meta;     // the pass's per-row fields
    const int* ancestors;// in-pass key slots, ROW_ANC_OFF / ROW_ANC_LEN per row
    int heads;
    int kv_heads;
    int head_dim;
    int layer;
    float scale;
    int meta_rows;
};

// One block per (row, head). Keys in the order plain decoding sees them: the committed
// context, then the row's ancestors in the pass, then itself; processed in chunks of
// ATTN_CHUNK by absolute key index with an online softmax whose every sum has a fixed
// order. Needs head_dim <= 128, dividing 256, a multiple of 4.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention(AttentionArgs a) {
    __shared__ float q[ATTN_MAX_HEAD_DIM];
    __shared__ float p[ATTN_CHUNK];
    __shared__ float part[ATTN_THREADS];
    __shared__ float red[ATTN_THREADS / 32];
    __shared__ int slots[ATTN_CHUNK];
    const int r = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
    const int hd = a.head_dim;
    const int kvw = a.kv_heads * hd;
    const int g = h / (a.heads / a.kv_heads);
    const int ctx = meta_of(a.meta, a.meta_rows, ROW_CTX, r);
    const int anc_off = meta_of(a.meta, a.meta_rows, ROW_ANC_OFF, r);
    const int n = ctx + meta_of(a.meta, a.meta_rows, ROW_ANC_LEN, r);
    const int cap = meta_of(a.meta, a.meta_rows, ROW_CAP, r);
    const u64 base = base_of(a.meta, a.meta_rows, r);
    const float* keys = kv_row(base, cap, kvw, a.layer, 0, 0) + g * hd;
    const float* values = kv_row(base, cap, kvw, a.layer, 1, 0) + g * hd;
    if (t < hd) q[t] = a.q[((size_t)r * a.heads + h) * hd + t];
    const int groups = ATTN_THREADS / hd;  // value partial sums per output element
    const int d = t % hd, grp = t / hd;
    float m = NEG_INF, l = 0.0f, acc = 0.0f;
    __syncthreads();
    for (int c0 = 0; c0 < n; c0 += ATTN_CHUNK) {
        const int i = c0 + t;
        float s = NEG_INF;
        if (i < n) {
            const int slot = i < ctx ? i : a.ancestors[anc_off + i - ctx];
            slots[t] = slot;
            const float* k = keys + (size_t)slot * kvw;
            float dot = 0.0f;
#pragma unroll 8
            for (int e = 0; e < hd; e += 4) {
                float4 kv = *(const float4*)(k + e);
                dot = fmaf(q[e], kv.x, dot);
                dot = fmaf(q[e + 1], kv.y, dot);
                dot = fmaf(q[e + 2], kv.z, dot);
                dot = fmaf(q[e + 3], kv.w, dot);
            }
            s = __fmul_rn(dot, a.scale);
        }
        // The chunk's maximum (order-free), then the new running maximum.
        float cm = warp_max(s);
        if ((t & 31) == 0) red[t >> 5] = cm;
        __syncthreads();
        cm = red[0];
        for (int w = 1; w < ATTN_THREADS / 32; w++) cm = fmaxf(cm, red[w]);
        const float m_new = fmaxf(m, cm);
        const float e = i < n ? expf(__fsub_rn(s, m_new)) : 0.0f;
        p[t] = e;
        __syncthreads();  // everyone has read red; p and slots are written
        // The chunk's sum: warp butterflies, then the warps in order.
        float cs = warp_sum(e);
        if ((t & 31) == 0) red[t >> 5] = cs;
        // This thread's share of the weighted values: keys grp, grp + groups, ...
        float pv = 0.0f;
        const int in_chunk = min(ATTN_CHUNK, n - c0);
#pragma unroll 8
        for (int j = grp; j < in_chunk; j += groups)
            pv = fmaf(p[j], values[(size_t)slots[j] * kvw + d], pv);
        part[t] = pv;
        __syncthreads();
        cs = red[0];
        for (int w = 1; w < ATTN_THREADS / 32; w++) cs = __fadd_rn(cs, red[w]);
        const float corr = expf(__fsub_rn(m, m_new));  // 0 on the first chunk
        l = fmaf(l, corr, cs);
        if (grp == 0) {
            float sum = part[d];
            for (int gi = 1; gi < groups; gi++) sum = __fadd_rn(sum, part[gi * hd + d]);
            acc = fmaf(acc, corr, sum);
        }
        m = m_new;
        __syncthreads();  // before the next chunk overwrites p, slots, part and red
    }
    if (grp == 0) a.out[((size_t)r * a.heads + h) * hd + d] = __fdiv_rn(acc, l);
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
