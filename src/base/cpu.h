// CPU feature detection from CPUID/XGETBV, done once. Kernel dispatch reads this at start-up;
// nothing below the dispatch boundary asks the CPU again.
#pragma once

#include <string>

namespace gale {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avx_vnni = false;   // vpdpbusd on 256-bit vectors (VEX), without AVX-512
  bool os_avx = false;     // the OS saves YMM state
  bool os_avx512 = false;  // the OS saves ZMM/opmask state

  bool HasAvx2() const { return os_avx && avx2 && fma && f16c; }
  bool HasAvxVnni() const { return HasAvx2() && avx_vnni; }
  bool HasAvx512() const {
    return HasAvx2() && os_avx512 && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni &&
           avx512bf16;
  }
  std::string ToString() const;
};

const CpuFeatures& GetCpuFeatures();

}  // namespace gale
