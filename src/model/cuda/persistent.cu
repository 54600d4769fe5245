// The persistent pass (SUFFIXD_CUDA_PERSISTENT=on; compiled only then, with
// -DPERSISTENT_PASS=1): a pass's layers as one kernel. mod.rs appends this file after
// kernels.cu and attention.cu, whose bodies it runs.
//
// A one-row step of a small model is some 150 kernels of a few microseconds each, most of
// it launch, ramp and first-load latency (docs/gpu.md). Here the host records the launches
// a pass's layers would make (launch.rs), in order, as stages: which body, the grid it
// would have had, its argument struct. One cooperative launch of one block per SM then
// runs them all: block b takes the virtual blocks b, b + gridDim.x, ... of each stage in
// turn, each as the kernel's own block would run (the same body, the same coordinates,
// so the same arithmetic and bits). Where a kernel would have begun, a body waits until
// every virtual block of the stage before has counted itself finished (an acquire on
// the stage's counter, as a grid's completion was): the same order as launches in a
// stream, without the launches. A block that reaches a stage asks L2 for its weights
// before that wait, so the next stage's weights stream in while the last blocks of the
// stage before finish. Bodies narrower than the block (attention's 128 threads beside
// the projections' 256) run on the block's first threads with a named barrier of their
// own; the rest wait at the block's barrier.
//
// Every block runs every stage in order and waits only on the stage before, and a
// cooperative launch keeps every block resident, so every wait ends. The counters are
// zeroed before each launch (persistent.rs).
#if PERSISTENT_PASS

#define PERSIST_MAX(a, b) ((a) > (b) ? (a) : (b))
// The persistent block: as wide as the widest body it runs.
#define PERSIST_THREADS \
    PERSIST_MAX(PERSIST_MAX(MMA_KSPLIT, MMA_HEAD_KSPLIT) * 32, PERSIST_MAX(ATTN_THREADS, NORM_ADD_THREADS))

// The stages' bodies, in the order of the host's PERSISTENT_OPS (persistent.rs): the host
// finds each launch's op by its kernel's name there.
#define OP_MMA_PLAIN_T1 0
#define OP_MMA_RESIDUAL_T1 1
#define OP_MMA_SILU_T1 2
#define OP_MMA_QKV_T1 3
#define OP_ATTENTION 4
#define OP_ATTENTION_WIDE 5
#define OP_QKV_HEADS 6
#define OP_NORM_ADD 7
#define OP_GELU_MUL 8

// The parameters of the kernels that take them one by one, as a struct (the host packs
// them in order, each at its own alignment: the same layout).
struct NormAddArgs {
    float* x;
    const float* y;
    const float* w;
    int width;
    float eps;
};
struct GeluMulArgs {
    const float* gate_up;
    float* out;
    int rows;
    int ffn;
};

// One recorded launch: the host's #[repr(C)] Stage (persistent.rs) has the same layout.
#define STAGE_ARGS_BYTES 128
struct Stage {
    int op;
    unsigned gx, gy, gz;  // the grid the kernel would have been launched with
    union {
        MatmulArgs matmul;
        AttentionArgs attention;
        HeadsArgs heads;
        NormAddArgs norm_add;
        GeluMulArgs gelu_mul;
        unsigned char bytes[STAGE_ARGS_BYTES];
    } args;
};
static_assert(sizeof(Stage) == 16 + STAGE_ARGS_BYTES, "Stage's layout is the host's");

// Wait until the counter at `c` reaches `target` (acquire: what the blocks that counted
// wrote is visible after), and count one more (release).
__device__ __forceinline__ void wait_for_count(const unsigned* c, unsigned target) {
#ifdef SUFFIXD_CUDA_ON_CPU
    emu_wait_for_count(c, target);
#else
    unsigned v;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
        if (v >= target) break;
    }
#endif
}
__device__ __forceinline__ void count_one(unsigned* c) {
#ifdef SUFFIXD_CUDA_ON_CPU
    emu_count_one(c);
#else
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
#endif
}

// A barrier of a body's THREADS threads (the block's first): the block's own when the
// body is as wide as the block, else named barrier 1, which only they take.
template <int THREADS>
__device__ __forceinline__ void body_barrier() {
    if (THREADS == PERSIST_THREADS) {
        __syncthreads();
    } else {
#ifdef SUFFIXD_CUDA_ON_CPU
        emu_named_barrier(1, THREADS);
#else
        asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
#endif
    }
}

// A body's view of its stage: its virtual block, the stage's grid, and the counter of
// the stage before (null for the first stage).
template <int THREADS>
struct StageGrid {
    static constexpr bool PREFETCH = true;  // the wait below overlaps the weights' loads
    Idx3 at, of;
    const unsigned* before;
    unsigned before_blocks;
    __device__ __forceinline__ Idx3 block() const { return at; }
    __device__ __forceinline__ Idx3 dims() const { return of; }
    __device__ __forceinline__ void sync() const { body_barrier<THREADS>(); }
    __device__ __forceinline__ void start_next() const {}
    __device__ __forceinline__ void wait_previous() const {
        if (!before) return;
        if (threadIdx.x == 0) wait_for_count(before, before_blocks);
        body_barrier<THREADS>();
    }
};

// Run virtual block `at` of stage `s` on the threads its body has, with a copy of its
// arguments (which the compiler may keep in registers, as a kernel's parameters are).
__device__ __forceinline__ void run_stage(const Stage& s, Idx3 at, const unsigned* before, unsigned before_blocks) {
    const Idx3 of{s.gx, s.gy, s.gz};
    constexpr int MMA = MMA_KSPLIT * 32, HEAD = MMA_HEAD_KSPLIT * 32;
    switch (s.op) {
        case OP_MMA_PLAIN_T1:
            if (threadIdx.x < HEAD)
                matmul_mma_block<MODE_PLAIN, 1, 1, MMA_HEAD_KSPLIT>(
                    MatmulArgs(s.args.matmul), StageGrid<HEAD>{at, of, before, before_blocks});
            break;
        case OP_MMA_RESIDUAL_T1:
            if (threadIdx.x < MMA)
                matmul_mma_block<MODE_RESIDUAL, 1, 1, MMA_KSPLIT>(
                    MatmulArgs(s.args.matmul), StageGrid<MMA>{at, of, before, before_blocks});
            break;
        case OP_MMA_SILU_T1:
            if (threadIdx.x < MMA)
                matmul_mma_block<MODE_SILU, 1, 1, MMA_KSPLIT>(
                    MatmulArgs(s.args.matmul), StageGrid<MMA>{at, of, before, before_blocks});
            break;
        case OP_MMA_QKV_T1:
            if (threadIdx.x < MMA)
                matmul_mma_block<MODE_QKV, 1, 1, MMA_KSPLIT>(
                    MatmulArgs(s.args.matmul), StageGrid<MMA>{at, of, before, before_blocks});
            break;
        case OP_ATTENTION:
            if (threadIdx.x < ATTN_THREADS)
                attention_block<1>(AttentionArgs(s.args.attention), StageGrid<ATTN_THREADS>{at, of, before, before_blocks});
            break;
        case OP_ATTENTION_WIDE:
            if (threadIdx.x < ATTN_THREADS)
                attention_block<2>(AttentionArgs(s.args.attention), StageGrid<ATTN_THREADS>{at, of, before, before_blocks});
            break;
        case OP_QKV_HEADS:
            if (threadIdx.x < 32) qkv_heads_warp(HeadsArgs(s.args.heads), StageGrid<32>{at, of, before, before_blocks});
            break;
        case OP_NORM_ADD:
            if (threadIdx.x < NORM_ADD_THREADS) {
                const NormAddArgs a = s.args.norm_add;
                norm_add_row(a.x, a.y, a.w, a.width, a.eps, StageGrid<NORM_ADD_THREADS>{at, of, before, before_blocks});
            }
            break;
        case OP_GELU_MUL: {
            // Element-wise: virtual block v takes the v-th of the stage's blocks' share of
            // the elements, whatever block the launch had.
            const StageGrid<PERSIST_THREADS> grid{at, of, before, before_blocks};
            grid.wait_previous();
            const GeluMulArgs a = s.args.gelu_mul;
            const size_t n = (size_t)a.rows * a.ffn, blocks = (size_t)of.x * of.y * of.z;
            const size_t share = (n + blocks - 1) / blocks, v = at.x + (size_t)of.x * (at.y + (size_t)of.y * at.z);
            const size_t end = min(n, (v + 1) * share);
            for (size_t k = v * share + threadIdx.x; k < end; k += PERSIST_THREADS) gelu_mul_one(a.gate_up, a.out, a.ffn, k);
            break;
        }
    }
}

// Ask L2 for the weights of every output tile this block will take in a projection
// stage (virtual blocks first, first + step, ... of its first row group): a block that
// takes several tiles of a stage then waits on memory once, not once a tile.
template <int MODE>
__device__ __forceinline__ void prefetch_tiles(const MatmulArgs& a, unsigned tiles, unsigned first, unsigned step) {
    for (unsigned tile = first; tile < tiles; tile += step)
        prefetch_rows_l2(a.w, a.k * 2, 8, [&](int i) {
            return (int)tile < a.groups ? mma_weight_row<MODE>(a, tile, i) : -1;
        }, threadIdx.x, PERSIST_THREADS);
}
__device__ __forceinline__ void prefetch_stage(const Stage& s, unsigned first, unsigned step) {
    switch (s.op) {
        case OP_MMA_PLAIN_T1: prefetch_tiles<MODE_PLAIN>(s.args.matmul, s.gx, first, step); break;
        case OP_MMA_RESIDUAL_T1: prefetch_tiles<MODE_RESIDUAL>(s.args.matmul, s.gx, first, step); break;
        case OP_MMA_SILU_T1: prefetch_tiles<MODE_SILU>(s.args.matmul, s.gx, first, step); break;
        case OP_MMA_QKV_T1: prefetch_tiles<MODE_QKV>(s.args.matmul, s.gx, first, step); break;
    }
}

// `count` stages in order; `finished[s]` counts stage s's virtual blocks done (zero at
// launch). Launched cooperatively, one block per SM.
extern "C" __global__ void __launch_bounds__(PERSIST_THREADS, 1)
    pass_persistent(const Stage* stages, int count, unsigned* finished) {
    for (int s = 0; s < count; s++) {
        const Stage& stage = stages[s];
        const unsigned blocks = stage.gx * stage.gy * stage.gz;
        const unsigned* before = s > 0 ? finished + s - 1 : nullptr;
        const unsigned before_blocks = s > 0 ? stages[s - 1].gx * stages[s - 1].gy * stages[s - 1].gz : 0;
        if (blockIdx.x + gridDim.x < blocks) prefetch_stage(stage, blockIdx.x, gridDim.x);
        for (unsigned v = blockIdx.x; v < blocks; v += gridDim.x) {
            const Idx3 at{v % stage.gx, (v / stage.gx) % stage.gy, v / (stage.gx * stage.gy)};
            run_stage(stage, at, before, before_blocks);
            // Every thread of the block is past the body: its writes are in before the count.
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence();
                count_one(finished + s);
            }
        }
    }
}

#endif  // PERSISTENT_PASS
