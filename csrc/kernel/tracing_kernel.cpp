#include "kernel/tracing_kernel.h"

#include <sys/mman.h>

#include <stdexcept>

#include "kernel/faulty_kernel.h"

namespace umbp {

std::string TraceRecord::text() const {
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

void TracingKernel::record(SyscallArgs&& a, const SysResult& r, bool injected) {
  std::lock_guard<std::mutex> lock(mu_);
  if (r.ok()) {
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
  }
  if (limit_ && records_.size() >= limit_) {
    records_.pop_front();
    ++dropped_;
  }
  records_.push_back(TraceRecord{++seq_, std::move(a), r, injected});
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

SysResult TracingKernel::mmap(void* addr, size_t length, int prot, int flags, int fd,
                              off_t offset) {
  last_result_injected() = false;
  SysResult r = inner_->mmap(addr, length, prot, flags, fd, offset);
  SyscallArgs a;
  a.op = SysOp::Mmap;
  a.addr = reinterpret_cast<uintptr_t>(addr);
  a.length = length;
  a.prot = prot;
  a.flags = flags;
  a.fd = fd;
  a.offset = offset;
  record(std::move(a), r, last_result_injected());
  return r;
}

SysResult TracingKernel::munmap(void* addr, size_t length) {
  last_result_injected() = false;
  SysResult r = inner_->munmap(addr, length);
  SyscallArgs a;
  a.op = SysOp::Munmap;
  a.addr = reinterpret_cast<uintptr_t>(addr);
  a.length = length;
  record(std::move(a), r, last_result_injected());
  return r;
}

SysResult TracingKernel::madvise(void* addr, size_t length, int advice) {
  last_result_injected() = false;
  SysResult r = inner_->madvise(addr, length, advice);
  SyscallArgs a;
  a.op = SysOp::Madvise;
  a.addr = reinterpret_cast<uintptr_t>(addr);
  a.length = length;
  a.advice = advice;
  record(std::move(a), r, last_result_injected());
  return r;
}

SysResult TracingKernel::mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                               unsigned long maxnode, unsigned flags) {
  // Decode the mask first: the callee may not keep it alive, and it must read as passed.
  SyscallArgs a;
  a.op = SysOp::Mbind;
  a.addr = reinterpret_cast<uintptr_t>(addr);
  a.length = length;
  a.mode = mode;
  a.nodes = mask_nodes(nodemask, maxnode);
  a.null_mask = nodemask == nullptr;
  a.maxnode = maxnode;
  a.flags = static_cast<int>(flags);
  last_result_injected() = false;
  SysResult r = inner_->mbind(addr, length, mode, nodemask, maxnode, flags);
  record(std::move(a), r, last_result_injected());
  return r;
}

SysResult TracingKernel::memfd_create(const char* name, unsigned flags) {
  last_result_injected() = false;
  SysResult r = inner_->memfd_create(name, flags);
  SyscallArgs a;
  a.op = SysOp::MemfdCreate;
  a.text = name ? name : "";
  a.flags = static_cast<int>(flags);
  record(std::move(a), r, last_result_injected());
  return r;
}

SysResult TracingKernel::ftruncate(int fd, off_t length) {
  last_result_injected() = false;
  SysResult r = inner_->ftruncate(fd, length);
  SyscallArgs a;
  a.op = SysOp::Ftruncate;
  a.fd = fd;
  a.length = static_cast<size_t>(length);
  record(std::move(a), r, last_result_injected());
  return r;
}

SysResult TracingKernel::close(int fd) {
  last_result_injected() = false;
  SysResult r = inner_->close(fd);
  SyscallArgs a;
  a.op = SysOp::Close;
  a.fd = fd;
  record(std::move(a), r, last_result_injected());
  return r;
}

FileResult TracingKernel::read_file(const std::string& path) {
  last_result_injected() = false;
  FileResult f = inner_->read_file(path);
  SyscallArgs a;
  a.op = SysOp::ReadFile;
  a.text = path;
  SysResult r = f.ok() ? SysResult::Ok(static_cast<long>(f.data.size())) : SysResult::Err(f.error);
  record(std::move(a), r, last_result_injected());
  return f;
}

SysResult TracingKernel::touch(void* addr, size_t length, size_t stride) {
  last_result_injected() = false;
  SysResult r = inner_->touch(addr, length, stride);
  SyscallArgs a;
  a.op = SysOp::Touch;
  a.addr = reinterpret_cast<uintptr_t>(addr);
  a.length = length;
  a.stride = stride;
  record(std::move(a), r, last_result_injected());
  return r;
}

}  // namespace umbp
