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
#include "kernels/x86/attention_common.h"
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
  float softcap;  // > 0: scores through softcap * tanh(s / softcap) (Gemma 2)
};

template <int kVecs>
inline void InitQuery(QueryState<kVecs>& st, const float* q, int head_dim, float sink, float softcap) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int i = 0; i < kVecs; ++i) {
    st.q[i] = _mm512_mul_ps(_mm512_loadu_ps(q + 16 * i), _mm512_set1_ps(scale));
    st.acc[i] = _mm512_setzero_ps();
  }
  // A sink starts the softmax as a key of weight e^0 = 1 at the max and no value.
  st.max = sink;
  st.sum = sink == -INFINITY ? 0.0f : 1.0f;
  st.softcap = softcap;
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
// Bytes of 16 elements of the type.
template <KvType kType>
inline constexpr int kKvGroupBytes = kKvBytes<kType, 16>;

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
inline __m512 LoadKv(const uint8_t* p) {
  if constexpr (kKvQuantized<kType>) {
    return LoadKvInt16<kType>(p);
  } else {
    return LoadKv16<kType>(p);
  }
}

// Keys of one block of up to 16 positions into the states of kQ queries (query q sees the first
// n[q]): scores, new running max, rescale of the sum and output, then the weighted V rows.
// offs[j] is the byte offset of the j-th position's row in K and in V. Each K and V row is loaded
// once for the kQ queries (kOwnRows: queries of different KV heads, each reading its rows at its
// byte offset ko[q] / vo[q] from them), and their FMA chains interleave (one query alone waits on the latency
// of its V accumulation chains); every query sees the same operations in the same order whatever
// other queries share the block, so a query's result does not depend on how queries are grouped.
template <int kQ, int kVecs, KvType kType, KvType vType, bool kOwnRows>
inline void QueryBlock(QueryState<kVecs>* const* st, const uint8_t* k, const uint8_t* v, const int64_t* koffs,
                       const int64_t* voffs, const int64_t* ko, const int64_t* vo, const int* n,
                       float* const* raw_scores, const uint64_t* exp_table) {
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
      if constexpr (!kOwnRows) {
        for (int i = 0; i < kVecs; ++i) kv[i] = LoadKv<kType>(kr + kKvGroupBytes<kType> * i);
      }
      for (int q = 0; q < kQ; ++q) {
        if constexpr (kOwnRows) {
          for (int i = 0; i < kVecs; ++i) kv[i] = LoadKv<kType>(kr + ko[q] + kKvGroupBytes<kType> * i);
        }
        __m512 d = _mm512_mul_ps(cur[q].q[0], kv[0]);
        for (int i = 1; i < kVecs; ++i) d = _mm512_fmadd_ps(cur[q].q[i], kv[i], d);
        if constexpr (kKvQuantized<kType>) d = _mm512_mul_ps(d, _mm512_set1_ps(KvScale(k + koffs[j] + ko[q])));
        part[q][j] = j < n[q] ? d : _mm512_setzero_ps();
      }
    }
    for (int q = 0; q < kQ; ++q) _mm512_store_ps(s[q], SumEach16(part[q]));
  }
  for (int q = 0; q < kQ; ++q) {  // Gemma 2's soft-capping, score by score as the scalar path
    if (cur[q].softcap > 0.0f) {
      for (int j = 0; j < n[q]; ++j) s[q][j] = SoftCap(s[q][j], cur[q].softcap);
    }
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
    if constexpr (!kOwnRows) {
      for (int i = 0; i < kVecs; ++i) vv[i] = LoadKv<vType>(vr + kKvGroupBytes<vType> * i);
    }
    for (int q = 0; q < kQ; ++q) {
      if (j >= n[q]) continue;
      if constexpr (kOwnRows) {
        for (int i = 0; i < kVecs; ++i) vv[i] = LoadKv<vType>(vr + vo[q] + kKvGroupBytes<vType> * i);
      }
      cur[q].sum += wts[q][j];
      const float w = kKvQuantized<vType> ? wts[q][j] * KvScale(v + voffs[j] + vo[q]) : wts[q][j];
      const __m512 wv = _mm512_set1_ps(w);
      for (int i = 0; i < kVecs; ++i) cur[q].acc[i] = _mm512_fmadd_ps(wv, vv[i], cur[q].acc[i]);
    }
  }
  for (int q = 0; q < kQ; ++q) *st[q] = cur[q];
}

template <int kVecs>
inline void FinishQuery(const QueryState<kVecs>& st, float* out) {
  const __m512 inv = _mm512_set1_ps(1.0f / st.sum);
  for (int i = 0; i < kVecs; ++i) _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(st.acc[i], inv));
}

// The block of positions [p0, p0 + 16) into every query that reaches it, kGroup at a time (then
// two, then one). qk / qv: each query's byte offset to its KV head (kOwnRows).
template <int kVecs, KvType kType, KvType vType, bool kOwnRows>
inline void AttendBlock(QueryState<kVecs>* st, const int64_t* lens, int num_queries, int64_t p0, const uint8_t* k,
                        const uint8_t* v, const int64_t* koffs, const int64_t* voffs, const int64_t* qk,
                        const int64_t* qv, float* const* scores, const uint64_t* exp_table) {
  // Four: one query's block is a chain (scores -> max -> weights -> V accumulation) that leaves
  // the FMA units idle; four interleaved ran the 110m prefill attention at ~1.4x (f32 cache) to
  // ~1.7x (f16) the one-at-a-time speed, two at ~1.2x.
  constexpr int kGroup = 4;
  QueryState<kVecs>* pending[kGroup];
  int n[kGroup];
  float* raw[kGroup];
  int64_t ko[kGroup], vo[kGroup];
  int np = 0;
  for (int i = 0; i < num_queries; ++i) {
    if (lens[i] <= p0) continue;
    pending[np] = &st[i];
    ko[np] = qk[i];
    vo[np] = qv[i];
    n[np] = lens[i] - p0 < 16 ? static_cast<int>(lens[i] - p0) : 16;
    raw[np] = scores != nullptr && scores[i] != nullptr ? scores[i] + p0 : nullptr;
    if (++np == kGroup) {
      QueryBlock<kGroup, kVecs, kType, vType, kOwnRows>(pending, k, v, koffs, voffs, ko, vo, n, raw, exp_table);
      np = 0;
    }
  }
  int i = 0;  // the last np pending: two at a time, then one
  for (; i + 2 <= np; i += 2) {
    QueryBlock<2, kVecs, kType, vType, kOwnRows>(pending + i, k, v, koffs, voffs, ko + i, vo + i, n + i, raw + i,
                                                 exp_table);
  }
  if (i < np) {
    QueryBlock<1, kVecs, kType, vType, kOwnRows>(pending + i, k, v, koffs, voffs, ko + i, vo + i, n + i, raw + i,
                                                 exp_table);
  }
}

// Several queries over the same K/V (one KV head of one sequence), 16 positions at a time, so
// those K and V rows are read from memory once and from L1 for the other queries. Positions are
// grouped in 16s from 0 whatever the cache's block size: the row offsets are looked up per
// position, so a paged cache gives bitwise what a contiguous one does. With kv.query_heads the
// queries read different KV heads of one sequence (the same block table): their rows are loaded
// per query, and their chains interleave all the same (decode with one query per KV head).
template <int kVecs, KvType kType, KvType vType>
void AttendManyOnline(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                      int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap) {
  QueryState<kVecs> st[kMaxAttendQueries];
  const uint64_t* exp_table = ExpfTable32();
  int64_t max_len = 0;
  int64_t qk[kMaxAttendQueries], qv[kMaxAttendQueries];  // byte offsets to each query's KV head
  for (int i = 0; i < num_queries; ++i) {
    InitQuery<kVecs>(st[i], qs[i], head_dim, sinks != nullptr ? sinks[i] : -INFINITY, softcap);
    max_len = lens[i] > max_len ? lens[i] : max_len;
    const int64_t h = kv.query_heads != nullptr ? kv.query_heads[i] : 0;
    qk[i] = h * kv.k_head_bytes;
    qv[i] = h * kv.v_head_bytes;
  }
  int64_t koffs[16], voffs[16];
  SlotCursor cursor(kv);
  for (int64_t p0 = 0; p0 < max_len; p0 += 16) {
    const int64_t n_max = max_len - p0 < 16 ? max_len - p0 : 16;
    for (int64_t j = 0; j < n_max; ++j) {
      const int64_t slot = cursor.Next();
      koffs[j] = slot * kv.k_row_bytes;
      voffs[j] = slot * kv.v_row_bytes;
    }
    if (kv.query_heads != nullptr) {
      AttendBlock<kVecs, kType, vType, true>(st, lens, num_queries, p0, kv.k, kv.v, koffs, voffs, qk, qv, scores,
                                             exp_table);
    } else {
      AttendBlock<kVecs, kType, vType, false>(st, lens, num_queries, p0, kv.k, kv.v, koffs, voffs, qk, qv, scores,
                                              exp_table);
    }
  }
  for (int i = 0; i < num_queries; ++i) FinishQuery<kVecs>(st[i], outs[i]);
}

// Queries of several KV heads (kv.query_heads) through fn, which takes one head per call: each
// head's queries together, in their order.
template <typename Fn>
void EachHead(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv, float* const* outs,
              float* const* scores, const float* sinks, float softcap, Fn fn) {
  bool done[kMaxAttendQueries] = {};
  for (int i = 0; i < num_queries; ++i) {
    if (done[i]) continue;
    const float* hq[kMaxAttendQueries];
    int64_t hl[kMaxAttendQueries];
    float* ho[kMaxAttendQueries];
    float* hs[kMaxAttendQueries];
    float hsink[kMaxAttendQueries];
    int n = 0;
    for (int j = i; j < num_queries; ++j) {
      if (done[j] || kv.query_heads[j] != kv.query_heads[i]) continue;
      hq[n] = qs[j];
      hl[n] = lens[j];
      ho[n] = outs[j];
      hs[n] = scores != nullptr ? scores[j] : nullptr;
      hsink[n] = sinks != nullptr ? sinks[j] : -INFINITY;
      done[j] = true;
      ++n;
    }
    fn(hq, hl, n, kv.ForQuery(i), ho, scores != nullptr ? hs : nullptr, sinks != nullptr ? hsink : nullptr, softcap);
  }
}

// head_dim 8: a row is half a vector, so instead of a horizontal sum per key, a block's 16 K and V
// rows are transposed once for every query that reads them: t[d] holds element d of the 16 rows.
// A query's 16 scores are then 8 FMAs and its weighted V rows 8 more, and each output lane sums
// the keys of one lane, added across lanes once at the end. Per query the operations and their
// order depend only on its length, as in the wider heads' path.

// The transpose leaves keys 4-7 and 8-11 swapped: lane l of a transposed block holds key
// Hd8Key(l) (the same swap maps keys back to lanes).
constexpr int Hd8Key(int l) { return (l & 12) == 4 ? l + 4 : (l & 12) == 8 ? l - 4 : l; }
inline __mmask16 Hd8Lanes(uint32_t key_mask) {
  return static_cast<__mmask16>((key_mask & 0xF00F) | ((key_mask & 0x0F00) >> 4) | ((key_mask & 0x00F0) << 4));
}
inline __m512 Hd8ToKeyOrder(__m512 x) { return _mm512_shuffle_f32x4(x, x, 0xD8); }

// Rows a (lanes 0-7) and b (lanes 8-15), 8 elements each, as f32 (quantized types: the integers,
// unscaled).
template <KvType kType>
inline __m512 LoadRowPair8(const uint8_t* a, const uint8_t* b) {
  if constexpr (kType == KvType::kF32) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(a))),
                              _mm256_loadu_ps(reinterpret_cast<const float*>(b)), 1);
  } else if constexpr (kType == KvType::kF16 || kType == KvType::kBF16) {
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
    if constexpr (kType == KvType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (kType == KvType::kInt8) {
    const __m128i x = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x));
  } else {  // int4: 4 bytes of nibble pairs per row
    int32_t wa, wb;
    std::memcpy(&wa, a, 4);
    std::memcpy(&wb, b, 4);
    const __m128i x = SplitNibblePairs(_mm_cvtepu8_epi16(_mm_unpacklo_epi32(_mm_cvtsi32_si128(wa), _mm_cvtsi32_si128(wb))));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(x), _mm512_set1_epi32(8)));
  }
}

// The block's rows (offs[j] for j < n_max; zeros past it) transposed into t; for the quantized
// types also each lane's row scale (zero past n_max), else ones.
template <KvType kType>
inline void TransposeBlock8(const uint8_t* base, const int64_t* offs, int n_max, __m512 (&t)[8], __m512& scales) {
  alignas(64) static constexpr uint8_t kZeroRow[64] = {};
  auto row = [&](int j) { return j < n_max ? base + offs[j] + kKvDataOffset<kType> : kZeroRow; };
  __m512 z[8], u[8];
  for (int i = 0; i < 8; ++i) z[i] = LoadRowPair8<kType>(row(i), row(i + 8));
  // Per 128-bit lane, the classic 8x8 transpose of each 256-bit half (rows i and i + 8).
  for (int h = 0; h < 8; h += 4) {
    const __m512 a0 = _mm512_unpacklo_ps(z[h], z[h + 1]), a1 = _mm512_unpackhi_ps(z[h], z[h + 1]);
    const __m512 a2 = _mm512_unpacklo_ps(z[h + 2], z[h + 3]), a3 = _mm512_unpackhi_ps(z[h + 2], z[h + 3]);
    u[h] = _mm512_shuffle_ps(a0, a2, 0x44);
    u[h + 1] = _mm512_shuffle_ps(a0, a2, 0xEE);
    u[h + 2] = _mm512_shuffle_ps(a1, a3, 0x44);
    u[h + 3] = _mm512_shuffle_ps(a1, a3, 0xEE);
  }
  // u[e] (rows 0-3, 8-11) and u[e + 4] (rows 4-7, 12-15) hold elements e and e + 4 in alternate
  // 128-bit lanes.
  for (int e = 0; e < 4; ++e) {
    t[e] = _mm512_shuffle_f32x4(u[e], u[e + 4], 0x88);
    t[e + 4] = _mm512_shuffle_f32x4(u[e], u[e + 4], 0xDD);
  }
  if constexpr (kKvQuantized<kType>) {
    alignas(32) uint16_t sc[16];  // f16 scales, converted together
    for (int l = 0; l < 16; ++l) {
      sc[l] = 0;
      if (Hd8Key(l) < n_max) std::memcpy(&sc[l], base + offs[Hd8Key(l)], 2);
    }
    scales = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc)));
  } else {
    scales = _mm512_set1_ps(1.0f);
  }
}

struct QueryState8 {
  __m512 acc[8];  // per element, per lane: the weighted V values of the lane's keys so far
  __m512 sum;     // per lane: the weights so far
  float q[8];     // the query, pre-scaled by 1 / sqrt(8)
  float max;
  float softcap;  // > 0: Gemma 2's soft-capping
};

// One block (up to 16 positions from p0) into every query that reaches it.
template <KvType kType, KvType vType>
inline void AttendBlock8(QueryState8* st, const int64_t* lens, int num_queries, int64_t p0, int n_max,
                         const uint8_t* k, const uint8_t* v, const int64_t* koffs, const int64_t* voffs,
                         float* const* scores, const uint64_t* exp_table) {
  __m512 kt[8], vt[8], kscale, vscale;
  TransposeBlock8<kType>(k, koffs, n_max, kt, kscale);
  TransposeBlock8<vType>(v, voffs, n_max, vt, vscale);
  for (int i = 0; i < num_queries; ++i) {
    if (lens[i] <= p0) continue;
    QueryState8& q = st[i];
    const int n = lens[i] - p0 < 16 ? static_cast<int>(lens[i] - p0) : 16;
    const __mmask16 valid = Hd8Lanes((1u << n) - 1);
    __m512 s0 = _mm512_mul_ps(_mm512_set1_ps(q.q[0]), kt[0]), s1 = _mm512_mul_ps(_mm512_set1_ps(q.q[4]), kt[4]);
    for (int d = 1; d < 4; ++d) {
      s0 = _mm512_fmadd_ps(_mm512_set1_ps(q.q[d]), kt[d], s0);
      s1 = _mm512_fmadd_ps(_mm512_set1_ps(q.q[d + 4]), kt[d + 4], s1);
    }
    __m512 s = _mm512_add_ps(s0, s1);
    if constexpr (kKvQuantized<kType>) s = _mm512_mul_ps(s, kscale);
    if (q.softcap > 0.0f) {
      alignas(64) float sv[16];
      _mm512_store_ps(sv, s);
      for (float& x : sv) x = SoftCap(x, q.softcap);
      s = _mm512_load_ps(sv);
    }
    if (scores != nullptr && scores[i] != nullptr) {
      alignas(64) float raw[16];
      _mm512_store_ps(raw, Hd8ToKeyOrder(s));
      std::memcpy(scores[i] + p0, raw, static_cast<size_t>(n) * sizeof(float));
    }
    const float block_max = _mm512_mask_reduce_max_ps(valid, s);
    const float new_max = block_max > q.max ? block_max : q.max;
    if (new_max != q.max) {  // exp(0) = 1 would leave everything as it is
      const float correction = _mm256_cvtss_f32(ExpfLikeLibm(_mm256_set1_ps(q.max - new_max), exp_table));
      const __m512 cv = _mm512_set1_ps(correction);
      q.sum = _mm512_mul_ps(q.sum, cv);
      for (int d = 0; d < 8; ++d) q.acc[d] = _mm512_mul_ps(q.acc[d], cv);
      q.max = new_max;
    }
    __m512 w = _mm512_maskz_mov_ps(valid, Exp16(_mm512_sub_ps(s, _mm512_set1_ps(new_max))));
    q.sum = _mm512_add_ps(q.sum, w);
    if constexpr (kKvQuantized<vType>) w = _mm512_mul_ps(w, vscale);
    for (int d = 0; d < 8; ++d) q.acc[d] = _mm512_fmadd_ps(w, vt[d], q.acc[d]);
  }
}

template <KvType kType, KvType vType>
void AttendManyHd8(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                   float* const* outs, float* const* scores, const float* sinks, float softcap) {
  if (kv.query_heads != nullptr) {  // the transposed block is one head's: each head's queries together
    EachHead(qs, lens, num_queries, kv, outs, scores, sinks, softcap, AttendManyHd8<kType, vType>);
    return;
  }
  QueryState8 st[kMaxAttendQueries];
  const uint64_t* exp_table = ExpfTable32();
  const float scale = 1.0f / std::sqrt(8.0f);
  int64_t max_len = 0;
  for (int i = 0; i < num_queries; ++i) {
    for (int d = 0; d < 8; ++d) {
      st[i].q[d] = qs[i][d] * scale;
      st[i].acc[d] = _mm512_setzero_ps();
    }
    // A sink: a key of weight e^0 = 1 at the max (one lane of the sum) and no value.
    st[i].max = sinks != nullptr ? sinks[i] : -INFINITY;
    st[i].softcap = softcap;
    st[i].sum = st[i].max == -INFINITY ? _mm512_setzero_ps() : _mm512_setr_ps(1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    max_len = lens[i] > max_len ? lens[i] : max_len;
  }
  int64_t koffs[16], voffs[16];
  SlotCursor cursor(kv);
  for (int64_t p0 = 0; p0 < max_len; p0 += 16) {
    const int n_max = max_len - p0 < 16 ? static_cast<int>(max_len - p0) : 16;
    for (int j = 0; j < n_max; ++j) {
      const int64_t slot = cursor.Next();
      koffs[j] = slot * kv.k_row_bytes;
      voffs[j] = slot * kv.v_row_bytes;
    }
    AttendBlock8<kType, vType>(st, lens, num_queries, p0, n_max, kv.k, kv.v, koffs, voffs, scores, exp_table);
  }
  for (int i = 0; i < num_queries; ++i) {
    const float inv = 1.0f / _mm512_reduce_add_ps(st[i].sum);
    for (int d = 0; d < 8; ++d) outs[i][d] = _mm512_reduce_add_ps(st[i].acc[d]) * inv;
  }
}

template <KvType kType, KvType vType>
void AttendManyOfTypes(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                       int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap) {
  switch (head_dim) {
    case 8: return AttendManyHd8<kType, vType>(qs, lens, num_queries, kv, outs, scores, sinks, softcap);
    case 16: return AttendManyOnline<1, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
    case 32: return AttendManyOnline<2, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
    case 64: return AttendManyOnline<4, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
    case 80: return AttendManyOnline<5, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
    case 96: return AttendManyOnline<6, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
    case 128: return AttendManyOnline<8, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
    case 256: return AttendManyOnline<16, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);  // Gemma
    // Latent attention rows (DeepSeek-V3, Kimi-K2: 512 + 64); the state no longer fits the
    // registers, but the loads and FMAs stay vector.
    case 576: return AttendManyOnline<36, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
    default: return AttendManyReference(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
  }
}

void AttendMany(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv, int head_dim,
                float* const* outs, float* const* scores, const float* sinks, float softcap) {
  const bool done = ForKvTypePair(kv.k_type, kv.v_type, [&](auto k, auto v) {
    AttendManyOfTypes<decltype(k)::value, decltype(v)::value>(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
  });
  if (!done) AttendManyReference(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
}

}  // namespace

void Avx512AttendMany(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                      int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap) {
  AttendMany(qs, lens, num_queries, kv, head_dim, outs, scores, sinks, softcap);
}

}  // namespace gale::kernels
