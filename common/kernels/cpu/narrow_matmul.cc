// XLA FFI handlers for products of float32 activations x [rows, in] with a weight stored narrow as [out, in]
// (torch's layout; the product contracts the last axes): int8 per output channel, int4 in groups of 32, bfloat16.
// common/kernels/narrow_matmul.py calls them through jax.ffi and holds the pure-JAX reference they are tested
// against.
//
// One build runs on every x86-64 CPU: the kernel (narrow_matmul_kernel.h) is compiled three times, for AVX-512,
// for AVX2 + FMA and as plain C++, and each call takes the best one the CPU has (or the one its `isa` attribute
// names, if the CPU has that one: the tests force AVX2 on an AVX-512 machine). Other CPUs get the plain C++ one.
// The weight's output rows are split across XLA's intra-op thread pool; the calling thread works too.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#define OMNIJAX_X86 1
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace omnijax_kernels {

constexpr int kGroup = 32;  // int4 values per group (one scale and offset)

enum class Format { kInt8, kInt4, kBf16 };

// One product: x [rows, in] float32, the weight's parts, y [rows, out] float32.
struct Problem {
  Format format;
  const float* x;
  const void* values;   // int8 [out, in] | uint8 [out, in / 2] | bfloat16 bits [out, in]
  const void* scales;   // float32 [out] | float16 bits [out, in / 32] | unused
  const void* offsets;  // float16 bits [out, in / 32] for int4
  float* y;
  int64_t rows, in, out;
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
  static void Int4Weights(const uint8_t* p, float scale, float offset, V* w) {
    for (int j = 0; j < kGroup / 2; ++j) {
      w[j] = static_cast<float>(p[j] & 15) * scale + offset;
      w[j + kGroup / 2] = static_cast<float>(p[j] >> 4) * scale + offset;
    }
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
  static void Int4Weights(const uint8_t* p, float scale, float offset, V* w) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i mask = _mm256_set1_epi32(15);
    const __m256i a = _mm256_cvtepu8_epi32(bytes);
    const __m256i b = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
    const V s = _mm256_set1_ps(scale), o = _mm256_set1_ps(offset);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), s, o);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, mask)), s, o);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), s, o);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), s, o);
  }
};
#include "narrow_matmul_kernel.h"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
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
  // The group's 16 possible weights q * scale + offset (q = 0..15) fill one register; each nibble picks its own
  // (vpermps reads the low 4 bits of each index, so the low nibbles need no mask).
  static void Int4Weights(const uint8_t* p, float scale, float offset, V* w) {
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 table = _mm512_fmadd_ps(levels, _mm512_set1_ps(scale), _mm512_set1_ps(offset));
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    w[0] = _mm512_permutexvar_ps(bytes, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
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
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma"))
    return Level::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return Level::kAvx2;
#endif
  return Level::kScalar;
}

using Kernel = void (*)(const Problem&, int64_t, int64_t);

// The kernel for `isa` ("auto": the best this CPU has; "avx512", "avx2", "scalar": that one, or the best this CPU
// has below it); null for another name.
Kernel PickKernel(std::string_view isa) {
  static const Level best = BestLevel();
  Level want = best;
  if (isa == "scalar") want = Level::kScalar;
  else if (isa == "avx2") want = Level::kAvx2;
  else if (isa == "avx512") want = Level::kAvx512;
  else if (isa != "auto") return nullptr;
  const Level level = static_cast<int>(want) < static_cast<int>(best) ? want : best;
#ifdef OMNIJAX_X86
  if (level == Level::kAvx512) return &avx512::OutputRows;
  if (level == Level::kAvx2) return &avx2::OutputRows;
#endif
  return &scalar::OutputRows;
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

ffi::Error Run(ffi::ThreadPool& pool, std::string_view isa, const Problem& p) {
  const Kernel kernel = PickKernel(isa);
  if (!kernel) return ffi::Error::InvalidArgument("narrow matmul: unknown isa '" + std::string(isa) + "'");
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
    if (begin < end) kernel(p, begin, end);
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
