#include "kernel/faulty_kernel.h"

#include <fnmatch.h>

#include <algorithm>
#include <cerrno>
#include <new>
#include <stdexcept>

#include "kernel/crash_record.h"
#include "kernel/memory_lifetimes.h"

namespace umbp {

namespace {

constexpr unsigned kHugeShift = 26;
constexpr unsigned kHugeMask = 0x3f;

// splitmix64: a fixed, well-mixed function of its input, so draws depend only on the inputs.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0,1) from (seed, rule, call).
double draw(uint64_t seed, size_t rule, uint64_t call) {
  uint64_t h = mix(mix(seed) ^ mix(0x5bd1e995ULL + rule) ^ call);
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

bool scheduled(const FaultRule& r, uint64_t call) {
  switch (r.when) {
    case FaultRule::When::Always:
      return true;
    case FaultRule::When::Nth:
      return call == r.a;
    case FaultRule::When::Range:
      return call >= r.a && call <= r.b;
    case FaultRule::When::Every:
      return r.a != 0 && call % r.a == 0;
    case FaultRule::When::First:
      return call <= r.a;
  }
  return false;
}

}  // namespace

bool& last_result_injected() {
  static thread_local bool injected = false;
  return injected;
}

std::string FaultRule::problem() const {
  int i = static_cast<int>(op);
  if (i < 0 || i >= kSysOpCount) return "unknown operation";
  if ((error != 0) + (signal != 0) + (has_content ? 1 : 0) + (throw_bad_alloc ? 1 : 0) != 1)
    return "needs exactly one of an errno, a signal, content or a throw";
  if (error < 0 || signal < 0) return "errno and signal must be positive";
  if (signal && op == SysOp::read_file) return "read_file cannot be answered with a signal";
  if (has_content && op != SysOp::read_file) return "only read_file can be answered with content";
  if ((when == When::Nth || when == When::Every) && a == 0) return "call index must be >= 1";
  if (when == When::Range && (a == 0 || b < a)) return "range must be [a, b] with 1 <= a <= b";
  if (!(probability >= 0.0 && probability <= 1.0)) return "probability must be in [0, 1]";
  if (min_length > max_length) return "min_length > max_length";
  return {};
}

bool FaultRule::matches(const SyscallArgs& c) const {
  if (c.op != op) return false;
  if (c.length < min_length || c.length > max_length) {
    // Length bounds apply to the operations that take one.
    switch (op) {
      case SysOp::mmap:
      case SysOp::munmap:
      case SysOp::madvise:
      case SysOp::mbind:
      case SysOp::ftruncate:
      case SysOp::touch:
        return false;
      default:
        break;
    }
  }
  switch (op) {
    case SysOp::mmap: {
      unsigned f = static_cast<unsigned>(c.flags);
      unsigned plain = f & ~0x0fu & ~(kHugeMask << kHugeShift);
      int type = static_cast<int>(f & 0x0f);
      int huge = static_cast<int>((f >> kHugeShift) & kHugeMask);
      if ((plain & static_cast<unsigned>(flags_has)) != static_cast<unsigned>(flags_has))
        return false;
      if (plain & static_cast<unsigned>(flags_lacks)) return false;
      if (map_type >= 0 && type != map_type) return false;
      if (map_type_not >= 0 && type == map_type_not) return false;
      if (huge_log2 >= 0 && huge != huge_log2) return false;
      if (huge_log2_not >= 0 && huge == huge_log2_not) return false;
      return true;
    }
    case SysOp::madvise:
      return advice < 0 || c.advice == advice;
    case SysOp::mbind: {
      int base = c.mode & ~((1 << 15) | (1 << 14) | (1 << 13));
      if (mode >= 0 && base != mode) return false;
      if (node >= 0 &&
          std::find(c.nodes.begin(), c.nodes.end(), static_cast<unsigned>(node)) == c.nodes.end())
        return false;
      return true;
    }
    case SysOp::memfd_create: {
      unsigned f = static_cast<unsigned>(c.flags);
      unsigned plain = f & ~(kHugeMask << kHugeShift);
      int huge = static_cast<int>((f >> kHugeShift) & kHugeMask);
      if ((plain & memfd_flags_has) != memfd_flags_has) return false;
      if (plain & memfd_flags_lacks) return false;
      if (huge_log2 >= 0 && huge != huge_log2) return false;
      if (huge_log2_not >= 0 && huge == huge_log2_not) return false;
      return true;
    }
    case SysOp::read_file:
      return path.empty() || path == c.text || ::fnmatch(path.c_str(), c.text.c_str(), 0) == 0;
    default:
      return true;
  }
}

FaultyKernel::~FaultyKernel() { note_kernel_gone(id()); }

FaultyKernel::FaultyKernel(KernelPtr inner, std::vector<FaultRule> rules)
    : inner_(std::move(inner)), rules_(std::move(rules)) {
  if (!inner_) throw std::invalid_argument("FaultyKernel: inner kernel is null");
  for (size_t i = 0; i < rules_.size(); ++i) {
    std::string why = rules_[i].problem();
    if (!why.empty()) {
      std::string label = rules_[i].name.empty() ? "" : " (" + rules_[i].name + ")";
      throw std::invalid_argument("fault rule " + std::to_string(i) + label + ": " + why);
    }
    active_[static_cast<int>(rules_[i].op)] = true;
  }
  calls_.assign(rules_.size(), 0);
  fires_.assign(rules_.size(), 0);
  note_wrapper(id(), inner_->id());
}

std::vector<FaultRecord> FaultyKernel::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

uint64_t FaultyKernel::calls(size_t rule) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (rule >= calls_.size())
    throw std::out_of_range("FaultyKernel: no rule " + std::to_string(rule));
  return calls_[rule];
}

uint64_t FaultyKernel::fires(size_t rule) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (rule >= fires_.size())
    throw std::out_of_range("FaultyKernel: no rule " + std::to_string(rule));
  return fires_[rule];
}

void FaultyKernel::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(calls_.begin(), calls_.end(), 0);
  std::fill(fires_.begin(), fires_.end(), 0);
  records_.clear();
}

bool FaultyKernel::inject(SyscallArgs&& a, SysResult& out, std::string* content) {
  if (CLibraryCallScope::active()) return false;  // not the program's call: unseen
  std::lock_guard<std::mutex> lock(mu_);
  size_t winner = rules_.size();
  for (size_t i = 0; i < rules_.size(); ++i) {
    const FaultRule& r = rules_[i];
    if (!r.matches(a)) continue;
    uint64_t call = ++calls_[i];
    if (winner != rules_.size()) continue;  // already answered; keep counting the others
    if (!scheduled(r, call)) continue;
    if (r.max_fires && fires_[i] >= r.max_fires) continue;
    if (r.probability < 1.0 && !(draw(r.seed, i, call) < r.probability)) continue;
    winner = i;
  }
  if (winner == rules_.size()) return false;
  const FaultRule& r = rules_[winner];
  ++fires_[winner];
  if (r.throw_bad_alloc) {
    records_.push_back(FaultRecord{winner, r.name, calls_[winner], std::move(a), 0, 0, true});
    last_result_injected() = true;
    throw std::bad_alloc();
  }
  if (r.has_content) {
    out = SysResult::Ok(static_cast<long>(r.content.size()));
    if (content) *content = r.content;
  } else {
    out = r.signal ? record_crash(r.signal, crash_where(a.op, a.advice)) : SysResult::Err(r.error);
  }
  records_.push_back(
      FaultRecord{winner, r.name, calls_[winner], std::move(a), r.error, r.signal, false});
  last_result_injected() = true;
  return true;
}

size_t FaultyKernel::page_size() { return inner_->page_size(); }

SysResult FaultyKernel::mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  SysResult r;
  if (active(SysOp::mmap) && inject(call_args::mmap(addr, length, prot, flags, fd, offset), r))
    return r;
  return inner_->mmap(addr, length, prot, flags, fd, offset);
}

SysResult FaultyKernel::munmap(void* addr, size_t length) {
  SysResult r;
  if (active(SysOp::munmap) && inject(call_args::munmap(addr, length), r)) return r;
  return inner_->munmap(addr, length);
}

SysResult FaultyKernel::madvise(void* addr, size_t length, int advice) {
  SysResult r;
  if (active(SysOp::madvise) && inject(call_args::madvise(addr, length, advice), r)) return r;
  return inner_->madvise(addr, length, advice);
}

SysResult FaultyKernel::mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                              unsigned long maxnode, unsigned flags) {
  SysResult r;
  if (active(SysOp::mbind) &&
      inject(call_args::mbind(addr, length, mode, nodemask, maxnode, flags), r))
    return r;
  return inner_->mbind(addr, length, mode, nodemask, maxnode, flags);
}

SysResult FaultyKernel::memfd_create(const char* name, unsigned flags) {
  SysResult r;
  if (active(SysOp::memfd_create) && inject(call_args::memfd_create(name, flags), r)) return r;
  return inner_->memfd_create(name, flags);
}

SysResult FaultyKernel::ftruncate(int fd, off_t length) {
  SysResult r;
  if (active(SysOp::ftruncate) && inject(call_args::ftruncate(fd, length), r)) return r;
  return inner_->ftruncate(fd, length);
}

SysResult FaultyKernel::close(int fd) {
  SysResult r;
  if (active(SysOp::close) && inject(call_args::close(fd), r)) {
    // Linux releases the descriptor before it reports a close error (man 2 close), so an
    // injected EIO/EINTR/... still closes it; only EBADF means it was never open.
    if (r.signal == 0 && r.error != 0 && r.error != EBADF) {
      inner_->close(fd);
      last_result_injected() = true;
    }
    return r;
  }
  return inner_->close(fd);
}

FileResult FaultyKernel::read_file(const std::string& path) {
  SysResult r;
  FileResult f;
  if (active(SysOp::read_file) && inject(call_args::read_file(path), r, &f.data)) {
    f.error = r.error;
    return f;
  }
  return inner_->read_file(path);
}

SysResult FaultyKernel::touch(void* addr, size_t length, size_t stride) {
  SysResult r;
  if (active(SysOp::touch) && inject(call_args::touch(addr, length, stride), r)) return r;
  return inner_->touch(addr, length, stride);
}

}  // namespace umbp
