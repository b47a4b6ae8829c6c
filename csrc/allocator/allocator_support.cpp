#include "allocator/allocator_support.h"

#include <sys/mman.h>

#include <atomic>
#include <new>

namespace umbp {

namespace {
// Process-unique allocation serials: a handle of one kernel can never match another's buffer.
uint64_t NextSerial() {
  static std::atomic<uint64_t> serial{0};
  return ++serial;
}

// The live-table entry of h (mapped_size len) and, when `shm`, its registry record with shm_fd;
// mu held. Throws (std::bad_alloc) with the live entry possibly in place: callers decide.
void InsertLocked(ProcessTables& t, const HostBufferHandle& h, size_t len,
                  HostBufferBacking backing, int shm_fd, bool shm) {
  LiveBuffer b;
  b.ptr = h.ptr;
  b.requested_size = h.requested_size;
  b.mapped_size = len;
  b.backing = backing;
  b.alignment = h.actual_alignment;
  b.fd = h.fd;
  b.numa_node = h.numa_node;
  b.serial = h.serial;
  t.live[h.ptr] = b;
  if (!shm) return;
  ShmRegistryEntry e;
  e.base = h.ptr;
  e.mapped_size = len;
  e.fd = shm_fd;
  t.shm[h.ptr] = e;
}
}  // namespace

AllocatorSupport::AllocatorSupport(KernelPtr kernel, LogSink sink)
    : kernel_(std::move(kernel)), sink_(std::move(sink)) {
  if (!kernel_) return;
  try {
    tables_ = kernel_->process_state<ProcessTables>("umbp::HostMemAllocator");
  } catch (...) {
    tables_.reset();  // Alloc then answers with invalid handles
  }
}

void AllocatorSupport::Warn(const texts::Warning& w, texts::Values values) {
  if (!sink_) return;
  try {
    sink_(LogLevel::Warning, w.id, texts::Fill(w, values));
  } catch (...) {
  }
}

void AllocatorSupport::WarnOnce(const std::string& key, const texts::Warning& w,
                                const std::function<std::string()>& text) {
  try {
    {
      std::lock_guard<std::mutex> lock(tables_->once_mu);
      if (!tables_->once.insert(key).second) return;
    }
    const std::string said = text();  // also without a sink: its reads are the process's
    if (sink_) sink_(LogLevel::Warning, w.id, said);
  } catch (...) {
  }
}

HostBufferHandle AllocatorSupport::Record(HostBufferHandle h) {
  std::lock_guard<std::mutex> lock(tables_->mu);
  h.serial = NextSerial();
  h.kernel_id = kernel_->id();
  try {
    InsertLocked(*tables_, h, h.mapped_size, h.actual_backing, h.fd, IsShm(h.actual_backing));
  } catch (...) {
    tables_->live.erase(h.ptr);  // none there when the live insert itself threw
    throw;
  }
  return h;
}

void AllocatorSupport::Restore(const HostBufferHandle& h, size_t len, HostBufferBacking backing,
                               int fd) {
  try {
    std::lock_guard<std::mutex> lock(tables_->mu);
    InsertLocked(*tables_, h, len, backing, fd, IsShm(backing) && fd >= 0);
  } catch (...) {
  }
}

ShmTaken AllocatorSupport::TakeShmRecordLocked(void* ptr) {
  ShmTaken out;
  auto it = tables_->shm.find(ptr);
  if (it == tables_->shm.end()) return out;
  if (it->second.active_registrations > 0) {
    it->second.pending_free = true;
    out.defer = true;
    out.holders = it->second.active_registrations;
  } else {
    out.fd_to_close = it->second.fd;
    tables_->shm.erase(it);
  }
  return out;
}

bool AllocatorSupport::MappedHere(const HostBufferHandle& h) const {
  return h.kernel_id == 0 || h.kernel_id == kernel_->id();
}

void AllocatorSupport::Invalidate(HostBufferHandle& h) {
  h.ptr = nullptr;
  h.requested_size = 0;
  h.mapped_size = 0;
  h.fd = -1;
  h.serial = 0;
}

std::optional<SysResult> AllocatorSupport::CloseOwned(int fd) {
  try {
    return kernel_->close(fd);
  } catch (...) {
    try {
      std::lock_guard<std::mutex> lock(tables_->mu);
      tables_->orphan_fds.push_back(fd);
      tables_->has_orphans.store(true);
    } catch (...) {
    }
    return std::nullopt;
  }
}

void AllocatorSupport::CloseOrphans(const std::function<void(int, const SysResult&)>& failed) {
  if (!tables_->has_orphans.load()) return;  // the common case, without taking the lock
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> lock(tables_->mu);
    fds.swap(tables_->orphan_fds);
    tables_->has_orphans.store(false);
  }
  for (int fd : fds) {
    std::optional<SysResult> c = CloseOwned(fd);
    if (c && !c->killed() && !c->ok()) failed(fd, *c);
  }
}

AllocatorSupport::MaskMemory::MaskMemory(Kernel& k, size_t words)
    : k_(k), bytes_(words * sizeof(unsigned long)) {
  if (bytes_ < (size_t{128} << 10)) {
    small_.assign(words, 0UL);
    data_ = small_.data();
    return;
  }
  CLibraryCallScope libc;  // malloc's own mmap: the fault plan does not see it
  SysResult r =
      k_.mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!r.ok()) throw std::bad_alloc();
  data_ = static_cast<unsigned long*>(r.ptr());
  mapped_ = true;
}

AllocatorSupport::MaskMemory::~MaskMemory() {
  if (!mapped_) return;
  CLibraryCallScope libc;  // free's own munmap: the fault plan does not see it
  k_.munmap(data_, bytes_);
}

}  // namespace umbp
