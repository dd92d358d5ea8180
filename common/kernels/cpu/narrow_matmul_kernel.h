// The products y[r, o] = sum_k x[r, k] * w[o, k] of float32 activations with a weight stored narrow, for one
// instruction set. narrow_matmul.cc includes this file once per instruction set, inside a namespace that defines
// `Isa` (the vector type and its operations) and under that instruction set's target pragma, so every function
// here is compiled for it; the caller picks the namespace at run time.
//
// A weight row is read once as its stored bytes and widened in registers; the rows of x reuse each widened vector
// (up to kRowBlock of them at a time). Sums are in a fixed order: the result does not depend on how the output rows
// are split across threads.

using V = typename Isa::V;
constexpr int kWidth = Isa::kWidth;
// Weight rows are fetched two blocks of rows ahead of the one being multiplied: the hardware prefetchers alone
// leave a matrix-vector product of a weight in main memory several times below the memory's bandwidth.
constexpr int kAhead = 2;
inline void Prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// bfloat16: one widened vector of a weight row at a time, float32 activations.
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

// int8 and int4 weights meet the activations quantized per block of 32 (Activations, prepared once per call; int16
// values for int8 weights, int8 values for int4 weights): the inner loops are integer dot products (Isa::Dot8 with
// vpdpwssd / vpmaddwd, Isa::Dot4 with vpdpbusd / vpmaddubsw + vpmaddwd), exact in int32, each block's integer sum
// converted to float32 and multiplied by its block's scale.

// int8 per output channel: y[r, o] = scale[o] * sum over blocks of d(block) * (the block's integer dot product).
template <int kOut, int kRows>
inline void Int8Block(const Problem& p, int64_t o, int64_t r) {
  const Activations& a = *p.acts;
  const int8_t* w = static_cast<const int8_t*>(p.values) + o * p.in;
  V acc[kOut][kRows];
  for (int i = 0; i < kOut; ++i)
    for (int j = 0; j < kRows; ++j) acc[i][j] = Isa::Zero();
  int64_t k = 0;
  for (; k + Isa::kStep8 <= p.in; k += Isa::kStep8) {
    for (int i = 0; i < kOut; ++i) {
      Prefetch(w + (i + kAhead * kOut) * p.in + k);
      const auto wv = Isa::Weights8(w + i * p.in + k);
      for (int j = 0; j < kRows; ++j) {
        const int64_t row = (r + j) * a.stride8;
        acc[i][j] = Isa::Dot8(wv, a.q8 + row + k, a.d8 + (row + k) / kGroup, acc[i][j]);
      }
    }
  }
  if (k < p.in) {  // the last part of a row: its weights read as far as the row goes, the activations past it are 0
    for (int i = 0; i < kOut; ++i) {
      const auto wv = Isa::Weights8Part(w + i * p.in + k, p.in - k);
      for (int j = 0; j < kRows; ++j) {
        const int64_t row = (r + j) * a.stride8;
        acc[i][j] = Isa::Dot8(wv, a.q8 + row + k, a.d8 + (row + k) / kGroup, acc[i][j]);
      }
    }
  }
  const float* scales = static_cast<const float*>(p.scales);
  for (int i = 0; i < kOut; ++i)
    for (int j = 0; j < kRows; ++j) p.y[(r + j) * p.out + o + i] = Isa::Sum(acc[i][j]) * scales[o + i];
}

// int4 in groups of 32 (per group 16 bytes: value j in the low nibble of byte j, value j + 16 in its high nibble;
// a float16 scale and offset): w = q * scale + offset, so per group
//   sum_k w_k * x_k = scale * d * sum_k q_k * xq_k + offset * d * sum_k xq_k,
// the first an integer dot product of Isa::kGroups4 groups at a time (kLanes4 lanes of 4 bytes per group), the second
// a float32 dot product of the offsets with the activations' d * sum(xq) per group (Activations::sums4).
template <int kOut, int kRows>
inline void Int4Block(const Problem& p, int64_t o, int64_t r) {
  constexpr int kGroups = Isa::kGroups4;
  const Activations& a = *p.acts;
  const int64_t groups = p.in / kGroup;
  const int64_t row_bytes = p.in / 2;
  const uint8_t* w = static_cast<const uint8_t*>(p.values) + o * row_bytes;
  const uint16_t* scales = static_cast<const uint16_t*>(p.scales) + o * groups;
  const uint16_t* offsets = static_cast<const uint16_t*>(p.offsets) + o * groups;
  V acc[kOut][kRows];
  for (int i = 0; i < kOut; ++i)
    for (int j = 0; j < kRows; ++j) acc[i][j] = Isa::Zero();
  int64_t g = 0, c = 0;  // group, chunk of kGroups groups
  for (; g < groups; g += kGroups, ++c) {
    const int64_t n = groups - g < kGroups ? groups - g : kGroups;
    for (int i = 0; i < kOut; ++i) {
      const uint8_t* wi = w + i * row_bytes + g * (kGroup / 2);
      Prefetch(wi + kAhead * kOut * row_bytes);
      const auto wv = n == kGroups ? Isa::Weights4(wi) : Isa::Weights4Part(wi, n);
      const V s = Isa::Scales4(scales + i * groups + g, n);
      for (int j = 0; j < kRows; ++j) {
        const int64_t chunk = (r + j) * a.chunks4 + c;
        acc[i][j] = Isa::Fma(Isa::Dot4(wv, a.q4 + chunk * kGroups * kGroup),
                             Isa::Mul(s, Isa::Load(a.lanes4 + chunk * kWidth)), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < kOut; ++i)
    for (int j = 0; j < kRows; ++j)
      p.y[(r + j) * p.out + o + i] =
          Isa::Sum(acc[i][j]) + Isa::HalfDot(offsets + i * groups, a.sums4 + (r + j) * a.groups4, groups);
}

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
    case Format::kInt8: return Int8Block<kOut, kRows>(p, o, r);
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
