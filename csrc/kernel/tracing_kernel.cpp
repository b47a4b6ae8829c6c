#include "kernel/tracing_kernel.h"

#include <stdexcept>
#include <utility>

#include "kernel/faulty_kernel.h"
#include "kernel/memory_lifetimes.h"

namespace umbp {

std::string TraceRecord::text() const {
  if (threw)
    return format_call(args) + " = ? (threw std::bad_alloc)" + (injected ? " (injected)" : "");
  return format_call(args) + format_result(args, result, injected);
}

namespace {
const KernelPtr& non_null(const KernelPtr& inner) {
  if (!inner) throw std::invalid_argument("TracingKernel: inner kernel is null");
  return inner;
}
}  // namespace

TracingKernel::TracingKernel(KernelPtr inner, size_t limit)
    : inner_(non_null(inner)), limit_(limit), ledger_(inner_->page_size()) {
  note_wrapper(id(), inner_->id());
}

TracingKernel::~TracingKernel() { note_kernel_gone(id()); }

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
  return ledger_.mappings();
}

std::vector<int> TracingKernel::open_fds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.fds();
}

void TracingKernel::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  records_.clear();
  dropped_ = 0;
  sites_.clear();
  site_ids_.clear();
  site_objects_.clear();
  sites_dropped_ = 0;
}

CallSite& pending_call_site() {
  thread_local CallSite site;
  return site;
}

std::vector<std::pair<std::string, uintptr_t>> TracingKernel::call_sites() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sites_;
}

uint64_t TracingKernel::sites_dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sites_dropped_;
}

int32_t TracingKernel::site_index(CallSite site) {
  if (!site.object) return -1;
  size_t obj = 0;
  while (obj < site_objects_.size() && site_objects_[obj] != site.object) ++obj;
  const auto found = site_ids_.find({obj, site.offset});
  if (found != site_ids_.end()) return found->second;
  if (sites_.size() >= kMaxCallSites) {
    ++sites_dropped_;
    return -1;
  }
  if (obj == site_objects_.size()) site_objects_.emplace_back(site.object);
  const auto id = static_cast<int32_t>(sites_.size());
  sites_.emplace_back(site_objects_[obj], site.offset);
  site_ids_.emplace(std::make_pair(obj, site.offset), id);
  return id;
}

void TracingKernel::record(SyscallArgs&& a, const SysResult& r, bool injected, bool threw,
                           CallSite site) {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.observe(a, r, threw);
  if (limit_ && records_.size() >= limit_) {
    records_.pop_front();
    ++dropped_;
  }
  records_.push_back(TraceRecord{++seq_, std::move(a), r, injected, threw, site_index(site)});
}

size_t TracingKernel::page_size() { return inner_->page_size(); }

// Calls `f` and records the call; a call that throws is recorded as such and rethrown.
template <typename F>
SysResult TracingKernel::traced(SyscallArgs&& a, F&& f) {
  last_result_injected() = false;
  const CallSite site = std::exchange(pending_call_site(), CallSite{});  // this call's only
  SysResult r;
  try {
    r = f();
  } catch (...) {
    record(std::move(a), SysResult::Err(0), last_result_injected(), true, site);
    throw;
  }
  record(std::move(a), r, last_result_injected(), false, site);
  return r;
}

SysResult TracingKernel::mmap(void* addr, size_t length, int prot, int flags, int fd,
                              off_t offset) {
  return traced(call_args::mmap(addr, length, prot, flags, fd, offset),
                [&] { return inner_->mmap(addr, length, prot, flags, fd, offset); });
}

SysResult TracingKernel::munmap(void* addr, size_t length) {
  return traced(call_args::munmap(addr, length), [&] { return inner_->munmap(addr, length); });
}

SysResult TracingKernel::madvise(void* addr, size_t length, int advice) {
  return traced(call_args::madvise(addr, length, advice),
                [&] { return inner_->madvise(addr, length, advice); });
}

SysResult TracingKernel::mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                               unsigned long maxnode, unsigned flags) {
  return traced(call_args::mbind(addr, length, mode, nodemask, maxnode, flags),
                [&] { return inner_->mbind(addr, length, mode, nodemask, maxnode, flags); });
}

SysResult TracingKernel::memfd_create(const char* name, unsigned flags) {
  return traced(call_args::memfd_create(name, flags),
                [&] { return inner_->memfd_create(name, flags); });
}

SysResult TracingKernel::ftruncate(int fd, off_t length) {
  return traced(call_args::ftruncate(fd, length), [&] { return inner_->ftruncate(fd, length); });
}

SysResult TracingKernel::close(int fd) {
  return traced(call_args::close(fd), [&] { return inner_->close(fd); });
}

FileResult TracingKernel::read_file(const std::string& path) {
  FileResult f;
  traced(call_args::read_file(path), [&] {
    f = inner_->read_file(path);
    return f.ok() ? SysResult::Ok(static_cast<long>(f.data.size())) : SysResult::Err(f.error);
  });
  return f;
}

SysResult TracingKernel::touch(void* addr, size_t length, size_t stride) {
  return traced(call_args::touch(addr, length, stride),
                [&] { return inner_->touch(addr, length, stride); });
}

}  // namespace umbp
