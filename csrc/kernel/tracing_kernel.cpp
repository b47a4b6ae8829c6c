#include "kernel/tracing_kernel.h"

#include <sys/mman.h>

#include <cerrno>
#include <stdexcept>

#include "kernel/faulty_kernel.h"

namespace umbp {

std::string TraceRecord::text() const {
  if (threw)
    return format_call(args) + " = ? (threw std::bad_alloc)" + (injected ? " (injected)" : "");
  return format_call(args) + format_result(args, result, injected);
}

TracingKernel::TracingKernel(KernelPtr inner, size_t limit)
    : inner_(std::move(inner)), limit_(limit) {
  if (!inner_) throw std::invalid_argument("TracingKernel: inner kernel is null");
  page_ = inner_->page_size();
  if (page_ == 0) page_ = 4096;
}

std::vector<TraceRecord> TracingKernel::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {records_.begin(), records_.end()};
}

std::string TracingKernel::text() const {
  std::vector<TraceRecord> recs = records();
  std::string out;
  for (const auto& r : recs) {
    out += r.text();
    out += '\n';
  }
  return out;
}

uint64_t TracingKernel::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

uint64_t TracingKernel::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

std::vector<std::pair<uintptr_t, size_t>> TracingKernel::live_mappings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {mappings_.begin(), mappings_.end()};
}

std::vector<int> TracingKernel::open_fds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {fds_.begin(), fds_.end()};
}

void TracingKernel::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  records_.clear();
  dropped_ = 0;
}

void TracingKernel::record(SyscallArgs&& a, const SysResult& r, bool injected, bool threw) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!threw && r.ok()) {
    if (a.op == SysOp::Mmap) {
      uintptr_t start = static_cast<uintptr_t>(r.value);
      size_t len = (a.length + page_ - 1) / page_ * page_;
      unmap_range(start, start + len);  // MAP_FIXED replaces what was there
      mappings_[start] = len;
    } else if (a.op == SysOp::Munmap) {
      size_t len = (a.length + page_ - 1) / page_ * page_;
      unmap_range(a.addr, a.addr + len);
    } else if (a.op == SysOp::MemfdCreate) {
      fds_.insert(static_cast<int>(r.value));
    } else if (a.op == SysOp::Close) {
      fds_.erase(a.fd);
    }
  } else if (!threw && a.op == SysOp::Close && r.signal == 0 && r.error != EBADF) {
    fds_.erase(a.fd);  // Linux releases the descriptor even when close() reports an error
  }
  if (limit_ && records_.size() >= limit_) {
    records_.pop_front();
    ++dropped_;
  }
  records_.push_back(TraceRecord{++seq_, std::move(a), r, injected, threw});
}

void TracingKernel::unmap_range(uintptr_t start, uintptr_t end) {
  if (end <= start || mappings_.empty()) return;
  auto it = mappings_.upper_bound(start);
  if (it != mappings_.begin()) --it;
  while (it != mappings_.end() && it->first < end) {
    uintptr_t ms = it->first, me = it->first + it->second;
    if (me <= start) {
      ++it;
      continue;
    }
    it = mappings_.erase(it);
    if (ms < start) mappings_[ms] = start - ms;  // the part below the hole survives
    if (me > end) {
      mappings_[end] = me - end;  // and the part above it
      break;
    }
  }
}

size_t TracingKernel::page_size() { return inner_->page_size(); }

// Calls `f` and records the call; a call that throws is recorded as such and rethrown.
template <typename F>
SysResult TracingKernel::traced(SyscallArgs&& a, F&& f) {
  last_result_injected() = false;
  SysResult r;
  try {
    r = f();
  } catch (...) {
    record(std::move(a), SysResult::Err(0), last_result_injected(), true);
    throw;
  }
  record(std::move(a), r, last_result_injected(), false);
  return r;
}

namespace {
SyscallArgs args_of(SysOp op, void* addr = nullptr, size_t length = 0) {
  SyscallArgs a;
  a.op = op;
  a.addr = reinterpret_cast<uintptr_t>(addr);
  a.length = length;
  return a;
}
}  // namespace

SysResult TracingKernel::mmap(void* addr, size_t length, int prot, int flags, int fd,
                              off_t offset) {
  SyscallArgs a = args_of(SysOp::Mmap, addr, length);
  a.prot = prot;
  a.flags = flags;
  a.fd = fd;
  a.offset = offset;
  return traced(std::move(a), [&] { return inner_->mmap(addr, length, prot, flags, fd, offset); });
}

SysResult TracingKernel::munmap(void* addr, size_t length) {
  return traced(args_of(SysOp::Munmap, addr, length), [&] { return inner_->munmap(addr, length); });
}

SysResult TracingKernel::madvise(void* addr, size_t length, int advice) {
  SyscallArgs a = args_of(SysOp::Madvise, addr, length);
  a.advice = advice;
  return traced(std::move(a), [&] { return inner_->madvise(addr, length, advice); });
}

SysResult TracingKernel::mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                               unsigned long maxnode, unsigned flags) {
  // Decoded before the call: the mask must read as it was passed.
  SyscallArgs a = args_of(SysOp::Mbind, addr, length);
  a.mode = mode;
  a.nodes = mask_nodes(nodemask, maxnode);
  a.null_mask = nodemask == nullptr;
  a.maxnode = maxnode;
  a.flags = static_cast<int>(flags);
  return traced(std::move(a),
                [&] { return inner_->mbind(addr, length, mode, nodemask, maxnode, flags); });
}

SysResult TracingKernel::memfd_create(const char* name, unsigned flags) {
  SyscallArgs a = args_of(SysOp::MemfdCreate);
  a.text = name ? name : "";
  a.flags = static_cast<int>(flags);
  return traced(std::move(a), [&] { return inner_->memfd_create(name, flags); });
}

SysResult TracingKernel::ftruncate(int fd, off_t length) {
  SyscallArgs a = args_of(SysOp::Ftruncate, nullptr, static_cast<size_t>(length));
  a.fd = fd;
  return traced(std::move(a), [&] { return inner_->ftruncate(fd, length); });
}

SysResult TracingKernel::close(int fd) {
  SyscallArgs a = args_of(SysOp::Close);
  a.fd = fd;
  return traced(std::move(a), [&] { return inner_->close(fd); });
}

FileResult TracingKernel::read_file(const std::string& path) {
  SyscallArgs a = args_of(SysOp::ReadFile);
  a.text = path;
  FileResult f;
  traced(std::move(a), [&] {
    f = inner_->read_file(path);
    return f.ok() ? SysResult::Ok(static_cast<long>(f.data.size())) : SysResult::Err(f.error);
  });
  return f;
}

SysResult TracingKernel::touch(void* addr, size_t length, size_t stride) {
  SyscallArgs a = args_of(SysOp::Touch, addr, length);
  a.stride = stride;
  return traced(std::move(a), [&] { return inner_->touch(addr, length, stride); });
}

}  // namespace umbp
