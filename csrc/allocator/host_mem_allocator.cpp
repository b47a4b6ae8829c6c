// HostMemAllocator on the Kernel seam: the API around one Alloc (alloc_run.cpp), Free and the
// shm registry. See host_mem_allocator.h for the contract, warning_texts.h for what it says.
#include "allocator/host_mem_allocator.h"

#include <exception>
#include <limits>
#include <mutex>

#include "allocator/alloc_run.h"
#include "allocator/allocator_state.h"
#include "allocator/warning_texts.h"

namespace umbp {

using texts::Fill;

std::string BackingName(HostBufferBacking b) {
  switch (b) {
    case HostBufferBacking::Anonymous:
      return "Anonymous";
    case HostBufferBacking::AnonymousHugetlb:
      return "AnonymousHugetlb";
    case HostBufferBacking::AnonymousShm:
      return "AnonymousShm";
    case HostBufferBacking::AnonymousShmHugetlb:
      return "AnonymousShmHugetlb";
  }
  return "Unknown(" + std::to_string(static_cast<int>(b)) + ")";
}

bool IsHugetlb(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousHugetlb || b == HostBufferBacking::AnonymousShmHugetlb;
}

bool IsShm(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousShm || b == HostBufferBacking::AnonymousShmHugetlb;
}

HostMemAllocator::HostMemAllocator(KernelPtr kernel, LogSink sink, const AllocatorPolicy& policy)
    : kernel_(std::move(kernel)), sink_(std::move(sink)), policy_(policy) {
  if (!kernel_) return;
  try {
    state_ = kernel_->process_state<State>("umbp::HostMemAllocator");
  } catch (...) {
    state_.reset();  // Alloc then answers with invalid handles
  }
}

HostMemAllocator::~HostMemAllocator() = default;

void HostMemAllocator::Warn(const std::string& text) {
  if (!sink_) return;
  try {
    sink_(LogLevel::Warning, text);
  } catch (...) {
  }
}

void HostMemAllocator::WarnOnce(const std::string& reason,
                                const std::function<std::string()>& text) {
  try {
    {
      std::lock_guard<std::mutex> lock(state_->once_mu);
      if (!state_->once.insert(reason).second) return;
    }
    Warn(text());
  } catch (...) {
  }
}

HostBufferHandle HostMemAllocator::Alloc(size_t size, HostBufferBacking backing,
                                         size_t hugepage_size, int numa_node, bool prefault) {
  if (!kernel_ || !state_) {
    Warn(texts::kNoKernel);
    return {};
  }
  try {
    CloseOrphans();
  } catch (...) {
  }
  if (policy_.exceptions_escape) {
    return RunAlloc(*this, size, backing, hugepage_size, numa_node, prefault);
  }
  try {
    return RunAlloc(*this, size, backing, hugepage_size, numa_node, prefault);
  } catch (const std::exception& e) {
    // What the failed step held was released while unwinding (HeldOnUnwind).
    Warn(Fill(texts::kInternalError, {{"what", e.what()}}));
  } catch (...) {
    Warn(Fill(texts::kInternalError, {{"what", "unknown exception"}}));
  }
  return {};
}

// Put back what Free took out of the tables (its munmap threw).
void HostMemAllocator::Restore(const HostBufferHandle& h, size_t len, HostBufferBacking backing,
                               int fd) {
  try {
    std::lock_guard<std::mutex> lock(state_->mu);
    LiveBuffer b;
    b.ptr = h.ptr;
    b.requested_size = h.requested_size;
    b.mapped_size = len;
    b.backing = backing;
    b.alignment = h.actual_alignment;
    b.fd = h.fd;
    b.numa_node = h.numa_node;
    b.serial = h.serial;
    state_->live[h.ptr] = b;
    if (IsShm(backing) && fd >= 0) {
      ShmRegistryEntry e;
      e.base = h.ptr;
      e.mapped_size = len;
      e.fd = fd;
      state_->shm[h.ptr] = e;
    }
  } catch (...) {
  }
}

// close() of a memfd this kernel owns; one that throws is kept for CloseOrphans.
// After the munmap of a buffer: a failure is warned (mori's text or umbp-sim's), then the memfd
// (fd >= 0) is closed. A process that died in the munmap does nothing more.
void HostMemAllocator::Unmapped(const SysResult& r, void* ptr, size_t len, int fd,
                                const char* mori_text, const char* text) {
  if (r.killed()) return;
  if (!r.ok()) {
    if (policy_.mori_texts) {
      Warn(Fill(mori_text, {{"err", MoriErr(r.error)}}));
    } else {
      Warn(Fill(text, {{"addr", Hex(ptr)}, {"n", std::to_string(len)}, {"e", ErrName(r.error)}}));
    }
  }
  if (fd >= 0) CloseOwned(fd, ptr);
}

void HostMemAllocator::CloseOwned(int fd, void* ptr) {
  SysResult c;
  try {
    c = kernel_->close(fd);
  } catch (...) {
    try {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->orphan_fds.push_back(fd);
    } catch (...) {
    }
    return;
  }
  if (!c.killed() && !c.ok() && !policy_.mori_texts) {
    Warn(Fill(texts::kCloseFailed,
              {{"fd", std::to_string(fd)}, {"addr", Hex(ptr)}, {"e", ErrName(c.error)}}));
  }
}

void HostMemAllocator::CloseOrphans() {
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    fds.swap(state_->orphan_fds);
  }
  for (int fd : fds) CloseOwned(fd, nullptr);
}

namespace {
void Invalidate(HostBufferHandle& handle) {
  handle.ptr = nullptr;
  handle.requested_size = 0;
  handle.mapped_size = 0;
  handle.fd = -1;
  handle.serial = 0;
}
}  // namespace

void HostMemAllocator::Free(HostBufferHandle& handle) {
  if (!handle.valid() || !kernel_ || !state_) return;
  try {
    CloseOrphans();
    void* ptr = handle.ptr;
    size_t len = handle.mapped_size;
    HostBufferBacking backing = handle.actual_backing;
    bool known = handle.kernel_id == 0 || handle.kernel_id == kernel_->id();
    bool defer = false;
    size_t holders = 0;
    int fd_to_close = -1;
    if (known) {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto it = state_->live.find(handle.ptr);
      const bool live =
          it != state_->live.end() && (handle.serial == 0 || it->second.serial == handle.serial);
      if (policy_.free_trusts_handle) {
        // mori 451-494: the handle's address and size; the registry record at that address.
        if (it != state_->live.end()) state_->live.erase(it);
      } else if (!live) {
        known = false;
      } else {
        len = it->second.mapped_size;
        backing = it->second.backing;
        fd_to_close = it->second.fd;
        state_->live.erase(it);
      }
      if (known && IsShm(backing)) {
        fd_to_close = -1;
        auto sit = state_->shm.find(ptr);
        if (sit != state_->shm.end()) {
          if (sit->second.active_registrations > 0) {
            sit->second.pending_free = true;
            defer = true;
            holders = sit->second.active_registrations;
          } else {
            fd_to_close = sit->second.fd;
            state_->shm.erase(sit);
          }
        }
      }
    }
    if (!known) {
      Warn(Fill(texts::kFreeNotOwned, {{"addr", Hex(handle.ptr)}}));
      return;
    }
    const HostBufferHandle before = handle;
    Invalidate(handle);
    if (defer) {
      Warn(Fill(policy_.mori_texts ? texts::kMoriFreeDeferred : texts::kFreeDeferred,
                {{"b", BackingName(backing)},
                 {"addr", Hex(ptr)},
                 {"n", std::to_string(len)},
                 {"k", std::to_string(holders)}}));
      return;
    }
    SysResult r;
    try {
      r = kernel_->munmap(ptr, len);
    } catch (const std::exception& e) {
      // Nothing was released: the buffer stays owned and the handle valid, so Free can retry.
      handle = before;
      Restore(before, len, backing, fd_to_close);
      Warn(Fill(texts::kFreeMunmapThrew, {{"addr", Hex(ptr)}, {"what", e.what()}}));
      return;
    }
    Unmapped(r, ptr, len, fd_to_close, texts::kMoriMunmapFailed, texts::kFreeMunmapFailed);
  } catch (...) {
    // Only a warning's string building can throw here; the handle state is already settled.
  }
}

namespace {
template <typename Map>
typename Map::iterator FindContaining(Map& shm, uintptr_t ptr, size_t size) {
  if (ptr == 0 || size == 0) return shm.end();
  if (ptr > std::numeric_limits<uintptr_t>::max() - (size - 1)) return shm.end();
  auto it = shm.upper_bound(reinterpret_cast<void*>(ptr));
  if (it == shm.begin()) return shm.end();
  --it;
  const uintptr_t base = reinterpret_cast<uintptr_t>(it->first);
  const uintptr_t end = base + it->second.mapped_size;
  if (ptr < base || ptr + size > end || it->second.fd < 0 || it->second.pending_free) {
    return shm.end();
  }
  return it;
}
}  // namespace

std::optional<HostMemAllocator::ShmAllocation> HostMemAllocator::LookupShmAllocation(uintptr_t ptr,
                                                                                     size_t size) {
  if (!state_) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = FindContaining(state_->shm, ptr, size);
  if (it == state_->shm.end()) return std::nullopt;
  return ShmAllocation{it->first, it->second.mapped_size, it->second.fd};
}

std::optional<HostMemAllocator::ShmAllocation> HostMemAllocator::AcquireShmAllocation(uintptr_t ptr,
                                                                                      size_t size) {
  if (!state_) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = FindContaining(state_->shm, ptr, size);
  if (it == state_->shm.end()) return std::nullopt;
  ++it->second.active_registrations;
  return ShmAllocation{it->first, it->second.mapped_size, it->second.fd};
}

void HostMemAllocator::ReleaseShmAllocation(uintptr_t base) {
  if (!state_) return;
  try {
    void* ptr = nullptr;
    size_t len = 0;
    int fd = -1;
    enum { kOk, kUnknown, kUnmatched } status = kOk;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto it = state_->shm.find(reinterpret_cast<void*>(base));
      if (it == state_->shm.end()) {
        status = kUnknown;
      } else if (it->second.active_registrations == 0) {
        status = kUnmatched;
      } else if (--it->second.active_registrations == 0 && it->second.pending_free) {
        ptr = it->first;
        len = it->second.mapped_size;
        fd = it->second.fd;
        state_->shm.erase(it);
      }
    }
    const std::string where = Hex(reinterpret_cast<void*>(base));
    if (status != kOk && policy_.mori_texts) return;  // mori 554-555: silently ignored
    if (status == kUnknown) {
      Warn(Fill(texts::kReleaseUnknown, {{"addr", where}}));
      return;
    }
    if (status == kUnmatched) {
      Warn(Fill(texts::kReleaseUnmatched, {{"addr", where}}));
      return;
    }
    if (!ptr) return;
    Unmapped(kernel_->munmap(ptr, len), ptr, len, fd, texts::kMoriDeferredMunmapFailed,
             texts::kDeferredMunmapFailed);
  } catch (...) {
  }
}

namespace {
// The records of one of State's tables, by address, copied under its lock; none without a
// state. A copy that runs out of memory throws (an empty answer would hide what is held).
template <typename T>
std::vector<T> Records(const std::shared_ptr<HostMemAllocator::State>& state,
                       std::map<void*, T> HostMemAllocator::State::*table) {
  std::vector<T> out;
  if (!state) return out;
  std::lock_guard<std::mutex> lock(state->mu);
  for (const auto& kv : (*state).*table) out.push_back(kv.second);
  return out;
}
}  // namespace

std::vector<LiveBuffer> HostMemAllocator::LiveBuffers() const {
  return Records(state_, &State::live);
}

std::vector<ShmRegistryEntry> HostMemAllocator::ShmRegistry() const {
  return Records(state_, &State::shm);
}

}  // namespace umbp
