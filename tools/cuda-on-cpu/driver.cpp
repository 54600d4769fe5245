// A CUDA driver that runs suffixd's kernels on the CPU (README.md in this folder): the
// parts of the driver API (libcuda), NVRTC, cuBLAS and cuRAND that suffixd's CUDA build
// calls, in one library that the build's binaries load under those libraries' names.
//
// - Memory is host memory: a device pointer is a host address. Fresh allocations are
//   filled with 0xff bytes (NaN as f32, -1 as i32), so a read of memory no one wrote
//   shows up instead of passing by luck.
// - Everything runs synchronously, in launch order, on the calling thread; streams and
//   events only keep their bookkeeping. One launch at a time in a process.
// - NVRTC "compiles" by keeping the source and its -D options; loading that module
//   compiles the source with g++ against shim.h (cached by the source's hash) and finds
//   its `extern "C" __global__` kernels. Other modules (candle's PTX) get the few candle
//   kernels suffixd's path uses (candle.cpp); any other kernel refuses to launch by name.
// - A block's threads are fibers; `__syncthreads`, shuffles and the tensor-core product
//   switch between them (threads.cpp). Blocks run one after another.
// - Graph capture records launches, copies and sets with their parameters' values;
//   a graph launch replays them.
// - cuBLAS and cuRAND: handles only, and cuRAND's normal and uniform generators from a
//   seeded host generator (not cuRAND's sequence). A cuBLAS product refuses by name.
// Anything else is a stub (stubs.c, generated from the headers) that names itself on
// stderr and fails.
#include <cuda.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <nvrtc.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "emulator.h"

namespace emu {

void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda-on-cpu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

bool verbose() {
    static const bool v = getenv("CUDA_ON_CPU_TRACE") != nullptr;
    return v;
}

int multiprocessors() {
    static const int n = [] {
        const char* v = getenv("CUDA_ON_CPU_SMS");
        const int sms = v ? atoi(v) : 132;
        if (sms < 1 || sms > 1024) die("CUDA_ON_CPU_SMS=%s: give 1 to 1024", v);
        return sms;
    }();
    return n;
}

}  // namespace emu

using emu::die;
using emu::verbose;

namespace {

std::recursive_mutex launch_lock;

// ---- Modules and kernels ----

struct Function {
    std::string name;
    void (*run)(void**) = nullptr;
    const size_t* param_sizes = nullptr;  // ends with 0; null: unknown
    bool whole_launch = false;            // a host function that does the whole launch's work
    char* shared = nullptr;               // its module's statics: the kernels' shared memory
    size_t shared_bytes = 0;
};

struct Module {
    void* library = nullptr;
    std::map<std::string, Function*> functions;
};

std::string own_folder() {
    Dl_info info;
    if (!dladdr(reinterpret_cast<void*>(&own_folder), &info) || !info.dli_fname) die("cannot find this library's path");
    std::string path = info.dli_fname;
    return path.substr(0, path.rfind('/'));
}

std::string read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return "";
    std::string s;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
}

void write_file(const std::string& path, const std::string& text) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(text.data(), 1, text.size(), f) != text.size() || fclose(f) != 0) die("cannot write %s", path.c_str());
}

// The names of the `extern "C" __global__` kernels in preprocessed source.
std::vector<std::string> kernel_names(const std::string& text) {
    std::vector<std::string> names;
    const std::string marker = "extern \"C\" __global__ void";
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
        size_t i = at + marker.size();
        auto skip_space = [&] { while (i < text.size() && isspace((unsigned char)text[i])) i++; };
        skip_space();
        if (text.compare(i, 17, "__launch_bounds__") == 0) {
            i = text.find('(', i);
            int depth = 0;
            for (; i < text.size(); i++) {
                depth += text[i] == '(';
                depth -= text[i] == ')';
                if (depth == 0) { i++; break; }
            }
            skip_space();
        }
        size_t start = i;
        while (i < text.size() && (isalnum((unsigned char)text[i]) || text[i] == '_')) i++;
        names.push_back(text.substr(start, i - start));
    }
    return names;
}

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// Where the loaded library `handle` (the file at `path`) has its .bss: the kernels'
// `__shared__` statics, and nothing else (the source has no globals).
std::pair<char*, size_t> bss_of(void* handle, const std::string& path) {
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map) die("cannot find where %s was loaded", path.c_str());
    const std::string file = read_file(path);
    Elf64_Ehdr header;
    if (file.size() < sizeof header) die("%s is not an ELF file", path.c_str());
    memcpy(&header, file.data(), sizeof header);
    if (header.e_shoff + (size_t)header.e_shnum * sizeof(Elf64_Shdr) > file.size() || header.e_shstrndx >= header.e_shnum)
        die("%s has no section table", path.c_str());
    std::vector<Elf64_Shdr> sections(header.e_shnum);
    memcpy(sections.data(), file.data() + header.e_shoff, sections.size() * sizeof(Elf64_Shdr));
    const char* names = file.data() + sections[header.e_shstrndx].sh_offset;
    for (const auto& s : sections)
        if (strcmp(names + s.sh_name, ".bss") == 0) return {reinterpret_cast<char*>(map->l_addr + s.sh_addr), s.sh_size};
    return {nullptr, 0};
}

// Compile kernel source (as NVRTC was given it, with its -D options) for the CPU.
Module* load_source_module(const std::string& defines, const std::string& source) {
    const std::string key = std::to_string(std::hash<std::string>{}(defines + "\n" + source));
    const char* cache_env = getenv("CUDA_ON_CPU_CACHE");
    const std::string cache = cache_env ? cache_env : "/tmp/cuda-on-cpu-cache";
    const std::string dir = cache + "/" + key;
    const std::string so = dir + "/kernels.so";
    if (access(so.c_str(), R_OK) != 0) {
        if (system(("mkdir -p " + shell_quote(dir)).c_str()) != 0) die("cannot make %s", dir.c_str());
        write_file(dir + "/source.cu", source);
        const std::string pre = dir + "/preprocessed.cu";
        const std::string pp = "g++ -E -P -x c++ " + defines + " " + shell_quote(dir + "/source.cu") + " -o " + shell_quote(pre);
        if (system(pp.c_str()) != 0) die("the preprocessor refused the kernels: %s", pp.c_str());
        std::string unit = "#include \"source.cu\"\nextern \"C\" const EmuKernel emu_kernels[] = {\n";
        for (const auto& n : kernel_names(read_file(pre))) unit += "    EMU_KERNEL(" + n + "),\n";
        unit += "    {nullptr, nullptr, nullptr}};\n";
        write_file(dir + "/unit.cpp", unit);
        const std::string cc = "g++ -std=c++17 -O2 -march=native -ffp-contract=off -fno-strict-aliasing -fPIC -shared -w -include " +
                               shell_quote(own_folder() + "/shim.h") + " " + defines + " " + shell_quote(dir + "/unit.cpp") +
                               " -o " + shell_quote(so + ".tmp") + " && mv " + shell_quote(so + ".tmp") + " " + shell_quote(so);
        if (verbose()) fprintf(stderr, "cuda-on-cpu: %s\n", cc.c_str());
        if (system(cc.c_str()) != 0) die("g++ refused the kernels: %s", cc.c_str());
    }
    auto* m = new Module;
    m->library = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!m->library) die("cannot load %s: %s", so.c_str(), dlerror());
    auto* table = static_cast<const EmuKernel*>(dlsym(m->library, "emu_kernels"));
    const auto [shared, shared_bytes] = bss_of(m->library, so);
    if (verbose()) fprintf(stderr, "cuda-on-cpu: %s: %zu bytes of shared statics\n", so.c_str(), shared_bytes);
    if (!table) die("%s has no kernel table", so.c_str());
    for (; table->name; table++) {
        auto* f = new Function;
        f->name = table->name;
        f->run = table->run;
        f->param_sizes = table->param_sizes;
        f->shared = shared;
        f->shared_bytes = shared_bytes;
        m->functions[f->name] = f;
    }
    return m;
}

Module* load_ptx_module(const char* ptx) {
    auto* m = new Module;
    const std::string text = ptx;
    for (size_t at = text.find(".entry "); at != std::string::npos; at = text.find(".entry ", at + 1)) {
        size_t i = at + 7, start = i;
        while (i < text.size() && (isalnum((unsigned char)text[i]) || text[i] == '_')) i++;
        auto* f = new Function;
        f->name = text.substr(start, i - start);
        auto known = emu::candle_kernels().find(f->name);
        if (known != emu::candle_kernels().end()) {
            f->run = known->second;
            f->whole_launch = true;
        }
        m->functions[f->name] = f;
    }
    return m;
}

// ---- Launches, and graphs that record them ----

struct Node {
    enum Kind { KERNEL, COPY, SET } kind = KERNEL;
    Function* function = nullptr;
    dim3 grid{}, block{};
    bool cooperative = false;               // every block at once (cuLaunchKernelEx's attribute)
    std::vector<std::vector<char>> values;  // a kernel's parameters, by value
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    unsigned char byte = 0;
};

struct Graph {
    std::vector<Node> nodes;
};

struct Stream {
    Graph* capture = nullptr;  // while capturing
};
Stream default_stream;
// The null stream and the special handles (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) are
// the default stream.
Stream* stream_of(CUstream s) {
    return reinterpret_cast<uintptr_t>(s) < 4096 ? &default_stream : reinterpret_cast<Stream*>(s);
}

void run_kernel(Function* f, dim3 grid, dim3 block, void** params, bool cooperative) {
    std::lock_guard<std::recursive_mutex> guard(launch_lock);
    if (!f->run) die("kernel %s has no CPU version (tools/cuda-on-cpu/driver.cpp)", f->name.c_str());
    const int threads = (int)(block.x * block.y * block.z);
    if (threads < 1 || threads > emu::MAX_THREADS) die("kernel %s launched with %d threads a block", f->name.c_str(), threads);
    if (verbose())
        fprintf(stderr, "cuda-on-cpu: %s <<<(%u,%u,%u),(%u,%u,%u)>>>%s\n", f->name.c_str(), grid.x, grid.y, grid.z, block.x,
                block.y, block.z, cooperative ? " cooperative" : "");
    if (f->whole_launch) {
        f->run(params);
        return;
    }
    emu::run_grid(f->run, {f->shared, f->shared_bytes}, params, f->name.c_str(), grid, block, cooperative);
}

void run_node(const Node& n) {
    switch (n.kind) {
        case Node::KERNEL: {
            std::vector<void*> params;
            for (const auto& v : n.values) params.push_back(const_cast<char*>(v.data()));
            run_kernel(n.function, n.grid, n.block, params.data(), n.cooperative);
            break;
        }
        case Node::COPY: memmove(n.dst, n.src, n.bytes); break;
        case Node::SET: memset(n.dst, n.byte, n.bytes); break;
    }
}

CUresult launch(Function* f, dim3 grid, dim3 block, CUstream s, void** params, bool cooperative = false) {
    Stream* st = stream_of(s);
    if (cooperative && (size_t)grid.x * grid.y * grid.z > (size_t)emu::multiprocessors())
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;  // one block per SM fits, as emulated
    if (!st->capture) {
        run_kernel(f, grid, block, params, cooperative);
        return CUDA_SUCCESS;
    }
    if (!f->param_sizes) die("kernel %s cannot be captured into a graph: its parameters' sizes are unknown", f->name.c_str());
    Node n;
    n.function = f;
    n.grid = grid;
    n.block = block;
    n.cooperative = cooperative;
    for (int i = 0; f->param_sizes[i]; i++) {
        const char* v = static_cast<const char*>(params[i]);
        n.values.emplace_back(v, v + f->param_sizes[i]);
    }
    st->capture->nodes.push_back(std::move(n));
    return CUDA_SUCCESS;
}

// A copy or a set on stream `s`: done now, or recorded while the stream captures.
CUresult run_or_record(CUstream s, const Node& n) {
    Stream* st = stream_of(s);
    if (st->capture) {
        st->capture->nodes.push_back(n);
    } else {
        run_node(n);
    }
    return CUDA_SUCCESS;
}

CUresult copy(CUstream s, void* dst, const void* src, size_t bytes) {
    Node n;
    n.kind = Node::COPY, n.dst = dst, n.src = src, n.bytes = bytes;
    return run_or_record(s, n);
}

CUresult set(CUstream s, void* dst, unsigned char byte, size_t bytes) {
    Node n;
    n.kind = Node::SET, n.dst = dst, n.byte = byte, n.bytes = bytes;
    return run_or_record(s, n);
}

// ---- Memory ----

std::mutex memory_lock;
std::map<void*, size_t> allocations;
size_t allocated = 0;

size_t total_memory() {
    const char* v = getenv("CUDA_ON_CPU_MEMORY_GIB");
    return (size_t)(v ? atof(v) : 16.0) * (1ull << 30);
}

CUresult allocate(CUdeviceptr* out, size_t bytes) {
    void* p = aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256));
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0xff, bytes);
    std::lock_guard<std::mutex> g(memory_lock);
    allocations[p] = bytes;
    allocated += bytes;
    *out = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
}

CUresult release(CUdeviceptr d) {
    void* p = reinterpret_cast<void*>(d);
    if (!p) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> g(memory_lock);
    auto it = allocations.find(p);
    if (it == allocations.end()) return CUDA_ERROR_INVALID_VALUE;
    allocated -= it->second;
    allocations.erase(it);
    free(p);
    return CUDA_SUCCESS;
}

void* ptr(CUdeviceptr d) { return reinterpret_cast<void*>(d); }

int dummy_context, dummy_handle;

}  // namespace

// ---- The driver API ----

extern "C" {

CUresult cuInit(unsigned) { return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int* v) { *v = 13000; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int* n) { *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice) {
    snprintf(name, len, "cuda-on-cpu (the CPU, emulating an sm_90 GPU)");
    return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t* bytes, CUdevice) { *bytes = total_memory(); return CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
    switch (a) {
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = emu::multiprocessors(); break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
        case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 48 * 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 227 * 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 0x7fffffff; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; break;
        case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; break;
        case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
        default:
            if (verbose()) fprintf(stderr, "cuda-on-cpu: device attribute %d is 0 here\n", (int)a);
            *v = 0;
    }
    return CUDA_SUCCESS;
}
CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice) { *major = 9; *minor = 0; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) { *c = reinterpret_cast<CUcontext>(&dummy_context); return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease(CUdevice) { return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext* c) { *c = reinterpret_cast<CUcontext>(&dummy_context); return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent(CUcontext* c) { if (c) *c = reinterpret_cast<CUcontext>(&dummy_context); return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice* d) { *d = 0; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize() { return CUDA_SUCCESS; }
CUresult cuCtxGetApiVersion(CUcontext, unsigned* v) { *v = 13000; return CUDA_SUCCESS; }

CUresult cuGetErrorString(CUresult e, const char** s) {
    *s = e == CUDA_SUCCESS ? "no error" : "an error from the CPU emulation (tools/cuda-on-cpu): see stderr";
    return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult e, const char** s) {
    *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FROM_CUDA_ON_CPU";
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t* free_bytes, size_t* total) {
    std::lock_guard<std::mutex> g(memory_lock);
    *total = total_memory();
    *free_bytes = *total > allocated ? *total - allocated : 0;
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc(CUdeviceptr* d, size_t bytes) { return allocate(d, bytes); }
CUresult cuMemAllocAsync(CUdeviceptr* d, size_t bytes, CUstream) { return allocate(d, bytes); }
CUresult cuMemFree(CUdeviceptr d) { return release(d); }
CUresult cuMemFreeAsync(CUdeviceptr d, CUstream) { return release(d); }
CUresult cuMemAllocHost(void** p, size_t bytes) { *p = malloc(std::max<size_t>(bytes, 1)); return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY; }
CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) { return cuMemAllocHost(p, bytes); }
CUresult cuMemFreeHost(void* p) { free(p); return CUDA_SUCCESS; }
CUresult cuMemHostRegister(void*, size_t, unsigned) { return CUDA_SUCCESS; }
CUresult cuMemHostUnregister(void*) { return CUDA_SUCCESS; }

CUresult cuMemcpyHtoD(CUdeviceptr d, const void* h, size_t n) { return copy(nullptr, ptr(d), h, n); }
CUresult cuMemcpyDtoH(void* h, CUdeviceptr d, size_t n) { return copy(nullptr, h, ptr(d), n); }
CUresult cuMemcpyDtoD(CUdeviceptr a, CUdeviceptr b, size_t n) { return copy(nullptr, ptr(a), ptr(b), n); }
CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void* h, size_t n, CUstream s) { return copy(s, ptr(d), h, n); }
CUresult cuMemcpyDtoHAsync(void* h, CUdeviceptr d, size_t n, CUstream s) { return copy(s, h, ptr(d), n); }
CUresult cuMemcpyDtoDAsync(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) { return copy(s, ptr(a), ptr(b), n); }
CUresult cuMemcpyAsync(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) { return copy(s, ptr(a), ptr(b), n); }
CUresult cuMemcpy(CUdeviceptr a, CUdeviceptr b, size_t n) { return copy(nullptr, ptr(a), ptr(b), n); }
CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { return set(nullptr, ptr(d), v, n); }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return set(s, ptr(d), v, n); }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) {
    if (v != 0 && v != 0xffffffffu) die("cuMemsetD32 of a value other than 0 or all ones");
    return set(s, ptr(d), (unsigned char)v, 4 * n);
}

CUresult cuStreamCreate(CUstream* s, unsigned) { *s = reinterpret_cast<CUstream>(new Stream); return CUDA_SUCCESS; }
CUresult cuStreamCreateWithPriority(CUstream* s, unsigned, int) { return cuStreamCreate(s, 0); }
CUresult cuStreamDestroy(CUstream s) { delete reinterpret_cast<Stream*>(s); return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }
CUresult cuStreamQuery(CUstream) { return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned) { return CUDA_SUCCESS; }

struct Event {
    std::chrono::steady_clock::time_point at;
};
CUresult cuEventCreate(CUevent* e, unsigned) { *e = reinterpret_cast<CUevent>(new Event); return CUDA_SUCCESS; }
CUresult cuEventDestroy(CUevent e) { delete reinterpret_cast<Event*>(e); return CUDA_SUCCESS; }
CUresult cuEventRecord(CUevent e, CUstream) { reinterpret_cast<Event*>(e)->at = std::chrono::steady_clock::now(); return CUDA_SUCCESS; }
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned) { return cuEventRecord(e, s); }
CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventQuery(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
    *ms = std::chrono::duration<float, std::milli>(reinterpret_cast<Event*>(b)->at - reinterpret_cast<Event*>(a)->at).count();
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* m, const void* image) {
    const char* text = static_cast<const char*>(image);
    const char* marker = "//cuda-on-cpu\n";
    Module* mod;
    if (strncmp(text, marker, strlen(marker)) == 0) {
        const char* defines = text + strlen(marker);
        const char* end = strchr(defines, '\n');
        if (!end) die("a module from the emulated NVRTC without its options line");
        mod = load_source_module(std::string(defines, end), end + 1);
    } else {
        mod = load_ptx_module(text);
    }
    *m = reinterpret_cast<CUmodule>(mod);
    return CUDA_SUCCESS;
}
CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned, CUjit_option*, void**) { return cuModuleLoadData(m, image); }
CUresult cuModuleUnload(CUmodule) { return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    auto* mod = reinterpret_cast<Module*>(m);
    auto it = mod->functions.find(name);
    if (it == mod->functions.end()) return CUDA_ERROR_NOT_FOUND;
    *f = reinterpret_cast<CUfunction>(it->second);
    return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; }
CUresult cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction) {
    *v = a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0;
    return CUDA_SUCCESS;
}
CUresult cuFuncSetCacheConfig(CUfunction, CUfunc_cache) { return CUDA_SUCCESS; }

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void** params, void** extra) {
    if (extra) die("cuLaunchKernel with `extra` parameters");
    if (shared) die("dynamic shared memory (%u bytes) is not emulated", shared);
    return launch(reinterpret_cast<Function*>(f), dim3{gx, gy, gz}, dim3{bx, by, bz}, s, params);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
    if (extra) die("cuLaunchKernelEx with `extra` parameters");
    if (c->sharedMemBytes) die("dynamic shared memory (%u bytes) is not emulated", c->sharedMemBytes);
    // Programmatic dependent launch changes nothing here: launches run one after another.
    bool cooperative = false;
    for (unsigned i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) cooperative = c->attrs[i].value.cooperative != 0;
    return launch(reinterpret_cast<Function*>(f), dim3{c->gridDimX, c->gridDimY, c->gridDimZ},
                  dim3{c->blockDimX, c->blockDimY, c->blockDimZ}, c->hStream, params, cooperative);
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shared, CUstream s, void** params) {
    if (shared) die("dynamic shared memory (%u bytes) is not emulated", shared);
    return launch(reinterpret_cast<Function*>(f), dim3{gx, gy, gz}, dim3{bx, by, bz}, s, params, true);
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, CUfunction, int threads, size_t shared, unsigned) {
    // One block of any size a launch allows, and no dynamic shared memory.
    *blocks = threads >= 1 && threads <= emu::MAX_THREADS && shared == 0 ? 1 : 0;
    return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction f, int threads, size_t shared) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, threads, shared, 0);
}

CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode) {
    Stream* st = stream_of(s);
    if (st->capture) return CUDA_ERROR_ILLEGAL_STATE;
    st->capture = new Graph;
    return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream s, CUgraph* g) {
    Stream* st = stream_of(s);
    if (!st->capture) return CUDA_ERROR_ILLEGAL_STATE;
    *g = reinterpret_cast<CUgraph>(st->capture);
    st->capture = nullptr;
    return CUDA_SUCCESS;
}
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
    *status = stream_of(s)->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long) {
    *e = reinterpret_cast<CUgraphExec>(new Graph(*reinterpret_cast<Graph*>(g)));
    return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    if (stream_of(s)->capture) die("a graph launched into a capture");
    const auto& nodes = reinterpret_cast<Graph*>(e)->nodes;
    if (verbose()) fprintf(stderr, "cuda-on-cpu: a graph of %zu nodes\n", nodes.size());
    for (const Node& n : nodes) run_node(n);
    return CUDA_SUCCESS;
}
CUresult cuGraphUpload(CUgraphExec, CUstream) { return CUDA_SUCCESS; }
CUresult cuGraphExecDestroy(CUgraphExec e) { delete reinterpret_cast<Graph*>(e); return CUDA_SUCCESS; }
CUresult cuGraphDestroy(CUgraph g) { delete reinterpret_cast<Graph*>(g); return CUDA_SUCCESS; }

// ---- NVRTC: keep the source and its -D options for cuModuleLoadData ----

struct Program {
    std::string source, ptx;
};
nvrtcResult nvrtcCreateProgram(nvrtcProgram* p, const char* src, const char*, int headers, const char* const*,
                               const char* const*) {
    if (headers) die("NVRTC headers are not emulated");
    auto* prog = new Program;
    prog->source = src;
    *p = reinterpret_cast<nvrtcProgram>(prog);
    return NVRTC_SUCCESS;
}
nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int n, const char* const* options) {
    auto* prog = reinterpret_cast<Program*>(p);
    std::string defines;
    for (int i = 0; i < n; i++)
        if (strncmp(options[i], "-D", 2) == 0) defines += (defines.empty() ? "" : " ") + shell_quote(options[i]);
    prog->ptx = "//cuda-on-cpu\n" + defines + "\n" + prog->source;
    return NVRTC_SUCCESS;
}
nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t* n) { *n = reinterpret_cast<Program*>(p)->ptx.size() + 1; return NVRTC_SUCCESS; }
nvrtcResult nvrtcGetPTX(nvrtcProgram p, char* out) {
    const auto& s = reinterpret_cast<Program*>(p)->ptx;
    memcpy(out, s.c_str(), s.size() + 1);
    return NVRTC_SUCCESS;
}
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram, size_t* n) { *n = 1; return NVRTC_SUCCESS; }
nvrtcResult nvrtcGetProgramLog(nvrtcProgram, char* log) { *log = 0; return NVRTC_SUCCESS; }
nvrtcResult nvrtcDestroyProgram(nvrtcProgram* p) { delete reinterpret_cast<Program*>(*p); *p = nullptr; return NVRTC_SUCCESS; }
const char* nvrtcGetErrorString(nvrtcResult) { return "an NVRTC error from the CPU emulation (tools/cuda-on-cpu)"; }
nvrtcResult nvrtcVersion(int* major, int* minor) { *major = 13; *minor = 0; return NVRTC_SUCCESS; }

// ---- cuBLAS, cuBLASLt: handles only ----

int cublasCreate_v2(void** h) { *h = &dummy_handle; return 0; }
int cublasDestroy_v2(void*) { return 0; }
int cublasSetStream_v2(void*, void*) { return 0; }
int cublasSetWorkspace_v2(void*, void*, size_t) { return 0; }
int cublasSetMathMode(void*, int) { return 0; }
int cublasLtCreate(void** h) { *h = &dummy_handle; return 0; }
int cublasLtDestroy(void*) { return 0; }

// ---- cuRAND: a seeded host generator ----

struct Generator {
    std::mt19937_64 engine;
};
int curandCreateGenerator(void** g, int) { *g = new Generator; return 0; }
int curandDestroyGenerator(void* g) { delete static_cast<Generator*>(g); return 0; }
int curandSetPseudoRandomGeneratorSeed(void* g, unsigned long long seed) { static_cast<Generator*>(g)->engine.seed(seed); return 0; }
int curandSetGeneratorOffset(void* g, unsigned long long offset) { static_cast<Generator*>(g)->engine.discard(offset); return 0; }
int curandSetStream(void*, void*) { return 0; }
int curandGenerateUniform(void* g, float* out, size_t n) {
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (size_t i = 0; i < n; i++) out[i] = 1.0f - u(static_cast<Generator*>(g)->engine);  // (0, 1]
    return 0;
}
int curandGenerateNormal(void* g, float* out, size_t n, float mean, float sd) {
    std::normal_distribution<float> d(mean, sd);
    for (size_t i = 0; i < n; i++) out[i] = d(static_cast<Generator*>(g)->engine);
    return 0;
}
int curandGenerateUniformDouble(void* g, double* out, size_t n) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (size_t i = 0; i < n; i++) out[i] = 1.0 - u(static_cast<Generator*>(g)->engine);
    return 0;
}
int curandGenerateNormalDouble(void* g, double* out, size_t n, double mean, double sd) {
    std::normal_distribution<double> d(mean, sd);
    for (size_t i = 0; i < n; i++) out[i] = d(static_cast<Generator*>(g)->engine);
    return 0;
}

}  // extern "C"

extern "C" int emu_stub(const char* name) {
    fprintf(stderr, "cuda-on-cpu: %s is not emulated (tools/cuda-on-cpu/driver.cpp)\n", name);
    return 801;  // CUDA_ERROR_NOT_SUPPORTED
}
