// Scalar reference kernels: the definition every SIMD path is tested against. Plain loops in
// element order, no tricks; the rms_norm and silu follow llama2.c's run.c expression for expression.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"
#include "kernels/kernels.h"

namespace gale::kernels {
namespace {

float DotF32(const void* w, const float* x, int64_t n) {
  const float* a = static_cast<const float*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * x[i];
  return sum;
}

float DotF16(const void* w, const float* x, int64_t n) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += Fp16ToFp32(a[i]) * x[i];
  return sum;
}

float DotBF16(const void* w, const float* x, int64_t n) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += Bf16ToFp32(a[i]) * x[i];
  return sum;
}

float DotQ8_0(const void* w, const float* x, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    float block = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) block += static_cast<float>(b[i].qs[j]) * x[i * kQK8_0 + j];
    sum += Fp16ToFp32(b[i].d) * block;
  }
  return sum;
}

float DotQ4_0(const void* w, const float* x, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    float block = 0.0f;
    const float* xb = x + i * kQK4_0;
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      block += static_cast<float>((b[i].qs[j] & 0x0f) - 8) * xb[j];
      block += static_cast<float>((b[i].qs[j] >> 4) - 8) * xb[j + kQK4_0 / 2];
    }
    sum += Fp16ToFp32(b[i].d) * block;
  }
  return sum;
}

template <GgmlType kType>
void Dequantize(const void* src, float* dst, int64_t n) {
  DequantizeRowRef(kType, src, dst, n);
}

// Reference products: each output is the reference dot of its row and token.
template <VecDotFn kDot>
void GemmFloatRef(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const float* x, int64_t k,
                  int64_t num_tokens, float* y, int64_t ldy) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t r = 0; r < num_rows; ++r) y[t * ldy + r] = kDot(w + r * row_bytes, x + t * k, k);
  }
}

// Signed int8 weights of block b of a row, for either quantized type, plus the block scale.
// The 32 signed weights of a Q4_0-ordered run of 16 nibble pairs (element j < 16 in the low nibble
// of byte j, j + 16 in its high nibble), stored + 8.
void UnpackNibbleRun(const uint8_t* qs, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<int8_t>((qs[j] & 0x0f) - 8);
    out[j + 16] = static_cast<int8_t>((qs[j] >> 4) - 8);
  }
}

template <GgmlType kType>
constexpr bool kZeroPoint = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;

// m: the zero-point types' (Q4_1, Q5_1: x = d q + m) offset; their q come out unsigned, 0..31.
template <GgmlType kType>
float UnpackBlock(const uint8_t* row, int64_t b, int8_t* out, float* m) {
  if constexpr (kType == GgmlType::kQ4_1) {
    const BlockQ4_1* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<int8_t>(blk->qs[j] & 0x0f);
      out[j + 16] = static_cast<int8_t>(blk->qs[j] >> 4);
    }
    *m = Fp16ToFp32(blk->m);
    return Fp16ToFp32(blk->d);
  } else if constexpr (kType == GgmlType::kQ5_1) {
    const BlockQ5_1* blk = reinterpret_cast<const BlockQ5_1*>(row) + b;
    UnpackQ5(blk->qh, blk->qs, reinterpret_cast<uint8_t*>(out));
    *m = Fp16ToFp32(blk->m);
    return Fp16ToFp32(blk->d);
  } else if constexpr (kType == GgmlType::kW4A8G64 || kType == GgmlType::kW4A8G128) {
    // Run b % (G / 32) of group b / (G / 32): a Q4_0 block's nibbles with the group's scale.
    constexpr int G = kType == GgmlType::kW4A8G64 ? 64 : 128;
    const BlockW4<G, false>* blk = reinterpret_cast<const BlockW4<G, false>*>(row) + b / (G / 32);
    UnpackNibbleRun(blk->qs + (b % (G / 32)) * 16, out);
    return Fp16ToFp32(blk->d);
  } else if constexpr (kType == GgmlType::kQ5_0) {
    const BlockQ5_0* blk = reinterpret_cast<const BlockQ5_0*>(row) + b;
    uint8_t q[32];
    UnpackQ5(blk->qh, blk->qs, q);
    for (int j = 0; j < 32; ++j) out[j] = static_cast<int8_t>(q[j] - 16);
    return Fp16ToFp32(blk->d);
  } else if constexpr (kType == GgmlType::kQ8_0) {
    const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    for (int j = 0; j < kQK8_0; ++j) out[j] = blk->qs[j];
    return Fp16ToFp32(blk->d);
  } else if constexpr (kType == GgmlType::kIQ4_NL || kType == GgmlType::kIQ4_XS) {
    // The table's values; IQ4_XS: run b % 8 of super-block b / 8 under its float scale.
    const uint8_t* qs;
    float d;
    if constexpr (kType == GgmlType::kIQ4_NL) {
      const BlockIQ4_NL* blk = reinterpret_cast<const BlockIQ4_NL*>(row) + b;
      qs = blk->qs;
      d = Fp16ToFp32(blk->d);
    } else {
      const BlockIQ4_XS* blk = reinterpret_cast<const BlockIQ4_XS*>(row) + b / 8;
      qs = blk->qs + 16 * (b % 8);
      d = IQ4XSRunScale(*blk, static_cast<int>(b % 8));
    }
    IQ4RunValues(qs, out);
    return d;
  } else if constexpr (kType == GgmlType::kMXFP4) {
    const BlockMXFP4* blk = reinterpret_cast<const BlockMXFP4*>(row) + b;
    MXFP4RunValues(blk->qs, out);
    return E8M0HalfToFp32(blk->e);
  } else {
    const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
    UnpackNibbleRun(blk->qs, out);
    return Fp16ToFp32(blk->d);
  }
}

// Per block: exact integer dot, then sum += (d_w * d_x) * isum, blocks in order. The zero-point
// types (as llama.cpp multiplies them, with q8_1 activations) then also add (m_w * d_x) * qsum, the
// block's sum of activations.
template <GgmlType kType>
void GemmQuantRef(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x,
                  int64_t num_tokens, float* y, int64_t ldy) {
  const int64_t nb = x.k / 32;
  const int64_t nb_stride = x.k_stride / 32;
  int8_t wq[32];
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t r = 0; r < num_rows; ++r) {
      float sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        float mw = 0.0f;
        const float dw = UnpackBlock<kType>(w + r * row_bytes, b, wq, &mw);
        const int8_t* q = x.qs + t * x.k_stride + b * 32;
        int32_t isum = 0;
        for (int j = 0; j < 32; ++j) isum += wq[j] * q[j];
        sum += (dw * x.d[t * nb_stride + b]) * static_cast<float>(isum);
        if constexpr (kZeroPoint<kType>) sum += (mw * x.d[t * nb_stride + b]) * static_cast<float>(x.qsum[t * nb_stride + b]);
      }
      y[t * ldy + r] = sum;
    }
  }
}

}  // namespace

void GemmQuantW4A8G64Reference(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x,
                               int64_t num_tokens, float* y, int64_t ldy) {
  GemmQuantRef<GgmlType::kW4A8G64>(w, row_bytes, num_rows, x, num_tokens, y, ldy);
}
void GemmQuantW4A8G128Reference(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x,
                                int64_t num_tokens, float* y, int64_t ldy) {
  GemmQuantRef<GgmlType::kW4A8G128>(w, row_bytes, num_rows, x, num_tokens, y, ldy);
}
void DequantQ4_1Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ4_1, src, dst, n); }
void DequantQ5_0Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ5_0, src, dst, n); }
void DequantQ5_1Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ5_1, src, dst, n); }
void DequantQ3_KReference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ3_K, src, dst, n); }
void DequantQ2_KReference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ2_K, src, dst, n); }
void DequantIQ4_NLReference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kIQ4_NL, src, dst, n); }
void DequantIQ4_XSReference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kIQ4_XS, src, dst, n); }
void DequantMXFP4Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kMXFP4, src, dst, n); }
void DequantF8E4M3Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kF8E4M3, src, dst, n); }
void DequantW4A16G64Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kW4A16G64, src, dst, n); }
void DequantW4A16G128Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kW4A16G128, src, dst, n); }
void DequantW4A16ZG64Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kW4A16ZG64, src, dst, n); }
void DequantW4A16ZG128Reference(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kW4A16ZG128, src, dst, n); }

namespace {

void RmsNormRef(const float* x, const float* w, int64_t n, float eps, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

void SiluMulRef(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = gate[i];
    v *= 1.0f / (1.0f + std::exp(-v));
    gate[i] = v * up[i];
  }
}

int64_t ArgMaxRef(const float* x, int64_t n) {
  int64_t best = 0;
  float best_value = x[0];
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > best_value) {
      best_value = x[i];
      best = i;
    }
  }
  return best;
}

void ExpShiftedRef(const float* x, float m, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i] - m);
}

void DeltaRuleRef(float* m, int64_t s, const DeltaRuleTokens& t) {
  for (int64_t j = 0; j < s; ++j) {
    float* mj = m + j * s;
    for (int64_t i = 0; i < t.n; ++i) {
      const float *k = t.k + i * t.stride, *q = t.q + i * t.stride;
      float sk = 0.0f;
      for (int64_t e = 0; e < s; ++e) {
        mj[e] *= t.decay[i];
        sk += mj[e] * k[e];
      }
      const float d = (t.v[i * t.stride + j] - sk) * t.beta[i];
      float sq = 0.0f;
      for (int64_t e = 0; e < s; ++e) {
        mj[e] += d * k[e];
        sq += mj[e] * q[e];
      }
      t.out[i * t.out_stride + j] = sq * t.scale;
    }
  }
}

void AxpyRef(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Offset of position p's row in a paged view.
int64_t Slot(const KvBlockView& kv, int64_t p) {
  return kv.block_table[p / kv.block_size] * kv.block_size + p % kv.block_size;
}

// One K or V row segment as f32: f32 rows are read in place, the others converted into buf.
const float* RowAsF32(const uint8_t* row, KvType type, int head_dim, float* buf) {
  if (type == KvType::kF32) return reinterpret_cast<const float*>(row);
  LoadKvHead(row, head_dim, type, buf);
  return buf;
}

}  // namespace

// max, exp, sum, then divide (not multiply by the reciprocal) as run.c does: it rounds differently.
void RopeApplyReference(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin) {
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + h * head_dim;
    for (int i = 0; i < rope_dims; i += 2) {
      const float c = cos_sin[i], s = cos_sin[i + 1];
      const float v0 = v[i];
      const float v1 = v[i + 1];
      v[i] = v0 * c - v1 * s;
      v[i + 1] = v0 * s + v1 * c;
    }
  }
}

void GeluMulReference(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    const float z = x * (kGeluC1 + kGeluC2 * (x * x));
    gate[i] = x * (1.0f / (1.0f + std::exp(-z))) * up[i];
  }
}

void RopeApplyNeoxReference(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin) {
  const int half = rope_dims / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + h * head_dim;
    for (int i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float v0 = v[i];
      const float v1 = v[i + half];
      v[i] = v0 * c - v1 * s;
      v[i + half] = v0 * s + v1 * c;
    }
  }
}

void SoftmaxReference(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

namespace {

// Exact softmax, scores materialized, as llama2.c's run.c does (bitwise the same for f32 K/V).
void AttendRef(const float* q, const KvBlockView& kv, int64_t len, int head_dim, int v_head_dim, float* out,
               float* raw_scores, float sink, float softcap) {
  thread_local std::vector<float> scores;  // [len]
  thread_local std::vector<float> row;     // [max(head_dim, v_head_dim)] converted K or V row
  scores.resize(len);
  row.resize(std::max(head_dim, v_head_dim));
  // Divide (not multiply by the reciprocal) as run.c does: it rounds differently.
  const float div = std::sqrt(static_cast<float>(head_dim));
  for (int64_t p = 0; p < len; ++p) {
    scores[p] = DotF32(RowAsF32(kv.k + Slot(kv, p) * kv.k_row_bytes, kv.k_type, head_dim, row.data()), q, head_dim) / div;
  }
  if (softcap > 0.0f) {
    for (int64_t p = 0; p < len; ++p) scores[p] = SoftCap(scores[p], softcap);
  }
  if (raw_scores != nullptr) std::copy(scores.begin(), scores.begin() + len, raw_scores);
  if (sink == -INFINITY) {
    SoftmaxReference(scores.data(), len);
  } else {  // the sink joins the max and the denominator
    float max = sink;
    for (int64_t p = 0; p < len; ++p) max = std::max(max, scores[p]);
    double sum = std::exp(sink - max);
    for (int64_t p = 0; p < len; ++p) {
      scores[p] = std::exp(scores[p] - max);
      sum += scores[p];
    }
    for (int64_t p = 0; p < len; ++p) scores[p] = static_cast<float>(scores[p] / sum);
  }
  for (int d = 0; d < v_head_dim; ++d) out[d] = 0.0f;
  for (int64_t p = 0; p < len; ++p) {
    AxpyRef(scores[p], RowAsF32(kv.v + Slot(kv, p) * kv.v_row_bytes, kv.v_type, v_head_dim, row.data()), out,
            v_head_dim);
  }
}

}  // namespace

void AttendManyReference(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                         int head_dim, float* const* outs, float* const* scores, const float* sinks,
                         float softcap) {
  AttendManyReferenceKv(qs, lens, num_queries, kv, head_dim, head_dim, outs, scores, sinks, softcap);
}

void AttendManyReferenceKv(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                           int head_dim, int v_head_dim, float* const* outs, float* const* scores, const float* sinks,
                           float softcap) {
  for (int i = 0; i < num_queries; ++i) {
    AttendRef(qs[i], kv.ForQuery(i), lens[i], head_dim, v_head_dim, outs[i], scores ? scores[i] : nullptr,
              sinks != nullptr ? sinks[i] : -INFINITY, softcap);
  }
}



void ToF16Reference(const float* x, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp32ToFp16(x[i]);
}

void ToBf16Reference(const float* x, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp32ToBf16(x[i]);
}

namespace {
// Quantizes one token's activations per block of 32 to integers in [-qmax, qmax] (scale = the
// block's largest |x| / qmax, rounded half to even), calling store(i, q) for element i (and with
// q = 0 for the padding up to k_stride), and writes each block's scale and sum of q.
template <typename Store>
void QuantizeBlocks(const float* x, int64_t k, int64_t k_stride, int qmax, float* d, int32_t* qsum, Store store) {
  for (int64_t i = k; i < k_stride; ++i) store(i, 0);
  for (int64_t b = k / 32; b < k_stride / 32; ++b) {
    d[b] = 0.0f;
    qsum[b] = 0;
  }
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float a = std::fabs(xb[j]);
      amax = a > amax ? a : amax;  // not std::fmax: that is a libm call here, and x is never NaN
    }
    const float scale = amax / static_cast<float>(qmax);
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      // Round half to even, like the SIMD conversions: adding 1.5 * 2^23 leaves the integer part
      // in the mantissa under the default rounding mode (|v| <= qmax here, plus rounding).
      // A NaN (a NaN or infinite activation) gives INT_MIN, as the SIMD conversions' "integer
      // indefinite" does, and so -qmax: a defined result where a plain cast would be undefined.
      const float v = xb[j] * inv;
      const float r = (v + 12582912.0f) - 12582912.0f;
      int q = r >= -2147483648.0f && r < 2147483648.0f ? static_cast<int>(r) : std::numeric_limits<int>::min();
      q = q < -qmax ? -qmax : q > qmax ? qmax : q;
      store(b * 32 + j, q);
      sum += q;
    }
    d[b] = scale;
    qsum[b] = sum;
  }
}
}  // namespace

const uint64_t* ExpfTable32() {
  struct Table {
    alignas(64) uint64_t v[32];
    Table() {
      for (int i = 0; i < 32; ++i) {
        const double d = static_cast<double>(exp2l(static_cast<long double>(i) / 32));  // 2^(i/32), rounded once
        std::memcpy(&v[i], &d, 8);
        v[i] -= static_cast<uint64_t>(i) << 47;
      }
    }
  };
  static const Table table;
  return table.v;
}

void QuantizeActivations(const float* x, int64_t k, int64_t k_stride, int8_t* qs, float* d, int32_t* qsum) {
  QuantizeBlocks(x, k, k_stride, 127, d, qsum, [qs](int64_t i, int q) { qs[i] = static_cast<int8_t>(q); });
}

void QuantizeActivations16(const float* x, int64_t k, int64_t k_stride, int8_t* hi, uint8_t* lo, float* d,
                           int32_t* qsum) {
  QuantizeBlocks(x, k, k_stride, 32767, d, qsum, [hi, lo](int64_t i, int q) {
    hi[i] = static_cast<int8_t>(q >> 8);  // arithmetic shift: q = 256 * hi + lo
    lo[i] = static_cast<uint8_t>(q & 0xff);
  });
}

const KernelTable& ScalarTable() {
  static const KernelTable table = {
      Isa::kScalar,
      {DotF32, DotF16, DotBF16, DotQ8_0, DotQ4_0},
      {Dequantize<GgmlType::kF32>, Dequantize<GgmlType::kF16>, Dequantize<GgmlType::kBF16>,
       Dequantize<GgmlType::kQ8_0>, Dequantize<GgmlType::kQ4_0>, Dequantize<GgmlType::kQ4_K>,
       Dequantize<GgmlType::kQ5_K>, Dequantize<GgmlType::kQ6_K>, GALE_W4_DEQUANT_REFERENCE,
       GALE_LATER_DEQUANT_REFERENCE},
      {GemmFloatRef<DotF32>, GemmFloatRef<DotF16>, GemmFloatRef<DotBF16>, nullptr, nullptr},
      {nullptr, nullptr, nullptr, GemmQuantRef<GgmlType::kQ8_0>, GemmQuantRef<GgmlType::kQ4_0>, nullptr, nullptr,
       nullptr, nullptr, nullptr, nullptr, nullptr, GemmQuantW4A8G64Reference, GemmQuantW4A8G128Reference,
       GemmQuantRef<GgmlType::kQ4_1>, GemmQuantRef<GgmlType::kQ5_0>, GemmQuantRef<GgmlType::kQ5_1>, nullptr, nullptr,
       GemmQuantRef<GgmlType::kIQ4_NL>, GemmQuantRef<GgmlType::kIQ4_XS>, GemmQuantRef<GgmlType::kMXFP4>},
      {}, {}, {}, {}, {},
      RmsNormRef,
      SiluMulRef,
      AxpyRef,
      ToF16Reference,
      ToBf16Reference,
      AttendManyReference,
      SoftmaxReference,
      RopeApplyReference,
      GeluMulReference,
      RopeApplyNeoxReference,
      ArgMaxRef,
      ExpShiftedRef,
      QuantizeActivations,
      QuantizeActivations16,
      DeltaRuleRef,
  };
  return table;
}

}  // namespace gale::kernels
