// Pass-through cost of the Kernel seam (issue 8, benchmark 1), built by bench_passthrough.py with
// g++ against csrc/ (no Python in the timed loops).
//
// Variants, timed in interleaved rounds so that drift on a shared machine hits all alike:
//   raw        mmap(4 KiB, PRIVATE|ANONYMOUS) + munmap, straight syscalls
//   raw_pop    the same plus madvise(MADV_POPULATE_WRITE): what Alloc(prefault=true) asks for
//   alloc      UmbpSimAllocator::Alloc(4096, Anonymous, prefault=false) + Free on LinuxKernel
//   alloc_pop  the same with prefault=true
//   wrapped    alloc on TracingKernel(FaultyKernel(LinuxKernel, no rules)), if built with
//              -DUMBP_BENCH_WRAPPERS (the fault-injection kernels exist)
//   sim_pop    alloc_pop on a SimKernel (one 16 GiB node, 512 x 2 MiB pages): the simulated
//              path's rate from C++ (issue 8, benchmark 2)
//
// Output: one JSON object on stdout: {"variant": [ns per alloc+free pair, one per round], ...}.
// Usage: bench_passthrough [iterations per round] [rounds]
#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "allocator/umbp_sim_allocator.h"
#include "kernel/linux_kernel.h"
#include "kernel/sim_kernel.h"
#ifdef UMBP_BENCH_WRAPPERS
#include "kernel/faulty_kernel.h"
#include "kernel/tracing_kernel.h"
#endif

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {

constexpr size_t kSize = 4096;

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

void RawLoop(long n, bool populate) {
  for (long i = 0; i < n; ++i) {
    void* p = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die("mmap");
    if (populate && ::madvise(p, kSize, MADV_POPULATE_WRITE) != 0) Die("madvise");
    if (::munmap(p, kSize) != 0) Die("munmap");
  }
}

void AllocLoop(umbp::HostMemAllocator& a, long n, bool prefault) {
  for (long i = 0; i < n; ++i) {
    umbp::HostBufferHandle h =
        a.Alloc(kSize, umbp::HostBufferBacking::Anonymous, size_t{2} << 20, -1, prefault);
    if (!h.valid()) {
      std::fprintf(stderr, "Alloc(4096) failed\n");
      std::exit(1);
    }
    a.Free(h);
  }
}

double NsPerPair(const std::function<void()>& run, long n) {
  auto t0 = std::chrono::steady_clock::now();
  run();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 20000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  if (n <= 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: %s [iterations>0] [rounds>0]\n", argv[0]);
    return 64;
  }
  std::vector<std::string> warnings;
  umbp::LogSink sink = [&](umbp::LogLevel, const std::string&, const std::string& w) {
    warnings.push_back(w);
  };

  umbp::UmbpSimAllocator plain(std::make_shared<umbp::LinuxKernel>(), sink);
#ifdef UMBP_BENCH_WRAPPERS
  auto faulty = std::make_shared<umbp::FaultyKernel>(std::make_shared<umbp::LinuxKernel>(),
                                                     std::vector<umbp::FaultRule>{});
  // limit 1: the trace keeps one record (a steady state, as a long-running test would be in)
  auto tracing = std::make_shared<umbp::TracingKernel>(faulty, 1);
  umbp::UmbpSimAllocator wrapped(tracing, sink);
#endif

  umbp::SimConfig cfg;
  cfg.hugepage_sizes = {size_t{2} << 20, size_t{1} << 30};
  cfg.default_hugepage_size = size_t{2} << 20;
  umbp::SimNodeConfig node;
  node.mem_total = node.mem_free = uint64_t{16} << 30;
  node.hugepages[size_t{2} << 20] = umbp::SimPoolConfig{512, 512, 0};
  cfg.nodes = {node};
  cfg.possible_nodes = cfg.online_nodes = {0};
  cfg.mem_total = cfg.mem_free = cfg.mem_available = node.mem_total;
  umbp::UmbpSimAllocator simulated(std::make_shared<umbp::SimKernel>(cfg), sink);

  std::vector<std::pair<std::string, std::function<void()>>> variants = {
      {"raw", [&] { RawLoop(n, false); }},
      {"alloc", [&] { AllocLoop(plain, n, false); }},
      {"raw_pop", [&] { RawLoop(n, true); }},
      {"alloc_pop", [&] { AllocLoop(plain, n, true); }},
      {"sim_pop", [&] { AllocLoop(simulated, n, true); }},
#ifdef UMBP_BENCH_WRAPPERS
      {"wrapped", [&] { AllocLoop(wrapped, n, false); }},
#endif
  };
  // Warm-up: page tables, the allocator's first-time reads, CPU frequency.
  for (auto& v : variants) v.second();

  std::map<std::string, std::vector<double>> ns;
  for (int r = 0; r < rounds; ++r) {
    for (auto& v : variants) ns[v.first].push_back(NsPerPair(v.second, n));
  }
  if (!warnings.empty()) {
    std::fprintf(stderr, "allocator warned (%zu): %s\n", warnings.size(), warnings[0].c_str());
    return 1;
  }
  std::printf("{");
  bool first = true;
  for (auto& [name, xs] : ns) {
    std::printf("%s\"%s\": [", first ? "" : ", ", name.c_str());
    for (size_t i = 0; i < xs.size(); ++i) std::printf("%s%.2f", i ? ", " : "", xs[i]);
    std::printf("]");
    first = false;
  }
  std::printf("}\n");
  return 0;
}
