// A block's threads as fibers on the calling thread, and the warp's exchanges (shuffles,
// the tensor-core product) between them: the device side of the emulator (README.md).
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

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

enum State { RUNNABLE, AT_BLOCK, AT_WARP, DONE };

struct Fiber {
    void* sp = nullptr;
    int flat = 0;
    dim3 idx{};
    State state = DONE;
    int parity = 0;      // which half of the warp's exchange buffers its next exchange uses
    long exchanges = 0;  // warp exchanges taken part in: a lane reads only lanes that reached its own
};

constexpr size_t STACK_BYTES = 256 * 1024;
using emu::MAX_THREADS;
constexpr int MAX_WARPS = MAX_THREADS / 32;

struct Scheduler {
    char* stacks = nullptr;
    Fiber fibers[MAX_THREADS];
    int threads = 0;
    int live = 0;                   // threads not finished
    int at_block = 0;               // threads waiting in __syncthreads
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
Scheduler sched;

// A warp whose every live lane waits in an exchange goes on.
void release_warp_if_complete(int w) {
    if (sched.warp_waiting[w] == 0 || sched.warp_waiting[w] != sched.warp_live[w]) return;
    for (int i = 32 * w; i < std::min(sched.threads, 32 * w + 32); i++)
        if (sched.fibers[i].state == AT_WARP) sched.fibers[i].state = RUNNABLE;
    sched.warp_waiting[w] = 0;
}

void fiber_main(void* arg) {
    Fiber* f = static_cast<Fiber*>(arg);
    sched.kernel(sched.params);
    f->state = DONE;
    sched.live--;
    sched.warp_live[f->flat >> 5]--;
    release_warp_if_complete(f->flat >> 5);
    emu_switch(&f->sp, sched.home);
    die("a finished fiber was resumed");
}

// Wait at a barrier of the block (AT_BLOCK) or of the warp (AT_WARP). The last lane of a
// warp to arrive releases the warp and goes on at once.
void wait_here(State s) {
    Fiber* f = sched.current;
    if (s == AT_WARP) {
        const int w = f->flat >> 5;
        f->state = AT_WARP;
        sched.warp_waiting[w]++;
        release_warp_if_complete(w);
        if (f->state == RUNNABLE) return;
    } else {
        f->state = AT_BLOCK;
        sched.at_block++;
    }
    emu_switch(&f->sp, sched.home);
}

// Run one block of `threads` threads to completion.
void run_block(int threads) {
    if (!sched.stacks) {
        sched.stacks = static_cast<char*>(mmap(nullptr, STACK_BYTES * MAX_THREADS, PROT_READ | PROT_WRITE,
                                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
        if (sched.stacks == MAP_FAILED) die("no memory for the fibers' stacks");
    }
    sched.threads = threads;
    sched.live = threads;
    sched.at_block = 0;
    const int warps = (threads + 31) / 32;
    for (int w = 0; w < warps; w++) {
        sched.warp_live[w] = std::min(32, threads - 32 * w);
        sched.warp_waiting[w] = 0;
        sched.mma_unpacked[0][w] = sched.mma_unpacked[1][w] = -1;
    }
    const unsigned bx = emu_block_dim.x, by = emu_block_dim.y;
    for (int i = 0; i < threads; i++) {
        Fiber& f = sched.fibers[i];
        f.flat = i;
        f.idx = dim3{i % bx, (i / bx) % by, i / (bx * by)};
        f.state = RUNNABLE;
        f.parity = 0;
        f.exchanges = 0;
        char* top = sched.stacks + STACK_BYTES * (i + 1);
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
    for (;;) {
        bool ran = false;
        for (int i = 0; i < threads; i++) {
            Fiber& f = sched.fibers[i];
            if (f.state != RUNNABLE) continue;
            ran = true;
            sched.current = &f;
            emu_thread_idx = f.idx;
            emu_switch(&sched.home, f.sp);
        }
        if (sched.live == 0) return;
        if (sched.at_block == sched.live) {
            for (int i = 0; i < threads; i++)
                if (sched.fibers[i].state == AT_BLOCK) sched.fibers[i].state = RUNNABLE;
            sched.at_block = 0;
        } else if (!ran) {
            die("kernel %s: its threads wait on each other (a barrier or warp operation some "
                "live threads of the block never reach): %d live, %d at __syncthreads",
                sched.name, sched.live, sched.at_block);
        }
    }
}

}  // namespace

extern "C" {
dim3 emu_thread_idx, emu_block_idx, emu_block_dim, emu_grid_dim;

void emu_syncthreads() { wait_here(AT_BLOCK); }

unsigned long long emu_shuffle(unsigned long long mine, int from_xor) {
    Fiber* f = sched.current;
    const int w = f->flat >> 5, lane = f->flat & 31, p = f->parity;
    f->parity ^= 1;
    f->exchanges++;
    sched.shuffle[p][w][lane] = mine;
    wait_here(AT_WARP);
    const int from = lane ^ from_xor;
    if (32 * w + from >= sched.threads || sched.fibers[32 * w + from].exchanges < f->exchanges)
        die("kernel %s: a shuffle reads lane %d, which did not take part (exited or diverged)", sched.name, from);
    return sched.shuffle[p][w][from];
}

void emu_mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    Fiber* f = sched.current;
    const int w = f->flat >> 5, lane = f->flat & 31, p = f->parity;
    f->parity ^= 1;
    f->exchanges++;
    for (int i = 0; i < 4; i++) sched.mma_a[p][w][lane][i] = a[i];
    sched.mma_b[p][w][lane][0] = b0;
    sched.mma_b[p][w][lane][1] = b1;
    wait_here(AT_WARP);
    // The first lane back unpacks the warp's A and B once for all 32 (the parity's buffers
    // are not written again before every lane has left this exchange).
    if (sched.mma_unpacked[p][w] != f->exchanges) {
        for (int l = 0; l < 32; l++)
            if (32 * w + l >= sched.threads || sched.fibers[32 * w + l].exchanges < f->exchanges)
                die("kernel %s: a tensor-core product without lane %d of the warp", sched.name, l);
        auto half = [](unsigned v, int high) { return (double)__uint_as_float(high ? (v & 0xffff0000u) : (v << 16)); };
        // A (16 x 16, rows): register (row / 8) + 2 (k / 8) of lane 4 (row % 8) + (k % 8) / 2,
        // half k % 2. B (16 x 8, columns): register k / 8 of lane 4 col + (k % 8) / 2, half k % 2.
        for (int row = 0; row < 16; row++)
            for (int k = 0; k < 16; k++)
                sched.mma_af[p][w][row][k] = half(sched.mma_a[p][w][4 * (row % 8) + (k % 8) / 2][row / 8 + 2 * (k / 8)], k & 1);
        for (int col = 0; col < 8; col++)
            for (int k = 0; k < 16; k++)
                sched.mma_bf[p][w][col][k] = half(sched.mma_b[p][w][4 * col + (k % 8) / 2][k / 8], k & 1);
        sched.mma_unpacked[p][w] = f->exchanges;
    }
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        // The products of two bf16 values are exact in double; their sum is taken in
        // double, in k order, then C is added and the result rounded to f32.
        const double* x = sched.mma_af[p][w][row];
        const double* y = sched.mma_bf[p][w][col];
        double sum = 0.0;
        for (int k = 0; k < 16; k++) sum += x[k] * y[k];
        d[i] = (float)(sum + (double)d[i]);
    }
}
}

namespace emu {

void run_grid(void (*kernel)(void**), std::pair<char*, size_t> shared, void** params, const char* name,
              dim3 grid, dim3 block) {
    const int threads = (int)(block.x * block.y * block.z);
    sched.kernel = kernel;
    sched.params = params;
    sched.name = name;
    emu_block_dim = block;
    emu_grid_dim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu_block_idx = dim3{x, y, z};
                if (shared.first) memset(shared.first, 0xff, shared.second);
                run_block(threads);
            }
}

}  // namespace emu
