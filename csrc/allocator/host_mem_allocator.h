// HostMemAllocator: the UMBP host-buffer allocator, standing on the Kernel seam. Production code:
// every OS call goes through Kernel&, nothing here knows whether the kernel is real, simulated or
// fault-injecting. Its decision points are an AllocatorPolicy (policy.h): the `umbp-sim` profile
// is mori's allocator plus umbp-sim's fixes, `mori-624002c` is mori's allocator as deployed.
//
// Per-kernel state: the table of live buffers, the shm registry and which once-only warnings were
// given belong to the Kernel instance (one "process", Kernel::process_state), shared by every
// HostMemAllocator built on it and kept after the last allocator is gone, as mori's registry
// and once flags are process-wide. Any allocator on the same kernel can free or look up another
// one's buffers.
//
// A kernel call that kills the process (SysResult::killed(), a simulated SIGBUS or OOM kill)
// ends the call: no further kernel call, an invalid handle. Which signal and where is recorded
// by the kernel that raised it, not here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "allocator/policy.h"
#include "kernel/kernel.h"

namespace umbp {

enum class HostBufferBacking : int {
  Anonymous = 0,            // MAP_PRIVATE|MAP_ANONYMOUS, base pages
  AnonymousHugetlb = 1,     // + MAP_HUGETLB and the MAP_HUGE_* size bits
  AnonymousShm = 2,         // memfd + ftruncate + MAP_SHARED; fd kept for hand-off
  AnonymousShmHugetlb = 3,  // memfd with MFD_HUGETLB and the size bits
};

// "Anonymous", "AnonymousHugetlb", ...; "Unknown(<n>)" for values outside the enum.
std::string BackingName(HostBufferBacking backing);
bool IsHugetlb(HostBufferBacking backing);
bool IsShm(HostBufferBacking backing);

struct HostBufferHandle {
  void* ptr = nullptr;
  size_t requested_size = 0;
  size_t mapped_size = 0;  // request rounded up to actual_alignment
  HostBufferBacking actual_backing = HostBufferBacking::Anonymous;
  size_t actual_alignment = 0;  // the page size backing the mapping
  int fd = -1;                  // memfd of Shm backings (owned by the allocator), else -1
  int numa_node = -1;           // node the mapping is bound to (mbind succeeded), else -1
  uint64_t serial = 0;          // which allocation (unique in the real process); tells a stale
                                // copy from the live buffer at a reused address
  uint64_t kernel_id = 0;       // Kernel::id() of the kernel it was mapped on

  bool valid() const { return ptr != nullptr; }
};

enum class LogLevel { Info, Warning };
using LogSink = std::function<void(LogLevel, const std::string&)>;

// One buffer returned by Alloc and not yet freed.
struct LiveBuffer {
  void* ptr = nullptr;
  size_t requested_size = 0;
  size_t mapped_size = 0;
  HostBufferBacking backing = HostBufferBacking::Anonymous;
  size_t alignment = 0;
  int fd = -1;
  int numa_node = -1;
  uint64_t serial = 0;
};

// One shm registry record; pending_free = freed by its owner, unmapped at the last release.
struct ShmRegistryEntry {
  void* base = nullptr;
  size_t mapped_size = 0;
  int fd = -1;
  size_t active_registrations = 0;
  bool pending_free = false;
};

class HostMemAllocator {
 public:
  struct ShmAllocation {
    void* base = nullptr;
    size_t mapped_size = 0;
    int fd = -1;  // owned by the registry: pass it on (SCM_RIGHTS), never close it
  };

  explicit HostMemAllocator(KernelPtr kernel, LogSink sink = {},
                            const AllocatorPolicy& policy = UmbpSimPolicy());
  ~HostMemAllocator();
  HostMemAllocator(const HostMemAllocator&) = delete;
  HostMemAllocator& operator=(const HostMemAllocator&) = delete;

  // Invalid handle on failure; a hugetlb backing that cannot be had is demoted
  // (AnonymousHugetlb -> Anonymous, AnonymousShmHugetlb -> AnonymousShm) with a warning.
  // Never throws under a policy without exceptions_escape: every resource taken by the failed
  // call (mapping, memfd) is released, also when a kernel call throws.
  HostBufferHandle Alloc(size_t size, HostBufferBacking backing = HostBufferBacking::Anonymous,
                         size_t hugepage_size = size_t{2} << 20, int numa_node = -1,
                         bool prefault = true);

  // Idempotent. Invalidates the handle in place (ptr, requested_size, mapped_size zeroed, fd -1)
  // even when munmap fails. A handle of another kernel is left untouched and nothing is unmapped
  // (warning), under every policy. A stale copy of a handle of this kernel is refused the same
  // way unless the policy trusts the handle (mori: it unmaps whatever is there now).
  void Free(HostBufferHandle& handle);

  // mori's registry: the live shm allocation containing [ptr, ptr + size), if any.
  std::optional<ShmAllocation> LookupShmAllocation(uintptr_t ptr, size_t size);
  // Same, and counts one more active registration (Free then defers munmap/close).
  std::optional<ShmAllocation> AcquireShmAllocation(uintptr_t ptr, size_t size);
  // Drops one registration of the allocation based at `base`; the last one after a Free
  // unmaps and closes.
  void ReleaseShmAllocation(uintptr_t base);

  // The allocator's own bookkeeping, shared by every allocator on this kernel, by address: the
  // buffers Alloc returned and Free has not taken back, and the shm registry's records (with
  // their active registrations and deferred frees). What the process holds at the kernel is a
  // kernel wrapper's to say (kernel/leak_ledger.h), not the allocator's.
  std::vector<LiveBuffer> LiveBuffers() const;
  std::vector<ShmRegistryEntry> ShmRegistry() const;

  const KernelPtr& kernel() const { return kernel_; }
  const AllocatorPolicy& policy() const { return policy_; }

  struct State;  // per-kernel tables (defined in the .cpp)

 private:
  void Warn(const std::string& text);
  void WarnOnce(const std::string& reason, const std::function<std::string()>& text);
  void Restore(const HostBufferHandle& h, size_t len, HostBufferBacking backing, int fd);
  void Unmapped(const SysResult& r, void* ptr, size_t len, int fd, const char* mori_text,
                const char* text);
  void CloseOwned(int fd, void* ptr);
  void CloseOrphans();

  KernelPtr kernel_;
  LogSink sink_;
  const AllocatorPolicy& policy_;
  std::shared_ptr<State> state_;
  friend class AllocRun;
};

}  // namespace umbp
