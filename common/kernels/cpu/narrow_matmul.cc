// XLA FFI handlers for products of float32 activations x [rows, in] with a weight stored narrow as [out, in]
// (torch's layout; the product contracts the last axes): int8 per output channel, int4 in groups of 32, bfloat16.
// common/kernels/narrow_matmul.py calls them through jax.ffi and holds the pure-JAX references they are tested
// against.
//
// With int8 and int4 weights the activations are first quantized per block of 32 along `in`: to int16 for int8
// weights, to int8 for int4 weights (as llama.cpp's q8_0): d = max|x| * (1 / L) in float32 (L = 32767 or 127), q =
// round(x * (1 / d)) to nearest even, so the product is x' w with x' = q * d: integer dot products per block, each
// block's sum scaled once. bfloat16 weights take float32 activations as they are.
//
// One build runs on every x86-64 CPU: the kernel (narrow_matmul_kernel.h) is compiled three times, for AVX-512,
// for AVX2 + FMA and as plain C++, and each call takes the best one the CPU has (or the one its `isa` attribute
// names, if the CPU has that one: the tests force AVX2 on an AVX-512 machine). Other CPUs get the plain C++ one.
// The weight's output rows are split across XLA's intra-op thread pool; the calling thread works too.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#define OMNIJAX_X86 1
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace omnijax_kernels {

constexpr int kGroup = 32;  // int4 values per group (one scale and offset)

enum class Format { kInt8, kInt4, kBf16 };

// x quantized per block of 32 (see the top of this file), laid out for one instruction set's inner loops.
struct Activations {
  // int8 weights: q8 [rows, stride8] int16 (zeros past `in`, stride8 a multiple of 64), d8 [rows, stride8 / 32]
  // each block's d
  int64_t stride8 = 0;
  const int16_t* q8 = nullptr;
  const float* d8 = nullptr;
  // int4 weights: per row, chunks4 chunks of kGroups4 groups; a chunk's q4 holds the 16 first values of each of
  // its groups, then the 16 last ones (the order of the weights' low and high nibbles); lanes4 [rows, chunks4,
  // width] each lane's group's d; sums4 [rows, groups4] each group's d * sum(q)
  int64_t chunks4 = 0, groups4 = 0;
  const int8_t* q4 = nullptr;
  const float* lanes4 = nullptr;
  const float* sums4 = nullptr;
};

// One product: x [rows, in] float32, the weight's parts, y [rows, out] float32.
struct Problem {
  Format format;
  const float* x;
  const void* values;   // int8 [out, in] | uint8 [out, in / 2] | bfloat16 bits [out, in]
  const void* scales;   // float32 [out] | float16 bits [out, in / 32] | unused
  const void* offsets;  // float16 bits [out, in / 32] for int4
  float* y;
  int64_t rows, in, out;
  const Activations* acts = nullptr;  // int8 and int4
};

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// IEEE float16 bits to float32 (exact, subnormals, infinities and NaN included).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000 | (mantissa << 13));
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);  // mantissa * 2^-24
  return sign ? -magnitude : magnitude;
}

namespace scalar {
struct Isa {
  using V = float;
  static constexpr int kWidth = 1;
  static constexpr int kOutBlock = 4;
  static constexpr int kRowBlock = 4;
  static V Zero() { return 0.0f; }
  static V Load(const float* p) { return *p; }
  static V Set1(float v) { return v; }
  static V Fma(V a, V b, V c) { return a * b + c; }
  static float Sum(V v) { return v; }
  static void Halves(const uint16_t* h, int64_t n, float* f) {
    for (int64_t i = 0; i < n; ++i) f[i] = HalfToFloat(h[i]);
  }
  static V Int8s(const int8_t* p) { return static_cast<float>(*p); }
  static V Bf16s(const uint16_t* p) { return Bf16ToFloat(*p); }
  static V Mul(V a, V b) { return a * b; }
  // int8: one block of 32 at a time
  static constexpr int kStep8 = kGroup;
  struct W8 { int32_t w[kGroup]; };
  static W8 Weights8(const int8_t* p) { return Weights8Part(p, kGroup); }
  static W8 Weights8Part(const int8_t* p, int64_t n) {
    W8 w{};
    for (int64_t i = 0; i < n; ++i) w.w[i] = p[i];
    return w;
  }
  static V Dot8(const W8& w, const int16_t* q, const float* d, V acc) {
    int32_t sum = 0;
    for (int i = 0; i < kGroup; ++i) sum += w.w[i] * q[i];
    return acc + static_cast<float>(sum) * d[0];
  }
  // int4: one group at a time
  static constexpr int kGroups4 = 1;
  static const uint8_t* Weights4(const uint8_t* p) { return p; }
  static const uint8_t* Weights4Part(const uint8_t* p, int64_t) { return p; }
  static V Dot4(const uint8_t* w, const int8_t* q) {
    int32_t sum = 0;
    for (int j = 0; j < kGroup / 2; ++j) sum += (w[j] & 15) * q[j] + (w[j] >> 4) * q[j + kGroup / 2];
    return static_cast<float>(sum);
  }
  static V Scales4(const uint16_t* s, int64_t) { return HalfToFloat(*s); }
  static float HalfDot(const uint16_t* h, const float* f, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += HalfToFloat(h[i]) * f[i];
    return sum;
  }
};
#include "narrow_matmul_kernel.h"
}  // namespace scalar

#ifdef OMNIJAX_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
struct Isa {
  using V = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kOutBlock = 2;
  static constexpr int kRowBlock = 4;  // 16 vector registers: 8 sums, the weights and x
  static V Zero() { return _mm256_setzero_ps(); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static V Set1(float v) { return _mm256_set1_ps(v); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float Sum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void Halves(const uint16_t* h, int64_t n, float* f) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
    for (; i < n; ++i) f[i] = _cvtsh_ss(h[i]);
  }
  static V Int8s(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static V Bf16s(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  // int8: one block of 32 at a time, the weights widened to int16 (vpmaddwd)
  static constexpr int kStep8 = 32;
  struct W8 { __m256i low, high; };
  static W8 Weights8(const int8_t* p) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1))};
  }
  static W8 Weights8Part(const int8_t* p, int64_t n) {
    alignas(32) int8_t buf[32] = {};
    std::memcpy(buf, p, static_cast<size_t>(n));
    return Weights8(buf);
  }
  static V Dot8(const W8& w, const int16_t* q, const float* d, V acc) {
    const __m256i sum = _mm256_add_epi32(
        _mm256_madd_epi16(w.low, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
        _mm256_madd_epi16(w.high, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16))));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ss(d), acc);
  }
  // int4: 2 groups (32 bytes) at a time
  static constexpr int kGroups4 = 2;
  static __m256i Weights4(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static __m256i Weights4Part(const uint8_t* p, int64_t) {  // one group
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V Dot4(__m256i w, const int8_t* q) {
    const __m256i mask = _mm256_set1_epi8(15);
    const __m256i low = _mm256_and_si256(w, mask), high = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
    const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, xl), _mm256_maddubs_epi16(high, xh));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static V Scales4(const uint16_t* s, int64_t n) {  // [s0 x4, s1 x4]
    uint32_t bits = s[0];
    if (n > 1) bits |= static_cast<uint32_t>(s[1]) << 16;
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  }
  static float HalfDot(const uint16_t* h, const float* f, int64_t n) {
    V acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))),
                            _mm256_loadu_ps(f + i), acc);
    float sum = Sum(acc);
    for (; i < n; ++i) sum += _cvtsh_ss(h[i]) * f[i];
    return sum;
  }
};
#include "narrow_matmul_kernel.h"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace avx512 {
struct Isa {
  using V = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kOutBlock = 4;
  static constexpr int kRowBlock = 4;  // 32 vector registers: 16 sums, the weights and x
  static V Zero() { return _mm512_setzero_ps(); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V Set1(float v) { return _mm512_set1_ps(v); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float Sum(V v) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void Halves(const uint16_t* h, int64_t n, float* f) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(f + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
    for (; i < n; ++i) f[i] = _cvtsh_ss(h[i]);
  }
  static V Int8s(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static V Bf16s(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  // int8: two blocks of 32 at a time, the weights widened to int16 (vpdpwssd)
  static constexpr int kStep8 = 64;
  struct W8 { __m512i low, high; };
  static W8 Weights8(const int8_t* p) {
    return {_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)))};
  }
  static W8 Weights8Part(const int8_t* p, int64_t n) {
    const __m512i w = _mm512_maskz_loadu_epi8(_cvtu64_mask64(~0ull >> (64 - n)), p);
    return {_mm512_cvtepi8_epi16(_mm512_castsi512_si256(w)), _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(w, 1))};
  }
  static V Dot8(const W8& w, const int16_t* q, const float* d, V acc) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i a = _mm512_dpwssd_epi32(zero, w.low, _mm512_loadu_si512(q));
    const __m512i b = _mm512_dpwssd_epi32(zero, w.high, _mm512_loadu_si512(q + 32));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(d[0]), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(d[1]), acc);
  }
  // int4: 4 groups (64 bytes) at a time
  static constexpr int kGroups4 = 4;
  static __m512i Weights4(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static __m512i Weights4Part(const uint8_t* p, int64_t n) {
    return _mm512_maskz_loadu_epi8(_cvtu64_mask64(~0ull >> (64 - 16 * n)), p);
  }
  static V Dot4(__m512i w, const int8_t* q) {
    const __m512i mask = _mm512_set1_epi8(15);
    const __m512i low = _mm512_and_si512(w, mask), high = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low, _mm512_loadu_si512(q));
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(sum, high, _mm512_loadu_si512(q + 64)));
  }
  static V Scales4(const uint16_t* s, int64_t n) {  // [s0 x4, s1 x4, s2 x4, s3 x4]
    const __m128 f = _mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << n) - 1), s));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_castps128_ps512(f));
  }
  static float HalfDot(const uint16_t* h, const float* f, int64_t n) {
    V acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))),
                            _mm512_loadu_ps(f + i), acc);
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + i)), _mm512_maskz_loadu_ps(m, f + i),
                            acc);
    }
    return Sum(acc);
  }
};
#include "narrow_matmul_kernel.h"
}  // namespace avx512
#pragma GCC pop_options
#endif  // OMNIJAX_X86

// ---- instruction sets --------------------------------------------------------------------------------------------

enum class Level { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

Level BestLevel() {
#ifdef OMNIJAX_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("fma"))
    return Level::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Level::kAvx2;
#endif
  return Level::kScalar;
}

// One instruction set's kernel and the layout its int4 loops read the activations in.
struct Kernel {
  void (*rows)(const Problem&, int64_t, int64_t);
  int groups4;  // int4 groups per chunk
  int width;    // float32 lanes per vector
};

template <class Isa>
Kernel KernelOf(void (*rows)(const Problem&, int64_t, int64_t)) {
  return {rows, Isa::kGroups4, Isa::kWidth};
}

// The kernel for `isa` ("auto": the best this CPU has; "avx512", "avx2", "scalar": that one, or the best this CPU
// has below it); rows null for another name.
Kernel PickKernel(std::string_view isa) {
  static const Level best = BestLevel();
  Level want = best;
  if (isa == "scalar") want = Level::kScalar;
  else if (isa == "avx2") want = Level::kAvx2;
  else if (isa == "avx512") want = Level::kAvx512;
  else if (isa != "auto") return {nullptr, 1, 1};
  const Level level = static_cast<int>(want) < static_cast<int>(best) ? want : best;
#ifdef OMNIJAX_X86
  if (level == Level::kAvx512) return KernelOf<avx512::Isa>(&avx512::OutputRows);
  if (level == Level::kAvx2) return KernelOf<avx2::Isa>(&avx2::OutputRows);
#endif
  return KernelOf<scalar::Isa>(&scalar::OutputRows);
}

#pragma GCC visibility push(default)
// The best instruction set this CPU offers the kernels (0 plain C++, 1 AVX2, 2 AVX-512).
extern "C" int OmnijaxCpuLevel() { return static_cast<int>(BestLevel()); }
#pragma GCC visibility pop

// ---- threads -----------------------------------------------------------------------------------------------------

// Runs body(0) .. body(tasks - 1) on the pool's threads and the calling one, and returns when all have run. A task
// the pool starts late finds nothing left to do (the state it holds outlives this call), so no thread ever waits
// for the pool to have a free thread.
void RunTasks(ffi::ThreadPool& pool, int64_t tasks, const std::function<void(int64_t)>& body) {
  const int64_t threads = pool.num_threads();
  if (tasks <= 1 || threads <= 1) {
    for (int64_t t = 0; t < tasks; ++t) body(t);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    int64_t tasks = 0;
    const std::function<void(int64_t)>* body = nullptr;
    std::mutex mutex;
    std::condition_variable finished;
  };
  auto state = std::make_shared<State>();
  state->tasks = tasks;
  state->body = &body;
  auto work = [state] {
    for (int64_t t; (t = state->next.fetch_add(1)) < state->tasks;) {
      (*state->body)(t);
      if (state->done.fetch_add(1) + 1 == state->tasks) {
        std::lock_guard<std::mutex> lock(state->mutex);
        state->finished.notify_all();
      }
    }
  };
  const int64_t helpers = (threads < tasks ? threads : tasks) - 1;
  for (int64_t h = 0; h < helpers; ++h) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  std::unique_lock<std::mutex> lock(state->mutex);
  state->finished.wait(lock, [&] { return state->done.load() == state->tasks; });
}

// ---- activations ---------------------------------------------------------------------------------------------

// One block of up to 32 values of x quantized to -levels .. levels: q[0 .. n) (the rest left 0) and the block's d.
template <class Q>
inline float QuantizeBlock(const float* x, int64_t n, float levels, Q* q) {
  float peak = 0.0f;
  for (int64_t i = 0; i < n; ++i) peak = std::max(peak, std::fabs(x[i]));
  const float d = peak * (1.0f / levels);  // as XLA computes a division by a constant
  const float inverse = d > 0.0f ? 1.0f / d : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(x[i] * inverse);  // to nearest even (the default rounding mode)
    q[i] = static_cast<Q>(std::min(levels, std::max(-levels, v)));
  }
  return d;
}

// The activations of p quantized and laid out for `kernel` (int8 and int4 weights), in `storage`.
void Prepare(const Problem& p, const Kernel& kernel, Activations& a, std::vector<char>& storage) {
  const int64_t blocks = (p.in + kGroup - 1) / kGroup;
  auto carve = [&](size_t bytes) {  // the offset of `bytes` more in storage, each part 64-byte aligned in size
    const size_t at = storage.size();
    storage.resize(at + ((bytes + 63) / 64) * 64);
    return at;
  };
  if (p.format == Format::kInt8) {
    a.stride8 = ((p.in + 63) / 64) * 64;
    const size_t q = carve(p.rows * a.stride8 * 2), d = carve(p.rows * a.stride8 / kGroup * 4);
    std::fill(storage.begin(), storage.end(), 0);
    int16_t* q8 = reinterpret_cast<int16_t*>(storage.data() + q);
    float* d8 = reinterpret_cast<float*>(storage.data() + d);
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t k = b * kGroup;
        d8[(r * a.stride8 + k) / kGroup] =
            QuantizeBlock(p.x + r * p.in + k, std::min<int64_t>(kGroup, p.in - k), 32767.0f, q8 + r * a.stride8 + k);
      }
    a.q8 = q8, a.d8 = d8;
    return;
  }
  const int64_t per = kernel.groups4, width = kernel.width, half = kGroup / 2;
  a.groups4 = blocks;
  a.chunks4 = (blocks + per - 1) / per;
  const size_t q = carve(p.rows * a.chunks4 * per * kGroup), lanes = carve(p.rows * a.chunks4 * width * 4),
               sums = carve(p.rows * blocks * 4);
  std::fill(storage.begin(), storage.end(), 0);
  int8_t* q4 = reinterpret_cast<int8_t*>(storage.data() + q);
  float* lanes4 = reinterpret_cast<float*>(storage.data() + lanes);
  float* sums4 = reinterpret_cast<float*>(storage.data() + sums);
  int8_t block[kGroup];
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t g = 0; g < blocks; ++g) {
      const float d = QuantizeBlock(p.x + r * p.in + g * kGroup, kGroup, 127.0f, block);
      const int64_t c = g / per, at = g % per;
      int8_t* chunk = q4 + (r * a.chunks4 + c) * per * kGroup;
      std::memcpy(chunk + at * half, block, half);               // the values the low nibbles hold
      std::memcpy(chunk + (per + at) * half, block + half, half);  // the high nibbles'
      int32_t sum = 0;
      for (int i = 0; i < kGroup; ++i) sum += block[i];
      sums4[r * blocks + g] = d * static_cast<float>(sum);
      for (int64_t l = at * (width / per); l < (at + 1) * (width / per); ++l)
        lanes4[(r * a.chunks4 + c) * width + l] = d;
    }
  a.q4 = q4, a.lanes4 = lanes4, a.sums4 = sums4;
}

ffi::Error Run(ffi::ThreadPool& pool, std::string_view isa, Problem p) {
  const Kernel kernel = PickKernel(isa);
  if (!kernel.rows) return ffi::Error::InvalidArgument("narrow matmul: unknown isa '" + std::string(isa) + "'");
  Activations acts;
  std::vector<char> storage;
  if (p.format != Format::kBf16) {
    Prepare(p, kernel, acts, storage);
    p.acts = &acts;
  }
  // Output rows in pieces of at least ~64k weights (thread start-up is a few microseconds), four per thread.
  const int64_t threads = pool.num_threads() > 1 ? pool.num_threads() : 1;
  const int64_t min_rows = (65536 + p.in - 1) / (p.in > 0 ? p.in : 1);
  int64_t tasks = (p.out + min_rows - 1) / min_rows;
  if (tasks > 4 * threads) tasks = 4 * threads;
  if (tasks < 1) tasks = 1;
  const int64_t per_task = (p.out + tasks - 1) / tasks;
  RunTasks(pool, tasks, [&](int64_t t) {
    const int64_t begin = t * per_task;
    const int64_t end = begin + per_task < p.out ? begin + per_task : p.out;
    if (begin < end) kernel.rows(p, begin, end);
  });
  return ffi::Error::Success();
}

// ---- checks ------------------------------------------------------------------------------------------------------

std::string Shape(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

bool Is(ffi::AnyBuffer::Dimensions dims, int64_t a, int64_t b) {
  return dims.size() == 2 && dims[0] == a && dims[1] == b;
}

// The problem's sizes from x [rows, in] and y [rows, out], or an error naming what does not fit.
ffi::Error Sizes(const ffi::AnyBuffer::Dimensions& x, const ffi::AnyBuffer::Dimensions& y, Problem& p) {
  if (x.size() != 2 || y.size() != 2 || x[0] != y[0])
    return ffi::Error::InvalidArgument("narrow matmul: x " + Shape(x) + " and y " + Shape(y) +
                                       " must be [rows, in] and [rows, out]");
  p.rows = x[0];
  p.in = x[1];
  p.out = y[1];
  return ffi::Error::Success();
}

ffi::Error Mismatch(const char* what, ffi::AnyBuffer::Dimensions dims, const Problem& p) {
  return ffi::Error::InvalidArgument(std::string("narrow matmul: ") + what + " " + Shape(dims) +
                                     " does not fit x [" + std::to_string(p.rows) + ", " + std::to_string(p.in) +
                                     "] and y [" + std::to_string(p.rows) + ", " + std::to_string(p.out) + "]");
}

// ---- handlers ----------------------------------------------------------------------------------------------------

ffi::Error Int8Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> values,
                    ffi::Buffer<ffi::F32> scales, ffi::ResultBuffer<ffi::F32> y, std::string_view isa) {
  Problem p{Format::kInt8, x.typed_data(), values.untyped_data(), scales.untyped_data(), nullptr, y->typed_data()};
  if (ffi::Error e = Sizes(x.dimensions(), y->dimensions(), p); e.failure()) return e;
  if (!Is(values.dimensions(), p.out, p.in)) return Mismatch("int8 values", values.dimensions(), p);
  if (!Is(scales.dimensions(), p.out, 1)) return Mismatch("int8 scales", scales.dimensions(), p);
  return Run(pool, isa, p);
}

ffi::Error Int4Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> values,
                    ffi::Buffer<ffi::F16> scales, ffi::Buffer<ffi::F16> offsets, ffi::ResultBuffer<ffi::F32> y,
                    std::string_view isa) {
  Problem p{Format::kInt4,          x.typed_data(),          values.untyped_data(), scales.untyped_data(),
            offsets.untyped_data(), y->typed_data()};
  if (ffi::Error e = Sizes(x.dimensions(), y->dimensions(), p); e.failure()) return e;
  if (p.in % kGroup) return Mismatch("int4 (groups of 32) x", x.dimensions(), p);
  if (!Is(values.dimensions(), p.out, p.in / 2)) return Mismatch("int4 values", values.dimensions(), p);
  if (!Is(scales.dimensions(), p.out, p.in / kGroup)) return Mismatch("int4 scales", scales.dimensions(), p);
  if (!Is(offsets.dimensions(), p.out, p.in / kGroup)) return Mismatch("int4 offsets", offsets.dimensions(), p);
  return Run(pool, isa, p);
}

ffi::Error Bf16Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> values,
                    ffi::ResultBuffer<ffi::F32> y, std::string_view isa) {
  Problem p{Format::kBf16, x.typed_data(), values.untyped_data(), nullptr, nullptr, y->typed_data()};
  if (ffi::Error e = Sizes(x.dimensions(), y->dimensions(), p); e.failure()) return e;
  if (!Is(values.dimensions(), p.out, p.in)) return Mismatch("bfloat16 weight", values.dimensions(), p);
  return Run(pool, isa, p);
}

}  // namespace omnijax_kernels

// The library is built with hidden symbols; these are the ones common/kernels/native_library.py looks up.
#pragma GCC visibility push(default)
XLA_FFI_DEFINE_HANDLER_SYMBOL(OmnijaxMatmulInt8, omnijax_kernels::Int8Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<std::string_view>("isa"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(OmnijaxMatmulInt4, omnijax_kernels::Int4Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F16>>()
                                  .Arg<ffi::Buffer<ffi::F16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<std::string_view>("isa"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(OmnijaxMatmulBf16, omnijax_kernels::Bf16Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<std::string_view>("isa"));
#pragma GCC visibility pop
