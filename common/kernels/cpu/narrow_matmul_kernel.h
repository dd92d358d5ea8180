// The products y[r, o] = sum_k x[r, k] * w[o, k] of float32 activations with a weight stored narrow, for one
// instruction set. narrow_matmul.cc includes this file once per instruction set, inside a namespace that defines
// `Isa` (the vector type and its operations) and under that instruction set's target pragma, so every function
// here is compiled for it; the caller picks the namespace at run time.
//
// A weight row is read once as its stored bytes and widened in registers; the rows of x reuse each widened vector
// (up to kRowBlock of them at a time). Sums are float32 in a fixed order: the result does not depend on how the
// output rows are split across threads.

using V = typename Isa::V;
constexpr int kWidth = Isa::kWidth;
// Weight rows are fetched two blocks of rows ahead of the one being multiplied: the hardware prefetchers alone
// leave a matrix-vector product of a weight in main memory several times below the memory's bandwidth.
constexpr int kAhead = 2;
inline void Prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// int8 per output channel and bfloat16: one widened vector of a weight row at a time; an int8 row's scale
// multiplies its sums.
template <class Format, int kOut, int kRows>
inline void ChannelBlock(const Problem& p, int64_t o, int64_t r) {
  using T = typename Format::T;
  const T* w = static_cast<const T*>(p.values) + o * p.in;
  const float* x = p.x + r * p.in;
  V acc[kOut][kRows];
  for (int i = 0; i < kOut; ++i)
    for (int j = 0; j < kRows; ++j) acc[i][j] = Isa::Zero();
  int64_t k = 0;
  for (; k + kWidth <= p.in; k += kWidth) {
    for (int i = 0; i < kOut; ++i) {
      Prefetch(w + (i + kAhead * kOut) * p.in + k);
      const V wv = Format::Widen(w + i * p.in + k);
      for (int j = 0; j < kRows; ++j) acc[i][j] = Isa::Fma(Isa::Load(x + j * p.in + k), wv, acc[i][j]);
    }
  }
  for (int i = 0; i < kOut; ++i) {
    for (int j = 0; j < kRows; ++j) {
      float s = Isa::Sum(acc[i][j]);
      for (int64_t t = k; t < p.in; ++t) s += x[j * p.in + t] * Format::One(w[i * p.in + t]);
      p.y[(r + j) * p.out + o + i] = Format::Scaled(p, o + i, s);
    }
  }
}

// int4 in groups of 32: per group 16 bytes (value j in the low nibble of byte j, value j + 16 in its high nibble)
// and a float16 scale and offset, widened to float32 a chunk of groups at a time; the weights w = q * scale + offset
// are formed in registers (exact in float32: q has 4 bits, the scale 11; Isa::Int4Weights), then multiplied with x
// like any widened weight.
constexpr int64_t kChunk = 64;  // groups whose scales and offsets are widened together

template <int kOut, int kRows>
inline void Int4Block(const Problem& p, int64_t o, int64_t r) {
  constexpr int kParts = kGroup / kWidth;
  const int64_t groups = p.in / kGroup;
  const uint8_t* w = static_cast<const uint8_t*>(p.values) + o * (p.in / 2);
  const uint16_t* scales = static_cast<const uint16_t*>(p.scales) + o * groups;
  const uint16_t* offsets = static_cast<const uint16_t*>(p.offsets) + o * groups;
  const float* x = p.x + r * p.in;
  V acc[kOut][kRows];
  for (int i = 0; i < kOut; ++i)
    for (int j = 0; j < kRows; ++j) acc[i][j] = Isa::Zero();
  float scale[kOut][kChunk], offset[kOut][kChunk];
  for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
    const int64_t n = groups - g0 < kChunk ? groups - g0 : kChunk;
    for (int i = 0; i < kOut; ++i) {
      Isa::Halves(scales + i * groups + g0, n, scale[i]);
      Isa::Halves(offsets + i * groups + g0, n, offset[i]);
    }
    for (int64_t c = 0; c < n; ++c) {
      const int64_t g = g0 + c;
      for (int i = 0; i < kOut; ++i) {
        Prefetch(w + (i + kAhead * kOut) * (p.in / 2) + g * (kGroup / 2));
        V wv[kParts];
        Isa::Int4Weights(w + i * (p.in / 2) + g * (kGroup / 2), scale[i][c], offset[i][c], wv);
        for (int t = 0; t < kParts; ++t)
          for (int j = 0; j < kRows; ++j)
            acc[i][j] = Isa::Fma(Isa::Load(x + j * p.in + g * kGroup + t * kWidth), wv[t], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < kOut; ++i)
    for (int j = 0; j < kRows; ++j) p.y[(r + j) * p.out + o + i] = Isa::Sum(acc[i][j]);
}

struct Int8Format {
  using T = int8_t;
  static V Widen(const T* w) { return Isa::Int8s(w); }
  static float One(T w) { return static_cast<float>(w); }
  static float Scaled(const Problem& p, int64_t o, float s) { return s * static_cast<const float*>(p.scales)[o]; }
};

struct Bf16Format {
  using T = uint16_t;
  static V Widen(const T* w) { return Isa::Bf16s(w); }
  static float One(T w) { return Bf16ToFloat(w); }
  static float Scaled(const Problem&, int64_t, float s) { return s; }
};

// One block of kOut output rows against kRows rows of x.
template <int kOut, int kRows>
inline void Block(const Problem& p, int64_t o, int64_t r) {
  switch (p.format) {
    case Format::kInt8: return ChannelBlock<Int8Format, kOut, kRows>(p, o, r);
    case Format::kBf16: return ChannelBlock<Bf16Format, kOut, kRows>(p, o, r);
    case Format::kInt4: return Int4Block<kOut, kRows>(p, o, r);
  }
}

// The rows left over after the blocks of kRowBlock (fewer than kRowBlock), as one block of their number.
template <int kOut, int kRows>
inline void RowsLeft(const Problem& p, int64_t o, int64_t r, int64_t left) {
  if constexpr (kRows > 0) {
    if (left == kRows) return Block<kOut, kRows>(p, o, r);
    RowsLeft<kOut, kRows - 1>(p, o, r, left);
  }
}

template <int kOut>
inline void AllRows(const Problem& p, int64_t o) {
  int64_t r = 0;
  for (; r + Isa::kRowBlock <= p.rows; r += Isa::kRowBlock) Block<kOut, Isa::kRowBlock>(p, o, r);
  RowsLeft<kOut, Isa::kRowBlock - 1>(p, o, r, p.rows - r);
}

// y[:, o_begin:o_end] of the product.
void OutputRows(const Problem& p, int64_t o_begin, int64_t o_end) {
  int64_t o = o_begin;
  if (p.rows == 1) {  // one row of x: one weight row at a time, a single stream through memory (measured faster
    for (; o < o_end; ++o) Block<1, 1>(p, o, 0);  // from main memory than several rows interleaved)
    return;
  }
  for (; o + Isa::kOutBlock <= o_end; o += Isa::kOutBlock) AllRows<Isa::kOutBlock>(p, o);
  for (; o < o_end; ++o) AllRows<1>(p, o);
}
