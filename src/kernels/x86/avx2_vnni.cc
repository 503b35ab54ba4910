// AVX2 kernels for CPUs with AVX-VNNI (vpdpbusd on 256-bit vectors without AVX-512: Intel since
// Alder Lake, AMD Zen 5): the int8-activation GEMMs of avx2_int8.h with the one-instruction dot.
// Built with -mavxvnni on top of the AVX2 flags, so nothing here may run unless CPUID reports
// AVX-VNNI: Avx2Table() fills these slots only then.
#include "kernels/isa_tables.h"
#include "kernels/x86/avx2_int8.h"

namespace gale::kernels {

void Avx2FillVnni(KernelTable& t) {
  using enum GgmlType;
  t.gemm_quant[kSlotQ8_0] = GemmQuant<kQ8_0, true>;
  t.gemm_quant[kSlotQ4_0] = GemmQuant<kQ4_0, true>;
  t.gemm_quant[kSlotQ4_1] = GemmQuant<kQ4_1, true>;
  t.gemm_quant[kSlotQ5_0] = GemmQuant<kQ5_0, true>;
  t.gemm_quant[kSlotQ5_1] = GemmQuant<kQ5_1, true>;
  t.gemm_quant[kSlotW4A8G64] = GemmQuant<kW4A8G64, true>;
  t.gemm_quant[kSlotW4A8G128] = GemmQuant<kW4A8G128, true>;
  t.gemm_quant[kSlotQ4_K] = GemmQuantK<kQ4_K, true>;
  t.gemm_quant[kSlotQ5_K] = GemmQuantK<kQ5_K, true>;
  t.gemm_quant[kSlotQ6_K] = GemmQuantK<kQ6_K, true>;
  t.gemm_quant[kSlotQ3_K] = GemmQuantK<kQ3_K, true>;
  t.gemm_quant[kSlotQ2_K] = GemmQuantK<kQ2_K, true>;
  t.gemm_quant[kSlotIQ4_NL] = GemmQuant<kIQ4_NL, true>;
  t.gemm_quant[kSlotIQ4_XS] = GemmQuant<kIQ4_XS, true>;
  t.gemm_quant[kSlotMXFP4] = GemmQuant<kMXFP4, true>;
  t.variant = "avx-vnni";
}

}  // namespace gale::kernels
