// A block's threads as fibers on the calling thread, and the warp's exchanges (shuffles,
// the tensor-core product) between them: the device side of the emulator (README.md).
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "emulator.h"

using emu::die;

namespace {

// emu_switch(save, to): push the callee-saved registers, store the stack pointer in
// *save, take `to` as the stack pointer and pop what was pushed there. The floating-point
// control words are left alone: every fiber runs with the same ones. A new fiber's stack
// (run_block) holds zeros, its body in r13, its argument in r12 and emu_fiber_start as the
// return address, so its first switch lands there and calls r13(r12).
extern "C" void emu_switch(void** save, void* to);
extern "C" void emu_fiber_start();
asm(R"(
.text
.globl emu_switch
.hidden emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch,.-emu_switch
.globl emu_fiber_start
.hidden emu_fiber_start
.type emu_fiber_start,@function
emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
.size emu_fiber_start,.-emu_fiber_start
)");

// AT_NAMED: at a named barrier (bar.sync id, n); AT_GRID: waiting for a counter another
// block of a cooperative launch moves.
enum State { RUNNABLE, AT_BLOCK, AT_WARP, AT_NAMED, AT_GRID, DONE };

struct Fiber {
    void* sp = nullptr;
    int flat = 0;
    dim3 idx{};
    State state = DONE;
    int parity = 0;      // which half of the warp's exchange buffers its next exchange uses
    int barrier = 0;     // AT_NAMED: which
    long exchanges = 0;  // warp exchanges taken part in: a lane reads only lanes that reached its own
};

constexpr size_t STACK_BYTES = 256 * 1024;
using emu::MAX_THREADS;
constexpr int MAX_WARPS = MAX_THREADS / 32;
constexpr int NAMED_BARRIERS = 16;

// One block's fibers and its warps' exchange buffers.
struct Scheduler {
    char* stacks = nullptr;
    Fiber fibers[MAX_THREADS];
    int threads = 0;
    int live = 0;                   // threads not finished
    int at_block = 0;               // threads waiting in __syncthreads
    int at_grid = 0;                // threads waiting for another block
    int at_named[NAMED_BARRIERS];   // threads waiting at each named barrier
    dim3 block_idx{};
    int warp_live[MAX_WARPS];       // per warp: lanes not finished
    int warp_waiting[MAX_WARPS];    // per warp: lanes waiting in an exchange
    Fiber* current = nullptr;
    void* home = nullptr;  // the scheduler's own stack pointer while a fiber runs
    void (*kernel)(void**) = nullptr;
    void** params = nullptr;
    const char* name = "";
    // Per warp and parity: shuffle values, and the tensor-core product's fragments.
    unsigned long long shuffle[2][MAX_WARPS][32];
    unsigned mma_a[2][MAX_WARPS][32][4];
    unsigned mma_b[2][MAX_WARPS][32][2];
    // The same unpacked: A by row, B by column, and the exchange they were unpacked for.
    double mma_af[2][MAX_WARPS][16][16];
    double mma_bf[2][MAX_WARPS][8][16];
    long mma_unpacked[2][MAX_WARPS];
};
// The block whose fibers run; the blocks of one launch (more than one at a time only in a
// cooperative launch).
Scheduler* cur = nullptr;
std::vector<Scheduler*> pool;
// Counters moved by emu_count_one: a cooperative launch's blocks make progress.
long counted = 0;

// A warp whose every live lane waits in an exchange goes on.
void release_warp_if_complete(int w) {
    if (cur->warp_waiting[w] == 0 || cur->warp_waiting[w] != cur->warp_live[w]) return;
    for (int i = 32 * w; i < std::min(cur->threads, 32 * w + 32); i++)
        if (cur->fibers[i].state == AT_WARP) cur->fibers[i].state = RUNNABLE;
    cur->warp_waiting[w] = 0;
}

void fiber_main(void* arg) {
    Fiber* f = static_cast<Fiber*>(arg);
    cur->kernel(cur->params);
    f->state = DONE;
    cur->live--;
    cur->warp_live[f->flat >> 5]--;
    release_warp_if_complete(f->flat >> 5);
    emu_switch(&f->sp, cur->home);
    die("a finished fiber was resumed");
}

// Wait at a barrier of the block (AT_BLOCK) or of the warp (AT_WARP). The last lane of a
// warp to arrive releases the warp and goes on at once.
void wait_here(State s) {
    Fiber* f = cur->current;
    if (s == AT_WARP) {
        const int w = f->flat >> 5;
        f->state = AT_WARP;
        cur->warp_waiting[w]++;
        release_warp_if_complete(w);
        if (f->state == RUNNABLE) return;
    } else {
        f->state = AT_BLOCK;
        cur->at_block++;
    }
    emu_switch(&f->sp, cur->home);
}

// Make `s` block `idx` of `threads` threads, every one about to start.
void start_block(Scheduler& s, int threads, dim3 idx) {
    if (!s.stacks) {
        s.stacks = static_cast<char*>(mmap(nullptr, STACK_BYTES * MAX_THREADS, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
        if (s.stacks == MAP_FAILED) die("no memory for the fibers' stacks");
    }
    s.threads = threads;
    s.live = threads;
    s.at_block = 0;
    s.at_grid = 0;
    s.block_idx = idx;
    for (int& n : s.at_named) n = 0;
    const int warps = (threads + 31) / 32;
    for (int w = 0; w < warps; w++) {
        s.warp_live[w] = std::min(32, threads - 32 * w);
        s.warp_waiting[w] = 0;
        s.mma_unpacked[0][w] = s.mma_unpacked[1][w] = -1;
    }
    const unsigned bx = emu_block_dim.x, by = emu_block_dim.y;
    for (int i = 0; i < threads; i++) {
        Fiber& f = s.fibers[i];
        f.flat = i;
        f.idx = dim3{i % bx, (i / bx) % by, i / (bx * by)};
        f.state = RUNNABLE;
        f.parity = 0;
        f.exchanges = 0;
        char* top = s.stacks + STACK_BYTES * (i + 1);
        void** sp = reinterpret_cast<void**>(top - 16 - 56);
        sp[0] = nullptr;                                      // r15
        sp[1] = nullptr;                                      // r14
        sp[2] = reinterpret_cast<void*>(&fiber_main);         // r13: the body
        sp[3] = &f;                                           // r12: its argument
        sp[4] = nullptr;                                      // rbx
        sp[5] = nullptr;                                      // rbp
        sp[6] = reinterpret_cast<void*>(&emu_fiber_start);    // where ret goes
        f.sp = sp;
    }
}

// Run block `s` until its threads finish (true) or every live one waits, one or more of
// them for another block (false).
bool run_block(Scheduler& s) {
    cur = &s;
    emu_block_idx = s.block_idx;
    for (int i = 0; i < s.threads; i++)
        if (s.fibers[i].state == AT_GRID) s.fibers[i].state = RUNNABLE;  // to look again
    s.at_grid = 0;
    for (;;) {
        bool ran = false;
        for (int i = 0; i < s.threads; i++) {
            Fiber& f = s.fibers[i];
            if (f.state != RUNNABLE) continue;
            ran = true;
            s.current = &f;
            emu_thread_idx = f.idx;
            emu_switch(&s.home, f.sp);
        }
        if (s.live == 0) return true;
        if (s.at_block == s.live) {
            for (int i = 0; i < s.threads; i++)
                if (s.fibers[i].state == AT_BLOCK) s.fibers[i].state = RUNNABLE;
            s.at_block = 0;
        } else if (!ran) {
            if (s.at_grid > 0) return false;
            die("kernel %s: its threads wait on each other (a barrier or warp operation some "
                "live threads of the block never reach): %d live, %d at __syncthreads",
                s.name, s.live, s.at_block);
        }
    }
}

Scheduler& scheduler(size_t i) {
    while (pool.size() <= i) pool.push_back(new Scheduler);
    return *pool[i];
}

}  // namespace

extern "C" {
dim3 emu_thread_idx, emu_block_idx, emu_block_dim, emu_grid_dim;

void emu_syncthreads() { wait_here(AT_BLOCK); }

void emu_named_barrier(int id, int threads) {
    if (id < 0 || id >= NAMED_BARRIERS) die("kernel %s: named barrier %d", cur->name, id);
    Fiber* f = cur->current;
    f->state = AT_NAMED;
    f->barrier = id;
    if (++cur->at_named[id] == threads) {
        for (int i = 0; i < cur->threads; i++)
            if (cur->fibers[i].state == AT_NAMED && cur->fibers[i].barrier == id) cur->fibers[i].state = RUNNABLE;
        cur->at_named[id] = 0;
        return;
    }
    emu_switch(&f->sp, cur->home);
}

void emu_wait_for_count(const unsigned* counter, unsigned target) {
    Fiber* f = cur->current;
    while (*static_cast<const volatile unsigned*>(counter) < target) {
        f->state = AT_GRID;
        cur->at_grid++;
        emu_switch(&f->sp, cur->home);
    }
}

void emu_count_one(unsigned* counter) {
    ++*counter;
    counted++;
}

unsigned long long emu_shuffle(unsigned long long mine, int from_xor) {
    Fiber* f = cur->current;
    const int w = f->flat >> 5, lane = f->flat & 31, p = f->parity;
    f->parity ^= 1;
    f->exchanges++;
    cur->shuffle[p][w][lane] = mine;
    wait_here(AT_WARP);
    const int from = lane ^ from_xor;
    if (32 * w + from >= cur->threads || cur->fibers[32 * w + from].exchanges < f->exchanges)
        die("kernel %s: a shuffle reads lane %d, which did not take part (exited or diverged)", cur->name, from);
    return cur->shuffle[p][w][from];
}

void emu_mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    Fiber* f = cur->current;
    const int w = f->flat >> 5, lane = f->flat & 31, p = f->parity;
    f->parity ^= 1;
    f->exchanges++;
    for (int i = 0; i < 4; i++) cur->mma_a[p][w][lane][i] = a[i];
    cur->mma_b[p][w][lane][0] = b0;
    cur->mma_b[p][w][lane][1] = b1;
    wait_here(AT_WARP);
    // The first lane back unpacks the warp's A and B once for all 32 (the parity's buffers
    // are not written again before every lane has left this exchange).
    if (cur->mma_unpacked[p][w] != f->exchanges) {
        for (int l = 0; l < 32; l++)
            if (32 * w + l >= cur->threads || cur->fibers[32 * w + l].exchanges < f->exchanges)
                die("kernel %s: a tensor-core product without lane %d of the warp", cur->name, l);
        auto half = [](unsigned v, int high) { return (double)__uint_as_float(high ? (v & 0xffff0000u) : (v << 16)); };
        // A (16 x 16, rows): register (row / 8) + 2 (k / 8) of lane 4 (row % 8) + (k % 8) / 2,
        // half k % 2. B (16 x 8, columns): register k / 8 of lane 4 col + (k % 8) / 2, half k % 2.
        for (int row = 0; row < 16; row++)
            for (int k = 0; k < 16; k++)
                cur->mma_af[p][w][row][k] = half(cur->mma_a[p][w][4 * (row % 8) + (k % 8) / 2][row / 8 + 2 * (k / 8)], k & 1);
        for (int col = 0; col < 8; col++)
            for (int k = 0; k < 16; k++)
                cur->mma_bf[p][w][col][k] = half(cur->mma_b[p][w][4 * col + (k % 8) / 2][k / 8], k & 1);
        cur->mma_unpacked[p][w] = f->exchanges;
    }
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        // The products of two bf16 values are exact in double; their sum is taken in
        // double, in k order, then C is added and the result rounded to f32.
        const double* x = cur->mma_af[p][w][row];
        const double* y = cur->mma_bf[p][w][col];
        double sum = 0.0;
        for (int k = 0; k < 16; k++) sum += x[k] * y[k];
        d[i] = (float)(sum + (double)d[i]);
    }
}
}

namespace emu {

void run_grid(void (*kernel)(void**), std::pair<char*, size_t> shared, void** params, const char* name,
              dim3 grid, dim3 block, bool cooperative) {
    const int threads = (int)(block.x * block.y * block.z);
    const size_t blocks = (size_t)grid.x * grid.y * grid.z;
    emu_block_dim = block;
    emu_grid_dim = grid;
    auto coordinates = [&](size_t i) {
        return dim3{(unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y), (unsigned)(i / ((size_t)grid.x * grid.y))};
    };
    auto prepare = [&](Scheduler& s, size_t i) {
        s.kernel = kernel;
        s.params = params;
        s.name = name;
        start_block(s, threads, coordinates(i));
    };
    if (!cooperative) {
        // One block after another: each runs to its end.
        Scheduler& s = scheduler(0);
        for (size_t i = 0; i < blocks; i++) {
            if (shared.first) memset(shared.first, 0xff, shared.second);
            prepare(s, i);
            if (!run_block(s)) die("kernel %s waits for another block outside a cooperative launch", name);
        }
        return;
    }
    // Every block at once: each runs until all its threads wait, one of them for another
    // block; then the next, with its own copy of the shared statics.
    std::vector<std::vector<char>> saved(blocks, std::vector<char>(shared.second, (char)0xff));
    std::vector<bool> finished(blocks, false);
    for (size_t i = 0; i < blocks; i++) prepare(scheduler(i), i);
    for (size_t left = blocks; left > 0;) {
        const long before = counted;
        const size_t left_before = left;
        for (size_t i = 0; i < blocks; i++) {
            if (finished[i]) continue;
            if (shared.first) memcpy(shared.first, saved[i].data(), shared.second);
            if (run_block(scheduler(i))) {
                finished[i] = true;
                left--;
            }
            if (shared.first) memcpy(saved[i].data(), shared.first, shared.second);
        }
        if (left == left_before && counted == before)
            die("kernel %s: its %zu unfinished blocks all wait for counts no block moves", name, left);
    }
}

}  // namespace emu
