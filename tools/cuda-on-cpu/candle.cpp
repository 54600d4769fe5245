// The candle kernels suffixd's CUDA path launches (candle-kernels 0.11: casts, copies,
// constants, affine, element-wise f32 operations, Q8_0 and Q4_1 dequantization), as host
// functions that do a whole launch's work, with candle's signatures (README.md). Any
// other candle kernel refuses to launch, by name (driver.cpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "emulator.h"

namespace {

// candle's strided index: info = dims[num_dims] then strides[num_dims]; null info or a
// contiguous layout is the identity.
size_t strided_index(size_t i, size_t num_dims, const size_t* info) {
    if (!info) return i;
    const size_t* dims = info;
    const size_t* strides = info + num_dims;
    size_t at = 0;
    for (size_t d = num_dims; d-- > 0;) {
        at += (i % dims[d]) * strides[d];
        i /= dims[d];
    }
    return at;
}

template <typename From, typename To, To (*convert)(From)>
void candle_cast(void** p) {
    const size_t numel = *static_cast<size_t*>(p[0]), dims = *static_cast<size_t*>(p[1]);
    const size_t* info = *static_cast<const size_t**>(p[2]);
    const From* in = *static_cast<const From**>(p[3]);
    To* out = *static_cast<To**>(p[4]);
    for (size_t i = 0; i < numel; i++) out[i] = convert(in[strided_index(i, dims, info)]);
}
// affine_f32(numel, num_dims, info, inp, out, mul, add): out = in * mul + add (in place
// when inp is null).
void candle_affine_f32(void** p) {
    const size_t numel = *static_cast<size_t*>(p[0]), dims = *static_cast<size_t*>(p[1]);
    const size_t* info = *static_cast<const size_t**>(p[2]);
    const float* in = *static_cast<const float**>(p[3]);
    float* out = *static_cast<float**>(p[4]);
    const float mul = *static_cast<float*>(p[5]), add = *static_cast<float*>(p[6]);
    for (size_t i = 0; i < numel; i++) {
        const float x = in ? in[strided_index(i, dims, info)] : out[i];
        out[i] = x * mul + add;
    }
}
// Binary f32 operations (binary.cu): info = dims, lhs strides, rhs strides; null is
// contiguous.
template <float (*op)(float, float)>
void candle_binary_f32(void** p) {
    const size_t numel = *static_cast<size_t*>(p[0]), dims = *static_cast<size_t*>(p[1]);
    const size_t* info = *static_cast<const size_t**>(p[2]);
    const float* lhs = *static_cast<const float**>(p[3]);
    const float* rhs = *static_cast<const float**>(p[4]);
    float* out = *static_cast<float**>(p[5]);
    std::vector<size_t> l, r;
    if (info) {
        l.assign(info, info + dims);
        l.insert(l.end(), info + dims, info + 2 * dims);
        r.assign(info, info + dims);
        r.insert(r.end(), info + 2 * dims, info + 3 * dims);
    }
    for (size_t i = 0; i < numel; i++)
        out[i] = op(lhs[strided_index(i, dims, info ? l.data() : nullptr)], rhs[strided_index(i, dims, info ? r.data() : nullptr)]);
}
float f32_add(float a, float b) { return a + b; }
float f32_sub(float a, float b) { return a - b; }
float f32_mul(float a, float b) { return a * b; }
float f32_div(float a, float b) { return a / b; }
float f32_max(float a, float b) { return fmaxf(a, b); }
float f32_min(float a, float b) { return fminf(a, b); }
float f32_cos(float a) { return cosf(a); }
float f32_sin(float a) { return sinf(a); }
float f32_exp(float a) { return expf(a); }
float f32_sqrt(float a) { return sqrtf(a); }
float f32_neg(float a) { return -a; }
float f32_recip(float a) { return 1.0f / a; }
float f32_sqr(float a) { return a * a; }
// copy2d(src, dst, d1, d2, src_stride, dst_stride): d1 rows of d2 elements.
template <typename T>
void candle_copy2d(void** p) {
    const T* src = *static_cast<const T**>(p[0]);
    T* dst = *static_cast<T**>(p[1]);
    const uint32_t d1 = *static_cast<uint32_t*>(p[2]), d2 = *static_cast<uint32_t*>(p[3]);
    const uint32_t ss = *static_cast<uint32_t*>(p[4]), ds = *static_cast<uint32_t*>(p[5]);
    for (uint32_t i = 0; i < d1; i++) memmove(dst + (size_t)i * ds, src + (size_t)i * ss, sizeof(T) * d2);
}
// const_set(numel, num_dims, info, value, out): every element of `out` (as laid out by
// info) set to `value`.
template <typename T>
void candle_const_set(void** p) {
    const size_t numel = *static_cast<size_t*>(p[0]), dims = *static_cast<size_t*>(p[1]);
    const size_t* info = *static_cast<const size_t**>(p[2]);
    const T value = *static_cast<T*>(p[3]);
    T* out = *static_cast<T**>(p[4]);
    for (size_t i = 0; i < numel; i++) out[strided_index(i, dims, info)] = value;
}

// IEEE half to float.
float half_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)mant, -24);
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

// GGUF blocks of 32 to f32 (quantized.cu's dequantize_block_*_f32(vx, y, nb32)).
void candle_dequantize_q8_0(void** p) {
    const uint8_t* x = *static_cast<const uint8_t**>(p[0]);
    float* y = *static_cast<float**>(p[1]);
    const int blocks = *static_cast<int*>(p[2]);
    for (int b = 0; b < blocks; b++, x += 34) {
        uint16_t d;
        memcpy(&d, x, 2);
        for (int j = 0; j < 32; j++) y[32 * b + j] = half_to_f32(d) * (float)(int8_t)x[2 + j];
    }
}
void candle_dequantize_q4_1(void** p) {
    const uint8_t* x = *static_cast<const uint8_t**>(p[0]);
    float* y = *static_cast<float**>(p[1]);
    const int blocks = *static_cast<int*>(p[2]);
    for (int b = 0; b < blocks; b++, x += 20) {
        uint16_t d, m;
        memcpy(&d, x, 2);
        memcpy(&m, x + 2, 2);
        const float df = half_to_f32(d), mf = half_to_f32(m);
        for (int j = 0; j < 16; j++) {
            y[32 * b + j] = (float)(x[4 + j] & 0xf) * df + mf;
            y[32 * b + j + 16] = (float)(x[4 + j] >> 4) * df + mf;
        }
    }
}
unsigned short f32_to_bf16(float f) { return emu_bf16_rn(f); }
float bf16_to_f32(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
template <typename T> T same(T x) { return x; }
template <typename From, typename To> To numeric(From x) { return (To)x; }

}  // namespace

namespace emu {

const std::map<std::string, void (*)(void**)>& candle_kernels() {
    static const std::map<std::string, void (*)(void**)> k = {
        {"affine_f32", &candle_affine_f32},
        {"const_set_f32", &candle_const_set<float>},
        {"const_set_bf16", &candle_const_set<unsigned short>},
        {"const_set_u32", &candle_const_set<unsigned>},
        {"dequantize_block_q8_0_f32", &candle_dequantize_q8_0},
        {"dequantize_block_q4_1_f32", &candle_dequantize_q4_1},
        {"copy2d_f32", &candle_copy2d<float>},
        {"copy2d_bf16", &candle_copy2d<unsigned short>},
        {"copy2d_u32", &candle_copy2d<unsigned>},
        {"copy2d_i64", &candle_copy2d<long long>},
        {"copy2d_u8", &candle_copy2d<unsigned char>},
        {"badd_f32", &candle_binary_f32<f32_add>},
        {"bsub_f32", &candle_binary_f32<f32_sub>},
        {"bmul_f32", &candle_binary_f32<f32_mul>},
        {"bdiv_f32", &candle_binary_f32<f32_div>},
        {"bmaximum_f32", &candle_binary_f32<f32_max>},
        {"bminimum_f32", &candle_binary_f32<f32_min>},
        {"ucos_f32", &candle_cast<float, float, f32_cos>},
        {"usin_f32", &candle_cast<float, float, f32_sin>},
        {"uexp_f32", &candle_cast<float, float, f32_exp>},
        {"usqrt_f32", &candle_cast<float, float, f32_sqrt>},
        {"uneg_f32", &candle_cast<float, float, f32_neg>},
        {"urecip_f32", &candle_cast<float, float, f32_recip>},
        {"usqr_f32", &candle_cast<float, float, f32_sqr>},
        {"cast_f32_bf16", &candle_cast<float, unsigned short, f32_to_bf16>},
        {"cast_bf16_f32", &candle_cast<unsigned short, float, bf16_to_f32>},
        {"cast_u32_f32", &candle_cast<unsigned, float, numeric<unsigned, float>>},
        {"cast_f32_u32", &candle_cast<float, unsigned, numeric<float, unsigned>>},
        {"cast_i64_f32", &candle_cast<long long, float, numeric<long long, float>>},
        {"cast_u8_f32", &candle_cast<unsigned char, float, numeric<unsigned char, float>>},
        {"cast_u32_i64", &candle_cast<unsigned, long long, numeric<unsigned, long long>>},
        {"cast_f32_f32", &candle_cast<float, float, same<float>>},
        {"ucopy_f32", &candle_cast<float, float, same<float>>},
        {"ucopy_bf16", &candle_cast<unsigned short, unsigned short, same<unsigned short>>},
        {"ucopy_u32", &candle_cast<unsigned, unsigned, same<unsigned>>},
        {"ucopy_i64", &candle_cast<long long, long long, same<long long>>},
        {"ucopy_u8", &candle_cast<unsigned char, unsigned char, same<unsigned char>>},
    };
    return k;
}

}  // namespace emu
