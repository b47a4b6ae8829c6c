// The support layer both built-in allocators stand on: the harness mechanics a real process gets
// from its OS and libc, kept out of the allocators' logic.
//
//   - ProcessTables: one simulated process's tables (the live buffers, mori's shm registry, the
//     once-only warnings given, the orphan fds), held by the Kernel it runs on
//     (Kernel::process_state) and shared by every allocator on that kernel, whichever profile,
//     as mori's registry and once flags are process-wide;
//   - the sink: warnings with their ids, and once-only warnings per process and key;
//   - MaskMemory: the memory of mbind's nodemask, routed through the Kernel as glibc's malloc
//     would take it, so a simulated memory limit refuses a large mask as the real one does;
//     as the C library's own calls (CLibraryCallScope), which a fault plan does not count;
//   - orphan fds: a memfd whose close() threw (only the fault injector's throwing kernel does)
//     is closed again at the next Alloc or Free;
//   - the handle's bookkeeping: which kernel mapped it, its serial, its invalidation.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "allocator/host_buffer.h"
#include "allocator/warning_texts.h"
#include "kernel/kernel.h"

namespace umbp {

struct ProcessTables {
  mutable std::mutex mu;
  std::map<void*, LiveBuffer> live;
  std::map<void*, ShmRegistryEntry> shm;
  // memfds whose close() threw during a Free: closed again at the next Alloc or Free.
  std::vector<int> orphan_fds;
  // orphan_fds is not empty (set with mu held): every Alloc and Free looks, without the lock.
  std::atomic<bool> has_orphans{false};
  // Keys of the once-only warnings already given in this process.
  std::mutex once_mu;
  std::set<std::string> once;
};

// What Free finds in the shm registry at a buffer's address (mori 458-475, both allocators):
// deferred while registrations hold it, else the record is erased and its fd is to be closed.
struct ShmTaken {
  bool defer = false;
  size_t holders = 0;
  int fd_to_close = -1;
};

class AllocatorSupport {
 public:
  AllocatorSupport(KernelPtr kernel, LogSink sink);

  // A kernel and its process's tables: without them every call answers "invalid" or nothing.
  bool ready() const { return kernel_ && tables_; }
  Kernel& kernel() const { return *kernel_; }
  const KernelPtr& kernel_ptr() const { return kernel_; }
  ProcessTables& tables() const { return *tables_; }

  void Warn(const texts::Warning& w, texts::Values values = {});
  // Once per process and key; the text is built (and the key used up) only the first time.
  void WarnOnce(const std::string& key, const texts::Warning& w,
                const std::function<std::string()>& text);

  // Records a buffer Alloc returns: a serial, this kernel's id, the live table and, for shm
  // backings, the registry record. Throws (std::bad_alloc) with nothing recorded.
  HostBufferHandle Record(HostBufferHandle h);
  // Puts back what a Free took out of the tables (its munmap threw).
  void Restore(const HostBufferHandle& h, size_t len, HostBufferBacking backing, int fd);
  // The shm registry's record at ptr, as Free takes it; the caller holds tables().mu.
  ShmTaken TakeShmRecordLocked(void* ptr);
  // The handle was mapped on this kernel (or carries no kernel id).
  bool MappedHere(const HostBufferHandle& h) const;
  // ptr, sizes, fd and serial cleared: what Free leaves of a handle.
  static void Invalidate(HostBufferHandle& h);

  // close() of a memfd the process owns; nullopt when it threw (the fd is kept as an orphan).
  std::optional<SysResult> CloseOwned(int fd);
  // Closes the orphans again; `failed` hears of each close that returned an error.
  void CloseOrphans(const std::function<void(int fd, const SysResult&)>& failed);

  // mbind's nodemask of `words` longs. Small masks live on the heap; from glibc's 128 KiB
  // mmap threshold up the memory is mapped through the kernel, and a refused mmap is
  // std::bad_alloc, as malloc's would be. Its mmap and munmap are the C library's: a fault plan
  // does not see them (a real build's fault plan cannot: glibc's malloc calls its internal
  // mmap), so mori's node 2^31-1 meets a plan's nth munmap in Free, as the real build does.
  class MaskMemory {
   public:
    MaskMemory(Kernel& k, size_t words);
    ~MaskMemory();
    MaskMemory(const MaskMemory&) = delete;
    MaskMemory& operator=(const MaskMemory&) = delete;
    unsigned long* data() { return data_; }

   private:
    Kernel& k_;
    size_t bytes_;
    std::vector<unsigned long> small_;
    unsigned long* data_ = nullptr;
    bool mapped_ = false;
  };

 private:
  KernelPtr kernel_;
  LogSink sink_;
  std::shared_ptr<ProcessTables> tables_;
};

}  // namespace umbp
