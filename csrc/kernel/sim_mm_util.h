// Small helpers shared by SimKernel's memory-management files (sim_address_space.cpp,
// sim_mmap.cpp, sim_faults.cpp). Internal to csrc/kernel.
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <string>
#include <vector>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace umbp::sim_mm {

inline constexpr int kMadvPopulateRead = 22;
inline constexpr int kMadvPopulateWrite = 23;
inline constexpr int kMapHugeShift = 26;
inline constexpr int kMapHugeMask = 0x3f;

inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

inline std::string kb(uint64_t bytes) { return std::to_string(bytes / 1024) + " kB"; }
inline std::string str(int64_t v) { return std::to_string(v); }
inline int64_t i64(uint64_t v) { return static_cast<int64_t>(v); }

template <typename Nodes>
std::string node_list(const Nodes& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ",") + std::to_string(n);
  return s.empty() ? "none" : s;
}

// madvise advice values this model accepts (6.x), POPULATE gated on version separately.
inline bool known_advice(int a) {
  return (a >= 0 && a <= 4) || (a >= 8 && a <= 25) || (a >= 100 && a <= 103);
}

}  // namespace umbp::sim_mm
