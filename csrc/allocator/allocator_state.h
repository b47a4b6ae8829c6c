// Inside the allocator (not its API): the per-process tables every HostMemAllocator on one
// Kernel shares, and the small formatting helpers its warnings use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "allocator/host_mem_allocator.h"

namespace umbp {

struct HostMemAllocator::State {
  mutable std::mutex mu;
  std::map<void*, LiveBuffer> live;
  std::map<void*, ShmRegistryEntry> shm;
  // memfds whose close() threw during a Free: closed again at the next Alloc or Free.
  std::vector<int> orphan_fds;
  // Reasons of the once-only warnings already given in this process (mori: a std::once_flag
  // per warning, process-wide; the process is the Kernel these tables belong to).
  std::mutex once_mu;
  std::set<std::string> once;
};

// "ENOMEM" (the libc's name), "errno <n>" for a value it cannot name.
std::string ErrName(int e);
// mori's "<errno>: <strerror>".
std::string MoriErr(int e);
// "0x7f..."
std::string Hex(const void* p);
// The base page: "4 KiB" (or "<n> B").
std::string BasePages(size_t page);
// A hugepage size: "2048 kB".
std::string HugeKb(size_t hp);

bool IsPowerOfTwo(size_t v);
// size rounded up to a power-of-two alignment; nullopt for another alignment or an overflow.
std::optional<size_t> AlignUp(size_t size, size_t alignment);
int Log2(size_t v);
// AnonymousHugetlb -> Anonymous, AnonymousShmHugetlb -> AnonymousShm.
HostBufferBacking Demoted(HostBufferBacking b);
// Process-unique allocation serials: a handle of one kernel can never match another's buffer.
uint64_t NextSerial();

}  // namespace umbp
