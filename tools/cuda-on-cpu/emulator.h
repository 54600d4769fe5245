// What the emulator's files share (README.md): driver.cpp (the libraries' entry points,
// modules, launches, graphs), threads.cpp (a block's threads as fibers, the warp's
// exchanges) and candle.cpp (the candle kernels suffixd's path launches).
#pragma once
#include <map>
#include <utility>
#include <string>

#include "shim.h"

namespace emu {

// Stop the process with a message that names the emulator.
[[noreturn]] void die(const char* fmt, ...);

// CUDA_ON_CPU_TRACE is set: name every launch and every unknown device attribute.
bool verbose();

// The SMs the device reports (CUDA_ON_CPU_SMS, default an H100's 132): a cooperative
// launch may have one block for each.
int multiprocessors();

// The most threads a block may have.
constexpr int MAX_THREADS = 1024;

// Run `kernel` (a kernel's entry, shim.h's EmuEntry::run) for every thread of every block
// of `grid`, blocks one after another, `shared` (its module's statics) filled with 0xff
// bytes before each (threads.cpp); `cooperative`: every block at once, each with its own
// copy of `shared`, taking turns whenever a block's threads all wait and one of them
// waits for another block. `name` is for messages.
void run_grid(void (*kernel)(void**), std::pair<char*, size_t> shared, void** params, const char* name,
              dim3 grid, dim3 block, bool cooperative);

// candle's kernels by name, each a host function that does a whole launch's work
// (candle.cpp).
const std::map<std::string, void (*)(void**)>& candle_kernels();

}  // namespace emu
