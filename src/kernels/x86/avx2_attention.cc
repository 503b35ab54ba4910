// AVX2 kernels: attention over the paged KV cache (online softmax, 8 floats per vector). Built with
// the flags of avx2_kernels.cc, whose table takes attend_many from here; only called when CPUID
// agrees.
//
// One query at a time (the queries of a call share K/V rows, which the later ones then read from
// L1), over blocks of 8 positions: the 8 scores (q . k, accumulated a few head vectors at a time,
// then summed across lanes by one transposing reduction), the block's exact max, the rescale of
// the output when the max grows, the weights, and the weighted V rows added to the output a few
// head vectors at a time. AVX2 has 16 vector registers: the query's vectors and the output stay
// in memory (L1) and are loaded in chunks that leave room for the 8 keys in flight. A query's
// operations and their order depend only on its length, so every query's result is the same
// whichever other queries share the call.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/isa_tables.h"
#include "kernels/kernels.h"
#include "kernels/x86/attention_common.h"
#include "kernels/x86/avx2_int8.h"

namespace gale::kernels {
namespace {

// exp(x) for 8 lanes: the AVX-512 kernels' Exp16 (range reduction by ln 2, degree-6 polynomial)
// with 2^n built in the exponent field, for x in [-87.3, 0] as softmax needs (x <= 0 after the
// max is subtracted; -inf and anything below -87.3 give a tiny positive value, then masked).
inline __m256 Exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Lane j of the result: the sum of v[j]'s 8 lanes (the same order for every j).
inline __m256 SumEach8(const __m256 (&v)[8]) {
  const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
  // b0: lanes 0-3 the sums of v[0..3]'s lanes 0-3, lanes 4-7 those of lanes 4-7; b1 for v[4..7].
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

// Bytes of 8 elements of the type.
template <KvType kType>
inline constexpr int kGroupBytes = kKvBytes<kType, 8>;

// 8 elements of the cache type as f32 (quantized types: the integers, unscaled).
template <KvType kType>
inline __m256 Load8(const uint8_t* p) {
  if constexpr (kType == KvType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (kType == KvType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (kType == KvType::kBF16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else if constexpr (kType == KvType::kInt8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else {  // int4: 4 bytes, element 2i in the low nibble of byte i, stored + 8
    int32_t w;
    std::memcpy(&w, p, 4);
    const __m128i x = SplitNibblePairs(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(w)));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(x), _mm256_set1_epi32(8)));
  }
}

constexpr int kMaxVecs = 72;  // latent attention rows of 576

// One query over positions [0, len) of kv, its head kVecs vectors of 8.
template <int kVecs, KvType kType, KvType vType>
void AttendOne(const float* qin, int64_t len, const KvBlockView& kv, float* out, float* raw_scores, float sink,
               float softcap) {
  // Scores take the query kQChunk vectors at a time (with 8 keys' partial sums in registers); the
  // output is updated kOChunk vectors at a time (8 chains of FMAs per key block).
  constexpr int kQChunk = kVecs % 4 == 0 ? 4 : kVecs % 5 == 0 ? 5 : kVecs;
  constexpr int kOChunk = kVecs <= 10 ? kVecs : kVecs % 8 == 0 ? 8 : 6;
  static_assert(kVecs % kQChunk == 0 && kVecs % kOChunk == 0 && kVecs <= kMaxVecs);
  alignas(32) float q[kVecs * 8];
  alignas(32) float acc[kVecs * 8] = {};
  const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(static_cast<float>(kVecs * 8)));
  for (int i = 0; i < kVecs; ++i) _mm256_store_ps(q + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(qin + 8 * i), scale));
  // A sink starts the softmax as a key of weight e^0 = 1 at the max and no value.
  float max = sink;
  __m256 sum = sink == -INFINITY ? _mm256_setzero_ps() : _mm256_setr_ps(1, 0, 0, 0, 0, 0, 0, 0);  // per lane
  const uint8_t* krow[8];
  const uint8_t* vrow[8];
  SlotCursor cursor(kv);
  for (int64_t p0 = 0; p0 < len; p0 += 8) {
    const int n = len - p0 < 8 ? static_cast<int>(len - p0) : 8;
    const uint8_t* klast = kv.k;
    const uint8_t* vlast = kv.v;
    for (int j = 0; j < 8; ++j) {
      if (j < n) {  // past the end the last row repeats (finite values, masked below)
        const int64_t slot = cursor.Next();
        klast = kv.k + slot * kv.k_row_bytes;
        vlast = kv.v + slot * kv.v_row_bytes;
      }
      krow[j] = klast;
      vrow[j] = vlast;
    }
    __m256 part[8];
    for (int j = 0; j < 8; ++j) part[j] = _mm256_setzero_ps();
    for (int c = 0; c < kVecs; c += kQChunk) {
      __m256 qc[kQChunk];
      for (int i = 0; i < kQChunk; ++i) qc[i] = _mm256_load_ps(q + 8 * (c + i));
      for (int j = 0; j < 8; ++j) {
        const uint8_t* kr = krow[j] + kKvDataOffset<kType>;
        for (int i = 0; i < kQChunk; ++i) part[j] = _mm256_fmadd_ps(qc[i], Load8<kType>(kr + kGroupBytes<kType> * (c + i)), part[j]);
      }
    }
    __m256 s = SumEach8(part);
    if constexpr (kKvQuantized<kType>) {
      alignas(32) float ks[8];
      for (int j = 0; j < 8; ++j) ks[j] = KvScale(krow[j]);
      s = _mm256_mul_ps(s, _mm256_load_ps(ks));
    }
    if (softcap > 0.0f) {  // Gemma 2: softcap * tanh(s / softcap), lane by lane as the scalar path
      alignas(32) float sv[8];
      _mm256_store_ps(sv, s);
      for (float& x : sv) x = SoftCap(x, softcap);
      s = _mm256_load_ps(sv);
    }
    const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    if (raw_scores != nullptr) {
      alignas(32) float sv[8];
      _mm256_store_ps(sv, s);
      std::memcpy(raw_scores + p0, sv, static_cast<size_t>(n) * sizeof(float));
    }
    const float block_max = MaxOf8(_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, valid));
    __m256 correction = _mm256_set1_ps(1.0f);
    const bool rescale = block_max > max;  // else the correction would be exp(0) = 1: skipped
    if (rescale) {
      correction = Exp8(_mm256_set1_ps(max - block_max));  // exp(-inf) = 0 on the first block
      sum = _mm256_mul_ps(sum, correction);
      max = block_max;
    }
    __m256 w = _mm256_and_ps(Exp8(_mm256_sub_ps(s, _mm256_set1_ps(max))), valid);
    sum = _mm256_add_ps(sum, w);
    if constexpr (kKvQuantized<vType>) {
      alignas(32) float vs[8];
      for (int j = 0; j < 8; ++j) vs[j] = KvScale(vrow[j]);
      w = _mm256_mul_ps(w, _mm256_load_ps(vs));
    }
    alignas(32) float wts[8];
    _mm256_store_ps(wts, w);
    for (int c = 0; c < kVecs; c += kOChunk) {
      __m256 o[kOChunk];
      for (int i = 0; i < kOChunk; ++i) {
        o[i] = _mm256_load_ps(acc + 8 * (c + i));
        if (rescale) o[i] = _mm256_mul_ps(o[i], correction);
      }
      for (int j = 0; j < 8; ++j) {
        const __m256 wj = _mm256_broadcast_ss(&wts[j]);
        const uint8_t* vr = vrow[j] + kKvDataOffset<vType>;
        for (int i = 0; i < kOChunk; ++i) o[i] = _mm256_fmadd_ps(wj, Load8<vType>(vr + kGroupBytes<vType> * (c + i)), o[i]);
      }
      for (int i = 0; i < kOChunk; ++i) _mm256_store_ps(acc + 8 * (c + i), o[i]);
    }
  }
  const __m256 inv = _mm256_set1_ps(1.0f / HSum(sum));
  for (int i = 0; i < kVecs; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(_mm256_load_ps(acc + 8 * i), inv));
}

template <int kVecs, KvType kType, KvType vType>
void AttendEach(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv, float* const* outs,
                float* const* scores, const float* sinks, float softcap) {
  for (int i = 0; i < num_queries; ++i) {
    AttendOne<kVecs, kType, vType>(qs[i], lens[i], kv.ForQuery(i), outs[i], scores != nullptr ? scores[i] : nullptr,
                                   sinks != nullptr ? sinks[i] : -INFINITY, softcap);
  }
}

template <KvType kType, KvType vType>
void AttendManyOfTypes(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                       int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap) {
  switch (head_dim) {
    case 8: return AttendEach<1, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    case 16: return AttendEach<2, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    case 32: return AttendEach<4, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    case 64: return AttendEach<8, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    case 80: return AttendEach<10, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    case 96: return AttendEach<12, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    case 128: return AttendEach<16, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    case 256: return AttendEach<32, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);  // Gemma
    // Latent attention rows (DeepSeek-V3, Kimi-K2: 512 + 64): the state lives in memory, the
    // loads and FMAs stay vector.
    case 576: return AttendEach<72, kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    default: return AttendManyReference(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
  }
}

}  // namespace

void Avx2AttendMany(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                    int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap) {
  const bool done = ForKvTypePair(kv.k_type, kv.v_type, [&](auto k, auto v) {
    AttendManyOfTypes<decltype(k)::value, decltype(v)::value>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
  });
  if (!done) AttendManyReference(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
}

}  // namespace gale::kernels
