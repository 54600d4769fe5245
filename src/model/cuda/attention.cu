// Attention, the part of the device kernels that reads each row's keys and values. mod.rs
// appends this file to kernels.cu as one NVRTC source: it uses that file's helpers (the
// row fields, kv_row, the warp reductions, the dependent-launch entry) and follows its
// rules of row invariance (see the head of kernels.cu).

#define ATTN_CHUNK 64                 // keys per chunk
#define ATTN_THREADS (2 * ATTN_CHUNK)  // two threads per key for its dot product
#define ATTN_MAX_HEAD_DIM 256

struct AttentionArgs {
    const float* q;      // rows x heads*head_dim
    float* out;          // rows x heads*head_dim
    const int* meta;     // the pass's per-row fields
    const int* ancestors;// in-pass key slots, ROW_ANC_OFF / ROW_ANC_LEN per row
    float* partials;     // rows x heads x ATTN_SPLITS x (2 + head_dim): m, l, acc
    int* tickets;        // rows x heads, zero between passes
    int heads;
    int kv_heads;
    int head_dim;
    int layer;
    float scale;
    int meta_rows;
    int window;          // a sliding window: a row sees its last `window` keys; 0: all
};

// Attention for one (row, head, split) per block. A row's keys come in the order plain
// decoding sees them: the committed context, then the row's ancestors in the pass, then
// itself. They are cut into chunks of ATTN_CHUNK by absolute key index; split s takes
// chunks s, s + ATTN_SPLITS, ... in order, with an online softmax whose every sum has a
// fixed order, and leaves its (max, sum, weighted values) in `partials`. The last of a
// (row, head)'s blocks to finish combines the splits in split order and writes the
// output. Many short blocks instead of one long one per (row, head): a one-row step has
// heads x ATTN_SPLITS blocks in flight instead of heads. Each thread carries EPT of a
// head's values (1: head_dim a multiple of 8 dividing ATTN_THREADS; 2: head_dim 256,
// `attention_wide`). With a window, keys before the row's last `window` weigh zero and
// chunks wholly before them are skipped; the chunks stay fixed by absolute key index.
template <int EPT, typename G>
__device__ __forceinline__ void attention_block(const AttentionArgs& a, const G& grid) {
    __shared__ float q[ATTN_MAX_HEAD_DIM];
    __shared__ float p[ATTN_CHUNK];
    __shared__ float dots[ATTN_THREADS];
    __shared__ float part[ATTN_THREADS * EPT];
    __shared__ float red[ATTN_THREADS / 32];
    __shared__ int slots[ATTN_CHUNK];
    __shared__ int last;
    grid.start_next();
    grid.wait_previous();
    const Idx3 block = grid.block();
    const int r = block.x, h = block.y, split = block.z, t = threadIdx.x;
    const int hd = a.head_dim;
    const int kvw = a.kv_heads * hd;
    const int g = h / (a.heads / a.kv_heads);
    const int ctx = meta_of(a.meta, a.meta_rows, ROW_CTX, r);
    const int anc_off = meta_of(a.meta, a.meta_rows, ROW_ANC_OFF, r);
    const int n = ctx + meta_of(a.meta, a.meta_rows, ROW_ANC_LEN, r);
    // Splits past the row's last chunk have no key: they leave no part and draw no ticket,
    // and the combine reads the parts of the first `active` splits only. An empty split's
    // part weighed nothing there (its max -inf, its sum 0, skipped), so the sums are the
    // same; at a short context a one-row step's blocks are mostly such splits.
    const int active = min(ATTN_SPLITS, (n + ATTN_CHUNK - 1) / ATTN_CHUNK);
    if (split >= active) return;  // block-uniform: no barrier is left waiting
    const int cap = meta_of(a.meta, a.meta_rows, ROW_CAP, r);
    const u64 base = base_of(a.meta, a.meta_rows, r);
    const float* keys = kv_row(base, cap, kvw, a.layer, 0, 0) + g * hd;
    const float* values = kv_row(base, cap, kvw, a.layer, 1, 0) + g * hd;
    for (int e = t; e < hd; e += ATTN_THREADS) q[e] = a.q[((size_t)r * a.heads + h) * hd + e];
    // Thread t sums values d, d + cols, ... (EPT of them) over keys grp, grp + groups, ...
    const int cols = hd / EPT;
    const int groups = ATTN_THREADS / cols;  // value partial sums per output element
    const int d = t % cols, grp = t / cols;
    // The first key the row sees.
    const int lo = a.window > 0 && n > a.window ? n - a.window : 0;
    // Thread t computes half `t / ATTN_CHUNK` of key `t % ATTN_CHUNK`'s dot product.
    const int key = t % ATTN_CHUNK, half = t / ATTN_CHUNK, span = hd / 2;
    float m = NEG_INF, l = 0.0f, acc[EPT];
#pragma unroll
    for (int e = 0; e < EPT; e++) acc[e] = 0.0f;
    grid.sync();
    for (int c0 = split * ATTN_CHUNK; c0 < n; c0 += ATTN_SPLITS * ATTN_CHUNK) {
        if (c0 + ATTN_CHUNK <= lo) continue;  // block-uniform: the whole chunk is out
        const int i = c0 + key;
        if (i < n) {
            const int slot = i < ctx ? i : a.ancestors[anc_off + i - ctx];
            if (half == 0) slots[key] = slot;
            const float* k = keys + (size_t)slot * kvw + half * span;
            const float* qh = q + half * span;
            float dot = 0.0f;
#pragma unroll 8
            for (int e = 0; e < span; e += 4) {
                float4 kv = *(const float4*)(k + e);
                dot = fmaf(qh[e], kv.x, dot);
                dot = fmaf(qh[e + 1], kv.y, dot);
                dot = fmaf(qh[e + 2], kv.z, dot);
                dot = fmaf(qh[e + 3], kv.w, dot);
            }
            dots[t] = dot;
        }
        grid.sync();  // both halves of every dot product are in
        float s = NEG_INF;
        const bool seen = i < n && i >= lo;
        if (t < ATTN_CHUNK && seen) s = __fmul_rn(__fadd_rn(dots[t], dots[t + ATTN_CHUNK]), a.scale);
        // The chunk's maximum (order-free), then the new running maximum.
        float cm = warp_max(s);
        if ((t & 31) == 0) red[t >> 5] = cm;
        grid.sync();
        cm = red[0];
        for (int w = 1; w < ATTN_THREADS / 32; w++) cm = fmaxf(cm, red[w]);
        const float m_new = fmaxf(m, cm);
        const float e = (t < ATTN_CHUNK && seen) ? expf(__fsub_rn(s, m_new)) : 0.0f;
        if (t < ATTN_CHUNK) p[t] = e;
        grid.sync();  // everyone has read red; p and slots are written
        // The chunk's sum: warp butterflies, then the warps in order.
        float cs = warp_sum(e);
        if ((t & 31) == 0) red[t >> 5] = cs;
        // This thread's share of the weighted values: keys grp, grp + groups, ...
        const int in_chunk = min(ATTN_CHUNK, n - c0);
#pragma unroll
        for (int ev = 0; ev < EPT; ev++) {
            float pv = 0.0f;
#pragma unroll 8
            for (int j = grp; j < in_chunk; j += groups)
                pv = fmaf(p[j], values[(size_t)slots[j] * kvw + d + ev * cols], pv);
            part[ev * ATTN_THREADS + t] = pv;
        }
        grid.sync();
        cs = red[0];
        for (int w = 1; w < ATTN_THREADS / 32; w++) cs = __fadd_rn(cs, red[w]);
        const float corr = expf(__fsub_rn(m, m_new));  // 0 on the first chunk
        l = fmaf(l, corr, cs);
        if (grp == 0) {
#pragma unroll
            for (int ev = 0; ev < EPT; ev++) {
                float sum = part[ev * ATTN_THREADS + d];
                for (int gi = 1; gi < groups; gi++) sum = __fadd_rn(sum, part[ev * ATTN_THREADS + gi * cols + d]);
                acc[ev] = fmaf(acc[ev], corr, sum);
            }
        }
        m = m_new;
        grid.sync();  // before the next chunk overwrites p, slots, dots, part and red
    }
    // This split's part (m = -inf, l = 0 when it had no chunk), then a ticket: the block
    // that draws the last one combines every split's part.
    const size_t pair = (size_t)r * a.heads + h;
    const int stride = 2 + hd;
    float* mine = a.partials + (pair * ATTN_SPLITS + split) * stride;
    if (t == 0) { mine[0] = m; mine[1] = l; }
    if (grp == 0)
#pragma unroll
        for (int ev = 0; ev < EPT; ev++) mine[2 + d + ev * cols] = acc[ev];
    __threadfence();  // the part is visible device-wide before the ticket is drawn
    grid.sync();
    if (t == 0) last = atomicAdd(a.tickets + pair, 1) == active - 1;
    grid.sync();
    if (!last) return;
    __threadfence();
    if (grp == 0) {
        // Parts are read from L2 (__ldcg): this SM's L1 may hold an older copy of a line.
        const float* parts = a.partials + pair * ATTN_SPLITS * stride;
        float mx = NEG_INF;
        for (int sp = 0; sp < active; sp++) mx = fmaxf(mx, __ldcg(parts + sp * stride));
        float lsum = 0.0f, vsum[EPT];
#pragma unroll
        for (int ev = 0; ev < EPT; ev++) vsum[ev] = 0.0f;
        for (int sp = 0; sp < active; sp++) {
            const float* pp = parts + sp * stride;
            const float ls = __ldcg(pp + 1);
            if (ls == 0.0f) continue;  // a split without keys
            const float w = expf(__fsub_rn(__ldcg(pp), mx));
            lsum = fmaf(ls, w, lsum);
#pragma unroll
            for (int ev = 0; ev < EPT; ev++) vsum[ev] = fmaf(__ldcg(pp + 2 + d + ev * cols), w, vsum[ev]);
        }
#pragma unroll
        for (int ev = 0; ev < EPT; ev++) a.out[pair * hd + d + ev * cols] = __fdiv_rn(vsum[ev], lsum);
    }
    if (t == 0) a.tickets[pair] = 0;  // every split has drawn: ready for the next pass
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention(AttentionArgs a) {
    attention_block<1>(a, KernelGrid{});
}

// Heads of 256 values (Gemma 3).
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_wide(AttentionArgs a) {
    attention_block<2>(a, KernelGrid{});
}
