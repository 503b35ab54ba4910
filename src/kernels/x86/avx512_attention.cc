// AVX-512 kernels: attention over the paged KV cache (online softmax). Built with the AVX-512
// flags of avx512_kernels.cc, whose table takes attend_many from here; only called when CPUID
// agrees.
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "base/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"
#include "kernels/x86/avx512_common.h"
#include "kernels/x86/gemm_tiles.h"

namespace gale::kernels {
namespace {

// Online softmax over blocks of 16 positions (no score matrix): per block, the scores, the new
// running max, rescale of the running sum and output, then the block's weighted V rows. q and the
// output stay in registers (head_dim / 16 vectors). The order depends only on len.
// Horizontal sums of 16 vectors at once: lane j of the result is the sum of v[j]'s 16 lanes.
// A transpose-and-add tree (45 instructions instead of 16 separate reductions); the order in
// which each v[j] is summed is the same for every j.
inline __m512 SumEach16(const __m512 (&v)[16]) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i) {
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // c[i], 128-bit lane L: the partial sums (over lane group L) of v[4i .. 4i+3].
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xdd));
}

// Running state of one query's online softmax.
template <int kVecs>
struct QueryState {
  __m512 q[kVecs];    // the query, pre-scaled by 1 / sqrt(head_dim)
  __m512 acc[kVecs];  // sum of weights * V rows so far (relative to max)
  float max;
  float sum;
};

// kHalf: head_dim 8 (kVecs 1): the upper 8 lanes of the query, K and V are zero.
template <int kVecs, bool kHalf = false>
inline void InitQuery(QueryState<kVecs>& st, const float* q, int head_dim) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int i = 0; i < kVecs; ++i) {
    const __m512 x = kHalf ? _mm512_maskz_loadu_ps(0xFF, q) : _mm512_loadu_ps(q + 16 * i);
    st.q[i] = _mm512_mul_ps(x, _mm512_set1_ps(scale));
    st.acc[i] = _mm512_setzero_ps();
  }
  st.max = -INFINITY;
  st.sum = 0.0f;
}

// 16 K or V elements of the cache type as f32.
template <KvType kType>
inline __m512 LoadKv16(const uint8_t* p) {
  if constexpr (kType == KvType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (kType == KvType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}
// Bytes of 16 elements of the type, and where a row segment's elements start (after the f16
// scale of the quantized types).
template <KvType kType>
inline constexpr int kKvGroupBytes = kType == KvType::kF32 ? 64 : kType == KvType::kInt8 ? 16 : kType == KvType::kInt4 ? 8 : 32;
template <KvType kType>
inline constexpr bool kKvQuantized = kType == KvType::kInt8 || kType == KvType::kInt4;
template <KvType kType>
inline constexpr int kKvDataOffset = kKvQuantized<kType> ? 2 : 0;

// The f16 scale of a quantized row segment.
inline float KvScale(const uint8_t* seg) {
  uint16_t h;
  std::memcpy(&h, seg, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

// Bytes of nibble pairs (zero-extended to 16 bits each) to one byte per nibble, low nibble
// first: element order 0, 1, 2, ...
inline __m128i SplitNibblePairs(__m128i b16) {
  return _mm_or_si128(_mm_and_si128(b16, _mm_set1_epi16(0x0F)), _mm_slli_epi16(_mm_srli_epi16(b16, 4), 8));
}

// 16 int8 or int4 (nibble pairs) integers as f32, unscaled.
template <KvType kType>
inline __m512 LoadKvInt16(const uint8_t* p) {
  if constexpr (kType == KvType::kInt8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else {
    const __m128i x = SplitNibblePairs(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(x), _mm512_set1_epi32(8)));
  }
}
template <KvType kType>
inline __m512 LoadKvInt8Lanes(const uint8_t* p) {
  if constexpr (kType == KvType::kInt8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else {
    int32_t w;
    std::memcpy(&w, p, 4);
    const __m128i x = SplitNibblePairs(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(w)));
    return _mm512_cvtepi32_ps(_mm512_maskz_sub_epi32(0xFF, _mm512_cvtepu8_epi32(x), _mm512_set1_epi32(8)));
  }
}

// 8 K or V elements as f32 in the low lanes, zeros above.
template <KvType kType>
inline __m512 LoadKv8(const uint8_t* p) {
  if constexpr (kType == KvType::kF32) {
    return _mm512_zextps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(p)));
  } else if constexpr (kType == KvType::kF16) {
    return _mm512_cvtph_ps(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

template <KvType kType, bool kHalf>
inline __m512 LoadKv(const uint8_t* p) {
  if constexpr (kKvQuantized<kType>) {
    if constexpr (kHalf) {
      return LoadKvInt8Lanes<kType>(p);
    } else {
      return LoadKvInt16<kType>(p);
    }
  } else if constexpr (kHalf) {
    return LoadKv8<kType>(p);
  } else {
    return LoadKv16<kType>(p);
  }
}

// Keys of one block of up to 16 positions into the states of kQ queries (query q sees the first
// n[q]): scores, new running max, rescale of the sum and output, then the weighted V rows.
// offs[j] is the byte offset of the j-th position's row in K and in V. Each K and V row is loaded
// once for the kQ queries, and their FMA chains interleave (one query alone waits on the latency
// of its V accumulation chains); every query sees the same operations in the same order whatever
// other queries share the block, so a query's result does not depend on how queries are grouped.
template <int kQ, int kVecs, KvType kType, KvType vType, bool kHalf = false>
inline void QueryBlock(QueryState<kVecs>* const* st, const uint8_t* k, const uint8_t* v, const int64_t* koffs,
                       const int64_t* voffs, const int* n, float* const* raw_scores, const uint64_t* exp_table) {
  // The states in locals: through the pointers, every update went to memory and back.
  QueryState<kVecs> cur[kQ];
  for (int q = 0; q < kQ; ++q) cur[q] = *st[q];
  int n_max = 0;
  for (int q = 0; q < kQ; ++q) n_max = n[q] > n_max ? n[q] : n_max;
  alignas(64) float s[kQ][16];
  {
    __m512 part[kQ][16];  // per query and key, lane-wise partial products; keys past n[q] stay zero
    for (int j = 0; j < 16; ++j) {
      if (j >= n_max) {
        for (int q = 0; q < kQ; ++q) part[q][j] = _mm512_setzero_ps();
        continue;
      }
      const uint8_t* kr = k + koffs[j] + kKvDataOffset<kType>;
      __m512 kv[kVecs];
      kv[0] = LoadKv<kType, kHalf>(kr);
      for (int i = 1; i < kVecs; ++i) kv[i] = LoadKv<kType, false>(kr + kKvGroupBytes<kType> * i);
      for (int q = 0; q < kQ; ++q) {
        __m512 d = _mm512_mul_ps(cur[q].q[0], kv[0]);
        for (int i = 1; i < kVecs; ++i) d = _mm512_fmadd_ps(cur[q].q[i], kv[i], d);
        if constexpr (kKvQuantized<kType>) d = _mm512_mul_ps(d, _mm512_set1_ps(KvScale(k + koffs[j])));
        part[q][j] = j < n[q] ? d : _mm512_setzero_ps();
      }
    }
    for (int q = 0; q < kQ; ++q) _mm512_store_ps(s[q], SumEach16(part[q]));
  }
  alignas(64) float wts[kQ][16];  // lanes past n[q] are never used
  for (int q = 0; q < kQ; ++q) {
    if (raw_scores[q] != nullptr) std::memcpy(raw_scores[q], s[q], static_cast<size_t>(n[q]) * sizeof(float));
    // The block's max: the exact maximum, whatever the order.
    const __mmask16 valid = static_cast<__mmask16>((1u << n[q]) - 1);
    const float block_max = _mm512_mask_reduce_max_ps(valid, _mm512_load_ps(s[q]));
    const float new_max = block_max > cur[q].max ? block_max : cur[q].max;
    // A block that raises the max rescales what came before (exp(-inf) = 0 on the first block);
    // otherwise the correction would be exp(0) = 1 exactly, a no-op, and is skipped. ExpfLikeLibm
    // is bitwise std::exp, inline: a call to libm here made the compiler spill every live vector
    // register around it, once per query and block.
    if (new_max != cur[q].max) {
      const float correction = _mm256_cvtss_f32(ExpfLikeLibm(_mm256_set1_ps(cur[q].max - new_max), exp_table));
      cur[q].sum *= correction;
      const __m512 cv = _mm512_set1_ps(correction);
      for (int i = 0; i < kVecs; ++i) cur[q].acc[i] = _mm512_mul_ps(cur[q].acc[i], cv);
    }
    _mm512_store_ps(wts[q], Exp16(_mm512_sub_ps(_mm512_load_ps(s[q]), _mm512_set1_ps(new_max))));
    cur[q].max = new_max;
  }
  for (int j = 0; j < n_max; ++j) {
    const uint8_t* vr = v + voffs[j] + kKvDataOffset<vType>;
    __m512 vv[kVecs];
    vv[0] = LoadKv<vType, kHalf>(vr);
    for (int i = 1; i < kVecs; ++i) vv[i] = LoadKv<vType, false>(vr + kKvGroupBytes<vType> * i);
    for (int q = 0; q < kQ; ++q) {
      if (j >= n[q]) continue;
      cur[q].sum += wts[q][j];
      const float w = kKvQuantized<vType> ? wts[q][j] * KvScale(v + voffs[j]) : wts[q][j];
      const __m512 wv = _mm512_set1_ps(w);
      for (int i = 0; i < kVecs; ++i) cur[q].acc[i] = _mm512_fmadd_ps(wv, vv[i], cur[q].acc[i]);
    }
  }
  for (int q = 0; q < kQ; ++q) *st[q] = cur[q];
}

template <int kVecs, bool kHalf = false>
inline void FinishQuery(const QueryState<kVecs>& st, float* out) {
  const __m512 inv = _mm512_set1_ps(1.0f / st.sum);
  for (int i = 0; i < kVecs; ++i) {
    if constexpr (kHalf) {
      _mm512_mask_storeu_ps(out, 0xFF, _mm512_mul_ps(st.acc[i], inv));
    } else {
      _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(st.acc[i], inv));
    }
  }
}

// The block of positions [p0, p0 + 16) into every query that reaches it, kGroup at a time (then
// two, then one).
template <int kVecs, KvType kType, KvType vType, bool kHalf>
inline void AttendBlock(QueryState<kVecs>* st, const int64_t* lens, int num_queries, int64_t p0, const uint8_t* k,
                        const uint8_t* v, const int64_t* koffs, const int64_t* voffs, float* const* scores,
                        const uint64_t* exp_table) {
  // Four: one query's block is a chain (scores -> max -> weights -> V accumulation) that leaves
  // the FMA units idle; four interleaved ran the 110m prefill attention at ~1.4x (f32 cache) to
  // ~1.7x (f16) the one-at-a-time speed, two at ~1.2x.
  constexpr int kGroup = 4;
  QueryState<kVecs>* pending[kGroup];
  int n[kGroup];
  float* raw[kGroup];
  int np = 0;
  for (int i = 0; i < num_queries; ++i) {
    if (lens[i] <= p0) continue;
    pending[np] = &st[i];
    n[np] = lens[i] - p0 < 16 ? static_cast<int>(lens[i] - p0) : 16;
    raw[np] = scores != nullptr && scores[i] != nullptr ? scores[i] + p0 : nullptr;
    if (++np == kGroup) {
      QueryBlock<kGroup, kVecs, kType, vType, kHalf>(pending, k, v, koffs, voffs, n, raw, exp_table);
      np = 0;
    }
  }
  int i = 0;  // the last np pending: two at a time, then one
  for (; i + 2 <= np; i += 2) {
    QueryBlock<2, kVecs, kType, vType, kHalf>(pending + i, k, v, koffs, voffs, n + i, raw + i, exp_table);
  }
  if (i < np) QueryBlock<1, kVecs, kType, vType, kHalf>(pending + i, k, v, koffs, voffs, n + i, raw + i, exp_table);
}

// Several queries over the same K/V (one KV head of one sequence), 16 positions at a time, so
// those K and V rows are read from memory once and from L1 for the other queries. Positions are
// grouped in 16s from 0 whatever the cache's block size: the row offsets are looked up per
// position, so a paged cache gives bitwise what a contiguous one does.
template <int kVecs, KvType kType, KvType vType, bool kHalf = false>
void AttendManyOnline(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                      int head_dim, float* const* outs, float* const* scores) {
  static_assert(!kHalf || kVecs == 1);
  QueryState<kVecs> st[kMaxAttendQueries];
  const uint64_t* exp_table = ExpfTable32();
  int64_t max_len = 0;
  for (int i = 0; i < num_queries; ++i) {
    InitQuery<kVecs, kHalf>(st[i], qs[i], head_dim);
    max_len = lens[i] > max_len ? lens[i] : max_len;
  }
  int64_t koffs[16], voffs[16];
  int64_t blk = 0, in_blk = 0;  // the next position is in_blk of logical block blk (no divisions)
  for (int64_t p0 = 0; p0 < max_len; p0 += 16) {
    const int64_t n_max = max_len - p0 < 16 ? max_len - p0 : 16;
    for (int64_t j = 0; j < n_max; ++j) {
      const int64_t slot = kv.block_table[blk] * kv.block_size + in_blk;
      koffs[j] = slot * kv.k_row_bytes;
      voffs[j] = slot * kv.v_row_bytes;
      if (++in_blk == kv.block_size) {
        in_blk = 0;
        ++blk;
      }
    }
    AttendBlock<kVecs, kType, vType, kHalf>(st, lens, num_queries, p0, kv.k, kv.v, koffs, voffs, scores, exp_table);
  }
  for (int i = 0; i < num_queries; ++i) FinishQuery<kVecs, kHalf>(st[i], outs[i]);
}

template <KvType kType, KvType vType>
void AttendManyOfTypes(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                       int head_dim, float* const* outs, float* const* scores) {
  switch (head_dim) {
    case 8: return AttendManyOnline<1, kType, vType, true>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 16: return AttendManyOnline<1, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 32: return AttendManyOnline<2, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 64: return AttendManyOnline<4, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 80: return AttendManyOnline<5, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 96: return AttendManyOnline<6, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 128: return AttendManyOnline<8, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    default: return AttendManyReference(qs, lens, num_queries, kv, head_dim, outs, scores);
  }
}

// K and V of one type, or K at higher precision than V (the useful mixes: V tolerates fewer bits
// than K); other pairs take the scalar path.
void AttendMany(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv, int head_dim,
                float* const* outs, float* const* scores) {
  using enum KvType;
  constexpr auto pair = [](KvType k, KvType v) { return static_cast<int>(k) * 8 + static_cast<int>(v); };
  switch (pair(kv.k_type, kv.v_type)) {
    case pair(kF32, kF32): return AttendManyOfTypes<kF32, kF32>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kF16, kF16): return AttendManyOfTypes<kF16, kF16>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kBF16, kBF16): return AttendManyOfTypes<kBF16, kBF16>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kInt8, kInt8): return AttendManyOfTypes<kInt8, kInt8>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kInt4, kInt4): return AttendManyOfTypes<kInt4, kInt4>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kF16, kInt8): return AttendManyOfTypes<kF16, kInt8>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kF16, kInt4): return AttendManyOfTypes<kF16, kInt4>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kBF16, kInt8): return AttendManyOfTypes<kBF16, kInt8>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kBF16, kInt4): return AttendManyOfTypes<kBF16, kInt4>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kInt8, kInt4): return AttendManyOfTypes<kInt8, kInt4>(qs, lens, num_queries, kv, head_dim, outs, scores);
    default: return AttendManyReference(qs, lens, num_queries, kv, head_dim, outs, scores);
  }
}

}  // namespace

void Avx512AttendMany(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                      int head_dim, float* const* outs, float* const* scores) {
  AttendMany(qs, lens, num_queries, kv, head_dim, outs, scores);
}

}  // namespace gale::kernels
