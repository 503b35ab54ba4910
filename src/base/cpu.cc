// CPUID-based feature detection (x86-64 only).
#include "base/cpu.h"

#include <cpuid.h>

#include <cstdint>

namespace gale {
namespace {

uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  f.fma = ecx & (1u << 12);
  f.f16c = ecx & (1u << 29);
  const bool osxsave = ecx & (1u << 27);
  if (osxsave) {
    const uint64_t xcr0 = ReadXcr0();
    f.os_avx = (xcr0 & 0x6) == 0x6;
    f.os_avx512 = (xcr0 & 0xe6) == 0xe6;
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    f.avx2 = ebx & (1u << 5);
    f.avx512f = ebx & (1u << 16);
    f.avx512dq = ebx & (1u << 17);
    f.avx512bw = ebx & (1u << 30);
    f.avx512vl = ebx & (1u << 31);
    f.avx512vnni = ecx & (1u << 11);
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    f.avx512bf16 = eax & (1u << 5);
    f.avx_vnni = eax & (1u << 4);
  }
  return f;
}

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&](bool b, const char* name) {
    if (b) s += s.empty() ? name : std::string(" ") + name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avx_vnni, "avx_vnni");
  return s;
}

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

}  // namespace gale
