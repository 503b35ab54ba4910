// Dispatch and the drivers that split work across the pool. Per-element arithmetic lives in the
// ISA tables; here is only the looping, in an order fixed independent of batch and thread count.
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "base/cpu.h"
#include "kernels/isa_tables.h"

namespace gale::kernels {

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

std::string ActiveKernelsName() {
  const KernelTable& kt = Active();
  std::string name = IsaName(kt.isa);
  if (kt.variant != nullptr) name += std::string(" (") + kt.variant + ")";
  return name;
}

std::optional<Isa> ParseIsa(std::string_view name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (name == IsaName(isa)) return isa;
  }
  return std::nullopt;
}

TypeSlot SlotOf(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return kSlotF32;
    case GgmlType::kF16: return kSlotF16;
    case GgmlType::kBF16: return kSlotBF16;
    case GgmlType::kQ8_0: return kSlotQ8_0;
    case GgmlType::kQ4_0: return kSlotQ4_0;
    case GgmlType::kQ4_1: return kSlotQ4_1;
    case GgmlType::kQ5_0: return kSlotQ5_0;
    case GgmlType::kQ5_1: return kSlotQ5_1;
    case GgmlType::kQ2_K: return kSlotQ2_K;
    case GgmlType::kQ3_K: return kSlotQ3_K;
    case GgmlType::kQ4_K: return kSlotQ4_K;
    case GgmlType::kQ5_K: return kSlotQ5_K;
    case GgmlType::kQ6_K: return kSlotQ6_K;
    case GgmlType::kIQ4_NL: return kSlotIQ4_NL;
    case GgmlType::kIQ4_XS: return kSlotIQ4_XS;
    case GgmlType::kMXFP4: return kSlotMXFP4;
    case GgmlType::kF8E4M3: return kSlotF8E4M3;
    case GgmlType::kW4A16G64: return kSlotW4A16G64;
    case GgmlType::kW4A16G128: return kSlotW4A16G128;
    case GgmlType::kW4A16ZG64: return kSlotW4A16ZG64;
    case GgmlType::kW4A16ZG128: return kSlotW4A16ZG128;
    case GgmlType::kW4A8G64: return kSlotW4A8G64;
    case GgmlType::kW4A8G128: return kSlotW4A8G128;
  }
  CHECK(false && "no kernels for this type");
  return kSlotF32;
}

const KernelTable* GetKernelTable(Isa isa) {
  const CpuFeatures& cpu = GetCpuFeatures();
  switch (isa) {
    case Isa::kScalar: return &ScalarTable();
    // A table this build left out (CMake's GALE_KERNEL_ISAS) is absent, as on a CPU without it.
    case Isa::kAvx2:
#if GALE_KERNELS_AVX2
      return cpu.HasAvx2() ? &Avx2Table() : nullptr;
#else
      return nullptr;
#endif
    case Isa::kAvx512:
#if GALE_KERNELS_AVX512
      return cpu.HasAvx512() ? &Avx512Table() : nullptr;
#else
      return nullptr;
#endif
  }
  return nullptr;
}

Isa BestIsa() {
  Isa best = Isa::kScalar;
  if (GetKernelTable(Isa::kAvx2)) best = Isa::kAvx2;
  if (GetKernelTable(Isa::kAvx512)) best = Isa::kAvx512;
  if (const char* env = std::getenv("GALE_ISA")) {
    const std::optional<Isa> cap = ParseIsa(env);
    if (cap && static_cast<int>(*cap) < static_cast<int>(best)) best = *cap;
  }
  return best;
}

namespace {
const KernelTable* g_active = nullptr;
}

const KernelTable& Active() {
  if (g_active == nullptr) g_active = GetKernelTable(BestIsa());
  return *g_active;
}

void SetActiveIsa(Isa isa) {
  const KernelTable* t = GetKernelTable(isa);
  CHECK(t != nullptr);
  g_active = t;
}

int64_t PackedBytesForActiveIsa(const TensorView& w) {
  const KernelTable& kt = Active();
  const TypeSlot slot = SlotOf(w.type);
  if (kt.pack[slot] == nullptr) return 0;
  const int64_t num_groups = (w.NumRows() + kPackedRowGroup - 1) / kPackedRowGroup;
  return kt.packed_group_bytes[slot](w.shape[0]) * num_groups;
}

std::unique_ptr<PackedWeights> PackForActiveIsa(const TensorView& w, uint8_t* dst) {
  const KernelTable& kt = Active();
  const TypeSlot slot = SlotOf(w.type);
  if (kt.pack[slot] == nullptr) return nullptr;
  auto p = std::make_unique<PackedWeights>();
  p->isa = kt.isa;
  p->type = w.type;
  p->num_rows = w.NumRows();
  p->cols = w.shape[0];
  p->group_bytes = kt.packed_group_bytes[slot](p->cols);
  p->data = std::unique_ptr<uint8_t, void (*)(void*)>(dst, [](void*) {});
  kt.pack[slot](w.data, w.RowBytes(), p->num_rows, p->cols, dst);
  return p;
}

std::unique_ptr<PackedWeights> PackForActiveIsa(const TensorView& w) {
  const int64_t bytes = PackedBytesForActiveIsa(w);
  if (bytes == 0) return nullptr;
  const size_t alloc = static_cast<size_t>((bytes + 63) / 64 * 64);
  void* mem = std::aligned_alloc(64, alloc);
  CHECK(mem != nullptr);
  auto p = PackForActiveIsa(w, static_cast<uint8_t*>(mem));
  p->data = std::unique_ptr<uint8_t, void (*)(void*)>(static_cast<uint8_t*>(mem), std::free);
  return p;
}

namespace {

// Rough single-thread cost of quantizing one activation (the SIMD quantizers measured ~0.2 ns per
// element in kernels_bench, the scalar one ~1.6; a fused RmsNorm adds a read and a write).
double QuantizeNsPerElement(const KernelTable& kt, const RmsNormInput* norm) {
  return (kt.isa == Isa::kScalar ? 1.6 : 0.2) + (norm != nullptr ? 0.1 : 0.0);
}

// Quantizes activations for the int8 paths (int8 per 32) or the W4A16 packed path (16-bit): into
// the calling thread's scratch for that kind, so one of each can be live at once.
// NOTE: scratch is thread_local to the calling (engine) thread, grown to the largest batch.
// half_sums: also each int8 block's two 16-value halves' sums (QuantizedActs::half_sums, for
// the Q6_K kernels). norm: when set, each token is first normalized (RmsNorm) into per-thread scratch
// and x is the input before the norm.
QuantizedActs QuantizeForGemm(const float* x, int64_t num_tokens, int64_t cols, bool a16, bool half_sums,
                              ThreadPool& pool, const RmsNormInput* norm) {
  struct Scratch {
    std::vector<int8_t> qs;     // [num_tokens, k_stride]
    std::vector<uint8_t> lo;    // [num_tokens, k_stride] (a16)
    std::vector<float> d;       // [num_tokens, k_stride / 32]
    std::vector<int32_t> qsum;  // [num_tokens, k_stride / 32]
    std::vector<int32_t> half;  // [num_tokens, k_stride / 16] (int8)
  };
  static thread_local Scratch scratch[2];
  Scratch& sc = scratch[a16 ? 1 : 0];
  const int64_t k_stride = (cols + kActPad - 1) / kActPad * kActPad;
  const int64_t nb = k_stride / 32;
  const size_t n = static_cast<size_t>(num_tokens * k_stride);
  if (sc.qs.size() < n) sc.qs.resize(n);
  if (a16 && sc.lo.size() < n) sc.lo.resize(n);
  if (sc.d.size() < static_cast<size_t>(num_tokens * nb)) {
    sc.d.resize(num_tokens * nb);
    sc.qsum.resize(num_tokens * nb);
  }
  half_sums = half_sums && !a16;
  if (half_sums && sc.half.size() < static_cast<size_t>(num_tokens * nb * 2)) sc.half.resize(num_tokens * nb * 2);
  int8_t* qs_data = sc.qs.data();
  uint8_t* lo_data = a16 ? sc.lo.data() : nullptr;
  float* d_data = sc.d.data();
  int32_t* qsum_data = sc.qsum.data();
  int32_t* half_data = half_sums ? sc.half.data() : nullptr;
  const KernelTable& kt = Active();
  pool.ParallelFor(
      num_tokens,
      [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> normed;  // one token's normalized row (norm only)
        if (norm != nullptr && normed.size() < static_cast<size_t>(cols)) normed.resize(cols);
        for (int64_t t = begin; t < end; ++t) {
          const float* xt = x + t * cols;
          if (norm != nullptr) {
            kt.rms_norm(xt, norm->w, cols, norm->eps, normed.data());
            xt = normed.data();
          }
          if (a16) {
            kt.quantize_acts16(xt, cols, k_stride, qs_data + t * k_stride, lo_data + t * k_stride, d_data + t * nb,
                               qsum_data + t * nb);
          } else {
            kt.quantize_acts(xt, cols, k_stride, qs_data + t * k_stride, d_data + t * nb, qsum_data + t * nb);
            const int8_t* q = qs_data + t * k_stride;
            for (int64_t h = 0; half_sums && h < 2 * nb; ++h) {
              int32_t sum = 0;
              for (int i = 0; i < 16; ++i) sum += q[16 * h + i];
              half_data[t * 2 * nb + h] = sum;
            }
          }
        }
      },
      ThreadPool::MinItemsForWork(num_tokens, static_cast<double>(num_tokens * cols) * QuantizeNsPerElement(kt, norm)));
  return QuantizedActs{qs_data, d_data, qsum_data, cols, k_stride, lo_data, half_data};
}

// Activations rounded to bf16 for gemm_bf16, [num_tokens, k rounded up to kBf16ActPad] with zero
// padding, in the calling thread's scratch.
const uint16_t* ActivationsBf16(const KernelTable& kt, const float* x, int64_t num_tokens, int64_t cols,
                                ThreadPool& pool) {
  static thread_local std::vector<uint16_t> scratch;
  const int64_t k_stride = (cols + kBf16ActPad - 1) / kBf16ActPad * kBf16ActPad;
  if (scratch.size() < static_cast<size_t>(num_tokens * k_stride)) scratch.resize(num_tokens * k_stride);
  uint16_t* out = scratch.data();
  pool.ParallelFor(
      num_tokens,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          kt.to_bf16(x + t * cols, out + t * k_stride, cols);
          std::fill(out + t * k_stride + cols, out + (t + 1) * k_stride, uint16_t{0});
        }
      },
      /*min_items_per_thread=*/16);
  return out;
}

// Which activations a product reads.
enum class ActKind { kFloat, kInt8, kA16, kBf16 };
ActKind KindOf(const KernelTable& kt, TypeSlot slot, bool packed_here) {
  if (packed_here && kt.gemm_packed_a16[slot] != nullptr) return ActKind::kA16;
  if ((packed_here && kt.gemm_packed[slot] != nullptr) || kt.gemm_quant[slot] != nullptr) return ActKind::kInt8;
  if (kt.gemm_bf16[slot] != nullptr) return ActKind::kBf16;
  return ActKind::kFloat;
}
// Whether o's packed copy is the active ISA's layout.
bool PackedHere(const KernelTable& kt, const MatMulOutput& o) { return o.packed != nullptr && o.packed->isa == kt.isa; }
ActKind KindOf(const KernelTable& kt, const MatMulOutput& o) {
  return KindOf(kt, SlotOf(o.w->type), PackedHere(kt, o));
}

// One product's work as items (row groups of a packed matrix, or quanta of 4 rows: the widest
// row tile) that Run(begin, end) computes for every token; any split of the items gives the same
// rows, bit for bit.
struct ProductWork {
  enum class Path { kPacked, kQuant, kFloat, kBf16, kDequantRows } path;
  const TensorView* w;
  const PackedWeights* packed;
  GemmQuantFn gemm_q = nullptr;
  GemmFloatFn gemm_f = nullptr;
  GemmBf16Fn gemm_b = nullptr;
  DequantizeRowFn deq = nullptr;
  const float* x;
  const QuantizedActs* qa;  // int8 / 16-bit activations, or null (float paths)
  const uint16_t* xb;       // bf16 activations (kBf16), or null
  int64_t num_tokens;
  float* y;
  int64_t items = 0;

  static constexpr int64_t kRowQuantum = 4;

  // Rough single-thread time of the whole product, for deciding how many threads it is worth:
  // reading the weights (~50 GB/s: the products near the threshold are small enough to stay in
  // cache between steps) plus the multiply-adds at a rate typical of the path's tile on this
  // machine class.
  double EstimatedNs() const {
    double macs_per_ns = 60;  // f32 FMA tile
    switch (path) {
      case Path::kPacked:
      case Path::kQuant:
        macs_per_ns = 150;
        break;
      case Path::kBf16:
        macs_per_ns = 120;
        break;
      case Path::kDequantRows:
        macs_per_ns = 10;
        break;
      case Path::kFloat:
        break;
    }
    const double rows = static_cast<double>(w->NumRows());
    return rows * static_cast<double>(w->RowBytes()) / 50.0 +
           rows * static_cast<double>(w->shape[0]) * static_cast<double>(num_tokens) / macs_per_ns;
  }

  void Run(int64_t begin, int64_t end) const {
    const int64_t rows = w->NumRows(), row_bytes = w->RowBytes(), cols = w->shape[0];
    switch (path) {
      case Path::kPacked: {
        const int64_t r0 = begin * kPackedRowGroup, r1 = std::min(rows, end * kPackedRowGroup);
        gemm_q(packed->data.get() + begin * packed->group_bytes, packed->group_bytes, r1 - r0, *qa, num_tokens, y + r0,
               rows);
        return;
      }
      case Path::kQuant: {
        const int64_t r0 = begin * kRowQuantum, r1 = std::min(rows, end * kRowQuantum);
        gemm_q(w->data + r0 * row_bytes, row_bytes, r1 - r0, *qa, num_tokens, y + r0, rows);
        return;
      }
      case Path::kFloat: {
        const int64_t r0 = begin * kRowQuantum, r1 = std::min(rows, end * kRowQuantum);
        gemm_f(w->data + r0 * row_bytes, row_bytes, r1 - r0, x, cols, num_tokens, y + r0, rows);
        return;
      }
      case Path::kBf16: {
        const int64_t r0 = begin * kRowQuantum, r1 = std::min(rows, end * kRowQuantum);
        gemm_b(w->data + r0 * row_bytes, row_bytes, r1 - r0, xb, cols, num_tokens, y + r0, rows);
        return;
      }
      case Path::kDequantRows: {
        // No kernel reads this type directly: dequantize each row once per call (SIMD where the
        // ISA has a dequantizer) and multiply it as an f32 row with every token.
        thread_local std::vector<float> row;  // [cols]
        row.resize(cols);
        for (int64_t r = begin; r < end; ++r) {
          deq(w->data + r * row_bytes, row.data(), cols);
          gemm_f(reinterpret_cast<const uint8_t*>(row.data()), cols * 4, 1, x, cols, num_tokens, y + r, rows);
        }
        return;
      }
    }
  }
};

// One product, with the activations already converted for its kind (qa for the int8 and 16-bit
// kinds, xb for bf16).
ProductWork WorkOf(const KernelTable& kt, const MatMulOutput& o, const float* x, const QuantizedActs* qa,
                   const uint16_t* xb, int64_t num_tokens) {
  const TypeSlot slot = SlotOf(o.w->type);
  const int64_t rows = o.w->NumRows();
  const bool packed_here = PackedHere(kt, o);
  // A matrix whose original was released after packing (Model::PackWeights with the file)
  // has only its packed copy.
  CHECK((packed_here || o.w->data != nullptr) && "matrix released after packing for another ISA");
  ProductWork pw{ProductWork::Path::kFloat, o.w, o.packed, nullptr, nullptr, nullptr, nullptr, x, qa, xb,
                 num_tokens, o.y};
  const int64_t num_quanta = (rows + ProductWork::kRowQuantum - 1) / ProductWork::kRowQuantum;
  const int64_t num_groups = (rows + kPackedRowGroup - 1) / kPackedRowGroup;
  switch (KindOf(kt, slot, packed_here)) {
    case ActKind::kA16:
      pw.path = ProductWork::Path::kPacked;
      pw.gemm_q = kt.gemm_packed_a16[slot];
      pw.items = num_groups;
      return pw;
    case ActKind::kInt8:
      if (packed_here && kt.gemm_packed[slot] != nullptr) {
        pw.path = ProductWork::Path::kPacked;
        pw.gemm_q = kt.gemm_packed[slot];
        pw.items = num_groups;
      } else {
        pw.path = ProductWork::Path::kQuant;
        pw.gemm_q = kt.gemm_quant[slot];
        pw.items = num_quanta;
      }
      return pw;
    case ActKind::kBf16:
      pw.path = ProductWork::Path::kBf16;
      pw.gemm_b = kt.gemm_bf16[slot];
      pw.items = num_quanta;
      return pw;
    case ActKind::kFloat:
      break;
  }
  if (kt.gemm_float[slot] == nullptr) {
    pw.path = ProductWork::Path::kDequantRows;
    pw.deq = kt.dequantize_row[slot];
    pw.gemm_f = kt.gemm_float[kSlotF32];
    pw.items = rows;
  } else {
    pw.gemm_f = kt.gemm_float[slot];
    pw.items = num_quanta;
  }
  return pw;
}

// Activations of a row range: the same layout from row r0 on.
QuantizedActs RowsOf(const QuantizedActs& qa, int64_t r0) {
  QuantizedActs r = qa;
  const int64_t nb = qa.k_stride / 32;
  r.qs += r0 * qa.k_stride;
  r.d += r0 * nb;
  r.qsum += r0 * nb;
  if (r.lo != nullptr) r.lo += r0 * qa.k_stride;
  if (r.half_sums != nullptr) r.half_sums += r0 * 2 * nb;
  return r;
}

// MatMulGrouped (MatMulSameInput: every product over all rows), with x the input before an
// RmsNorm when norm is set (quantized kinds only).
void MatMulGroupedImpl(std::span<const GroupedProduct> products, const float* x, int64_t total_rows, ThreadPool& pool,
                       const RmsNormInput* norm) {
  const KernelTable& kt = Active();
  std::optional<QuantizedActs> acts[3];  // by ActKind (int8, 16-bit), quantized on first need
  const uint16_t* acts_bf16 = nullptr;
  std::vector<ProductWork> work;
  work.reserve(products.size());
  std::vector<QuantizedActs> row_acts;  // each product's rows of its kind's activations
  row_acts.reserve(products.size());
  int64_t total = 0;
  double total_ns = 0;
  // The int8 kernels of the K-quants with 16-weight sub-blocks (Q6_K, Q3_K, Q2_K; packed or not)
  // also read each activation block's half sums; only they.
  bool half_sums = false;
  for (const GroupedProduct& p : products) {
    const MatMulOutput& o = p.out;
    half_sums = half_sums || ((o.w->type == GgmlType::kQ6_K || o.w->type == GgmlType::kQ3_K ||
                               o.w->type == GgmlType::kQ2_K) &&
                              KindOf(kt, o) == ActKind::kInt8);
  }
  for (const GroupedProduct& p : products) {
    const MatMulOutput& o = p.out;
    CHECK(p.row_begin >= 0 && p.num_rows >= 0 && p.row_begin + p.num_rows <= total_rows);
    const ActKind kind = KindOf(kt, o);
    const int64_t cols = o.w->shape[0];
    if (kind == ActKind::kBf16) {
      CHECK(norm == nullptr);
      if (acts_bf16 == nullptr) acts_bf16 = ActivationsBf16(kt, x, total_rows, cols, pool);
      const int64_t k_stride = (cols + kBf16ActPad - 1) / kBf16ActPad * kBf16ActPad;
      work.push_back(WorkOf(kt, o, x + p.row_begin * cols, nullptr, acts_bf16 + p.row_begin * k_stride, p.num_rows));
    } else {
      std::optional<QuantizedActs>& qa = acts[static_cast<int>(kind)];
      CHECK(norm == nullptr || kind != ActKind::kFloat);
      if (kind != ActKind::kFloat && !qa) {
        qa = QuantizeForGemm(x, total_rows, cols, kind == ActKind::kA16, half_sums, pool, norm);
      }
      CHECK(!qa || qa->k == cols);
      const QuantizedActs* rows = nullptr;
      if (qa) {
        row_acts.push_back(RowsOf(*qa, p.row_begin));
        rows = &row_acts.back();
      }
      work.push_back(WorkOf(kt, o, x + p.row_begin * cols, rows, nullptr, p.num_rows));
    }
    if (p.num_rows == 0) work.back().items = 0;
    total += work.back().items;
    total_ns += work.back().EstimatedNs();
  }
  // All products in one parallel pass over their concatenated items: one hand-off to the pool
  // instead of one per product (small K/V projections alone leave the threads waiting), and on
  // as many threads as the work is worth.
  pool.ParallelFor(
      total,
      [&](int64_t begin, int64_t end) {
        int64_t base = 0;
        for (const ProductWork& pw : work) {
          const int64_t b = std::max(begin, base), e = std::min(end, base + pw.items);
          if (b < e) pw.Run(b - base, e - base);
          base += pw.items;
          if (base >= end) break;
        }
      },
      ThreadPool::MinItemsForWork(total, total_ns));
}

void MatMulSameInputImpl(std::span<const MatMulOutput> outs, const float* x, int64_t num_tokens, ThreadPool& pool,
                         const RmsNormInput* norm) {
  GroupedProduct products[8];
  std::vector<GroupedProduct> many;
  GroupedProduct* p = products;
  if (outs.size() > std::size(products)) {
    many.resize(outs.size());
    p = many.data();
  }
  for (size_t i = 0; i < outs.size(); ++i) p[i] = GroupedProduct{outs[i], 0, num_tokens};
  MatMulGroupedImpl(std::span<const GroupedProduct>(p, outs.size()), x, num_tokens, pool, norm);
}

}  // namespace

void MatMulSameInput(std::span<const MatMulOutput> outs, const float* x, int64_t num_tokens, ThreadPool& pool) {
  MatMulSameInputImpl(outs, x, num_tokens, pool, nullptr);
}

void MatMulGrouped(std::span<const GroupedProduct> products, const float* x, int64_t total_rows, ThreadPool& pool) {
  MatMulGroupedImpl(products, x, total_rows, pool, nullptr);
}

void MatMul(const TensorView& w, const float* x, int64_t num_tokens, float* y, ThreadPool& pool) {
  MatMul(w, nullptr, x, num_tokens, y, pool);
}

void MatMul(const TensorView& w, const PackedWeights* packed, const float* x, int64_t num_tokens, float* y,
            ThreadPool& pool) {
  const MatMulOutput o{&w, packed, y};
  MatMulSameInput(std::span<const MatMulOutput>(&o, 1), x, num_tokens, pool);
}

bool ReadQuantizedActivations(std::span<const MatMulOutput> outs) {
  const KernelTable& kt = Active();
  for (const MatMulOutput& o : outs) {
    const ActKind kind = KindOf(kt, o);
    if (kind != ActKind::kInt8 && kind != ActKind::kA16) return false;
  }
  return !outs.empty();
}

void MatMulSameInputNormed(std::span<const MatMulOutput> outs, const RmsNormInput& in, int64_t num_tokens,
                           ThreadPool& pool) {
  CHECK(ReadQuantizedActivations(outs));
  MatMulSameInputImpl(outs, in.x, num_tokens, pool, &in);
}

void GetRows(const TensorView& w, const int32_t* ids, int64_t num_ids, float* out) {
  const int64_t cols = w.shape[0];
  const DequantizeRowFn deq = Active().dequantize_row[SlotOf(w.type)];
  for (int64_t i = 0; i < num_ids; ++i) deq(w.Row(ids[i]), out + i * cols, cols);
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  Active().rms_norm(x, w, n, eps, out);
}

void LayerNorm(const float* x, const float* w, const float* b, int64_t n, float eps, float* out) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  double sum2 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] - mean;
    out[i] = v;
    sum2 += static_cast<double>(v * v);
  }
  const float variance = static_cast<float>(sum2 / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(variance + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] * scale * w[i] + (b != nullptr ? b[i] : 0.0f);
}

void GeluTanh(float* x, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f, kCoef = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * v * (1.0f + kCoef * v * v)));
  }
}

void SiluMul(float* gate, const float* up, int64_t n) { Active().silu_mul(gate, up, n); }
void GeluTanhMul(float* gate, const float* up, int64_t n) { Active().gelu_mul(gate, up, n); }
void Softmax(float* x, int64_t n) { Active().softmax(x, n); }
void Axpy(float a, const float* x, float* y, int64_t n) { Active().axpy(a, x, y, n); }
void DeltaRule(float* m, int64_t s, const DeltaRuleTokens& t) { Active().delta_rule(m, s, t); }

void RopeAngles(int rope_dims, int64_t pos, float freq_base, float freq_scale, float* cos_sin,
                const float* freq_factors) {
  const float p = static_cast<float>(pos) * freq_scale;
  for (int i = 0; i < rope_dims; i += 2) {
    // Same expression as llama2.c's run.c so the reference logits match to the last bits.
    const float freq = 1.0f / std::pow(freq_base, static_cast<float>(i) / static_cast<float>(rope_dims));
    const float val = freq_factors == nullptr ? p * freq : p * freq / freq_factors[i / 2];
    cos_sin[i] = std::cos(val);
    cos_sin[i + 1] = std::sin(val);
  }
}

void RopeAnglesYarn(int rope_dims, int64_t pos, float freq_base, float freq_scale, float ext_factor, float corr_low,
                    float corr_high, float* cos_sin, const float* freq_factors) {
  const float p = static_cast<float>(pos);
  for (int i = 0; i < rope_dims; i += 2) {
    const float freq = 1.0f / std::pow(freq_base, static_cast<float>(i) / static_cast<float>(rope_dims));
    const float extrap = freq_factors == nullptr ? p * freq : p * freq / freq_factors[i / 2];
    const float interp = freq_scale * extrap;
    const float y = (static_cast<float>(i / 2) - corr_low) / std::max(0.001f, corr_high - corr_low);
    const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * ext_factor;
    const float val = interp * (1.0f - mix) + extrap * mix;
    cos_sin[i] = std::cos(val);
    cos_sin[i + 1] = std::sin(val);
  }
}

void RopeApply(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin) {
  Active().rope_apply(x, num_heads, head_dim, rope_dims, cos_sin);
}
void RopeApplyNeox(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin) {
  Active().rope_apply_neox(x, num_heads, head_dim, rope_dims, cos_sin);
}

const char* KvTypeName(KvType type) {
  switch (type) {
    case KvType::kF32: return "f32";
    case KvType::kF16: return "f16";
    case KvType::kBF16: return "bf16";
    case KvType::kInt8: return "int8";
    case KvType::kInt4: return "int4";
  }
  return "?";
}

void StoreKvHead(const float* x, int64_t head_dim, KvType type, uint8_t* dst) {
  switch (type) {
    case KvType::kF32:
      std::memcpy(dst, x, static_cast<size_t>(head_dim) * sizeof(float));
      return;
    case KvType::kF16:
      Active().to_f16(x, reinterpret_cast<uint16_t*>(dst), head_dim);
      return;
    case KvType::kBF16:
      Active().to_bf16(x, reinterpret_cast<uint16_t*>(dst), head_dim);
      return;
    case KvType::kInt8:
    case KvType::kInt4: {
      const int qmax = type == KvType::kInt8 ? 127 : 7;
      float amax = 0.0f;
      for (int64_t i = 0; i < head_dim; ++i) amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
      // The scale as stored (f16, capped at its largest finite value) is the one quantized with.
      const uint16_t s16 = Fp32ToFp16(std::min(amax / static_cast<float>(qmax), 65504.0f));
      std::memcpy(dst, &s16, 2);
      const float scale = Fp16ToFp32(s16);
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      auto q = [&](float v) {
        const int r = static_cast<int>(std::nearbyint(v * inv));
        return r < -qmax ? -qmax : r > qmax ? qmax : r;
      };
      uint8_t* d = dst + 2;
      if (type == KvType::kInt8) {
        for (int64_t i = 0; i < head_dim; ++i) d[i] = static_cast<uint8_t>(static_cast<int8_t>(q(x[i])));
      } else {
        for (int64_t i = 0; i < head_dim; i += 2) {
          d[i / 2] = static_cast<uint8_t>((q(x[i]) + 8) | ((q(x[i + 1]) + 8) << 4));
        }
      }
      return;
    }
  }
}

void LoadKvHead(const uint8_t* src, int64_t head_dim, KvType type, float* out) {
  switch (type) {
    case KvType::kF32:
      std::memcpy(out, src, static_cast<size_t>(head_dim) * sizeof(float));
      return;
    case KvType::kF16:
    case KvType::kBF16:
      for (int64_t i = 0; i < head_dim; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = type == KvType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
      }
      return;
    case KvType::kInt8:
    case KvType::kInt4: {
      uint16_t s16;
      std::memcpy(&s16, src, 2);
      const float scale = Fp16ToFp32(s16);
      const uint8_t* d = src + 2;
      for (int64_t i = 0; i < head_dim; ++i) {
        const int v = type == KvType::kInt8 ? static_cast<int8_t>(d[i]) : ((d[i / 2] >> (4 * (i & 1))) & 0xF) - 8;
        out[i] = scale * static_cast<float>(v);
      }
      return;
    }
  }
}

std::optional<KvType> ParseKvType(std::string_view name) {
  if (name == "f32") return KvType::kF32;
  if (name == "f16") return KvType::kF16;
  if (name == "bf16") return KvType::kBF16;
  if (name == "int8") return KvType::kInt8;
  if (name == "int4") return KvType::kInt4;
  return std::nullopt;
}

void Attention(const float* q, int64_t num_tokens, const int32_t* positions, const int32_t* const* block_tables,
               const KvLayer& kv, int num_heads, int num_kv_heads, int head_dim, float* out, ThreadPool& pool,
               float* const* scores, int64_t window, const float* sinks, float softcap, int v_head_dim) {
  CHECK(window == 0 || scores == nullptr);  // tracked scores are per slot from 0
  const int v_head = v_head_dim > 0 ? v_head_dim : head_dim;
  const KernelTable& kt = Active();
  // A sliding window: a token whose window starts past slot 0 reads through a table of its own,
  // the window's slots as blocks of one, so every kernel attends exactly [begin, slot] without
  // knowing of windows (and the token's result depends on nothing else in the batch). Such a
  // token is a run of its own below (its table pointer is unique).
  // NOTE: the lambda below runs on pool threads; these are the caller's buffers, hence references.
  thread_local std::vector<int32_t> caller_window_slots;
  thread_local std::vector<const int32_t*> caller_tables;
  thread_local std::vector<int64_t> caller_begins;
  std::vector<int32_t>& window_slots = caller_window_slots;
  std::vector<const int32_t*>& tables = caller_tables;
  std::vector<int64_t>& begins = caller_begins;
  tables.assign(block_tables, block_tables + num_tokens);
  begins.assign(num_tokens, 0);
  if (window > 0) {
    size_t total = 0;
    for (int64_t t = 0; t < num_tokens; ++t) {
      begins[t] = std::max<int64_t>(0, static_cast<int64_t>(positions[t]) + 1 - window);
      if (begins[t] > 0) total += static_cast<size_t>(positions[t] + 1 - begins[t]);
    }
    window_slots.resize(total);
    size_t at = 0;
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (begins[t] == 0) continue;
      int32_t* own = window_slots.data() + at;
      for (int64_t p = begins[t]; p <= positions[t]; ++p) {
        *own++ = static_cast<int32_t>(block_tables[t][p / kv.block_size] * kv.block_size + p % kv.block_size);
      }
      tables[t] = window_slots.data() + at;
      at += static_cast<size_t>(positions[t] + 1 - begins[t]);
    }
  }
  const int64_t q_stride = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t out_stride = static_cast<int64_t>(num_heads) * v_head;
  const int64_t k_head_bytes = KvHeadBytes(kv.k_type, head_dim), v_head_bytes = KvHeadBytes(kv.v_type, v_head);
  const int group = num_heads / num_kv_heads;
  // A task is a run of consecutive tokens of one sequence and one KV head: its query heads share
  // the K/V rows, which attend_many then reads once per 16 positions for all of them. Where that
  // gives fewer than four queries (decode without grouped-query heads), a task takes a few KV
  // heads of the sequence instead, whose queries the kernel interleaves (kv.query_heads), as long
  // as that leaves at least two tasks per thread (one sequence's 12 heads on two threads: four
  // tasks of three; three tasks of four ran slower than twelve of one).
  const int64_t tokens_per_task = std::max<int64_t>(1, kMaxAttendQueries / group);
  constexpr int kMinTaskQueries = 4;
  struct Task {
    int64_t t_begin, t_end;
    int kv_head, num_kv_heads;
  };
  // NOTE: the lambda below runs on pool threads; it must see the caller's list, not its own
  // thread_local instance, hence the reference.
  thread_local std::vector<Task> caller_tasks;
  std::vector<Task>& tasks = caller_tasks;
  tasks.clear();
  // The runs first, each as a task of one KV head.
  double positions_seen = 0;  // query heads times the positions each attends to
  for (int64_t t = 0; t < num_tokens;) {
    int64_t t_end = t + 1;
    while (t_end < num_tokens && t_end - t < tokens_per_task && tables[t_end] == tables[t]) ++t_end;
    tasks.push_back({t, t_end, 0, 1});
    for (int64_t u = t; u < t_end; ++u) positions_seen += static_cast<double>(num_heads) * (positions[u] + 1 - begins[u]);
    t = t_end;
  }
  const int64_t num_runs = static_cast<int64_t>(tasks.size());
  const int64_t max_heads = std::max<int64_t>(1, num_runs * num_kv_heads / (2 * pool.num_threads()));
  for (int64_t r = 0; r < num_runs; ++r) {
    const Task run = tasks[r];
    const int64_t run_queries = (run.t_end - run.t_begin) * group;
    const int heads = run_queries >= kMinTaskQueries
                          ? 1
                          : static_cast<int>(std::min(max_heads, (kMinTaskQueries + run_queries - 1) / run_queries));
    for (int kvh = 0; kvh < num_kv_heads; kvh += heads) {
      tasks.push_back({run.t_begin, run.t_end, kvh, std::min(heads, num_kv_heads - kvh)});
    }
  }
  tasks.erase(tasks.begin(), tasks.begin() + num_runs);
  // Single-thread cost per query and position, roughly as measured for head_dim 8 and 64
  // (kernels_bench BM_Attention).
  const double total_ns = positions_seen * (1.0 + head_dim / 8.0);
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  pool.ParallelFor(num_tasks, [&](int64_t begin, int64_t end) {
    const float* qs[kMaxAttendQueries];
    float* outs[kMaxAttendQueries];
    float* score_outs[kMaxAttendQueries];
    int64_t lens[kMaxAttendQueries];
    int32_t heads[kMaxAttendQueries];
    float query_sinks[kMaxAttendQueries];
    for (int64_t i = begin; i < end; ++i) {
      const Task& task = tasks[i];
      int nq = 0;
      for (int64_t t = task.t_begin; t < task.t_end; ++t) {
        for (int h = task.kv_head * group; h < (task.kv_head + task.num_kv_heads) * group; ++h) {
          qs[nq] = q + t * q_stride + static_cast<int64_t>(h) * head_dim;
          outs[nq] = out + t * out_stride + static_cast<int64_t>(h) * v_head;
          lens[nq] = static_cast<int64_t>(positions[t]) + 1 - begins[t];
          score_outs[nq] = scores != nullptr && scores[t] != nullptr ? scores[t] + h * lens[nq] : nullptr;
          heads[nq] = h / group - task.kv_head;
          if (sinks != nullptr) query_sinks[nq] = sinks[h];
          ++nq;
        }
      }
      const KvBlockView view{kv.k + task.kv_head * k_head_bytes,
                             kv.v + task.kv_head * v_head_bytes,
                             tables[task.t_begin],
                             begins[task.t_begin] > 0 ? 1 : kv.block_size,
                             num_kv_heads * k_head_bytes,
                             num_kv_heads * v_head_bytes,
                             kv.k_type,
                             kv.v_type,
                             task.num_kv_heads > 1 ? heads : nullptr,
                             k_head_bytes,
                             v_head_bytes};
      if (v_head == head_dim) {
        kt.attend_many(qs, lens, nq, view, head_dim, outs, scores != nullptr ? score_outs : nullptr,
                       sinks != nullptr ? query_sinks : nullptr, softcap);
      } else {
        AttendManyReferenceKv(qs, lens, nq, view, head_dim, v_head, outs, scores != nullptr ? score_outs : nullptr,
                              sinks != nullptr ? query_sinks : nullptr, softcap);
      }
    }
  }, ThreadPool::MinItemsForWork(num_tasks, total_ns));
}

}  // namespace gale::kernels
