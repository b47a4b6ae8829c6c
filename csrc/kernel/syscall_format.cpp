#include "kernel/syscall_format.h"

#include <linux/memfd.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "kernel/user_memory.h"

namespace umbp {

namespace {

struct Named {
  long value;
  const char* name;
};

// Kernel UAPI values, spelled out so the decoder does not depend on how new the C library is.
constexpr Named kProt[] = {{0x1, "PROT_READ"},
                           {0x2, "PROT_WRITE"},
                           {0x4, "PROT_EXEC"},
                           {0x8, "PROT_SEM"},
                           {0x01000000, "PROT_GROWSDOWN"},
                           {0x02000000, "PROT_GROWSUP"}};

constexpr Named kMapFlags[] = {{0x10, "MAP_FIXED"},
                               {0x20, "MAP_ANONYMOUS"},
                               {0x100, "MAP_GROWSDOWN"},
                               {0x800, "MAP_DENYWRITE"},
                               {0x1000, "MAP_EXECUTABLE"},
                               {0x2000, "MAP_LOCKED"},
                               {0x4000, "MAP_NORESERVE"},
                               {0x8000, "MAP_POPULATE"},
                               {0x10000, "MAP_NONBLOCK"},
                               {0x20000, "MAP_STACK"},
                               {0x40000, "MAP_HUGETLB"},
                               {0x80000, "MAP_SYNC"},
                               {0x100000, "MAP_FIXED_NOREPLACE"}};

constexpr Named kAdvice[] = {
    {0, "MADV_NORMAL"},           {1, "MADV_RANDOM"},         {2, "MADV_SEQUENTIAL"},
    {3, "MADV_WILLNEED"},         {4, "MADV_DONTNEED"},       {8, "MADV_FREE"},
    {9, "MADV_REMOVE"},           {10, "MADV_DONTFORK"},      {11, "MADV_DOFORK"},
    {12, "MADV_MERGEABLE"},       {13, "MADV_UNMERGEABLE"},   {14, "MADV_HUGEPAGE"},
    {15, "MADV_NOHUGEPAGE"},      {16, "MADV_DONTDUMP"},      {17, "MADV_DODUMP"},
    {18, "MADV_WIPEONFORK"},      {19, "MADV_KEEPONFORK"},    {20, "MADV_COLD"},
    {21, "MADV_PAGEOUT"},         {22, "MADV_POPULATE_READ"}, {23, "MADV_POPULATE_WRITE"},
    {24, "MADV_DONTNEED_LOCKED"}, {25, "MADV_COLLAPSE"},      {100, "MADV_HWPOISON"},
    {101, "MADV_SOFT_OFFLINE"}};

constexpr Named kMpolModes[] = {{0, "MPOL_DEFAULT"},
                                {1, "MPOL_PREFERRED"},
                                {2, "MPOL_BIND"},
                                {3, "MPOL_INTERLEAVE"},
                                {4, "MPOL_LOCAL"},
                                {5, "MPOL_PREFERRED_MANY"},
                                {6, "MPOL_WEIGHTED_INTERLEAVE"}};
constexpr Named kMpolModeFlags[] = {{1 << 15, "MPOL_F_STATIC_NODES"},
                                    {1 << 14, "MPOL_F_RELATIVE_NODES"},
                                    {1 << 13, "MPOL_F_NUMA_BALANCING"}};
constexpr Named kMbindFlags[] = {
    {1, "MPOL_MF_STRICT"}, {2, "MPOL_MF_MOVE"}, {4, "MPOL_MF_MOVE_ALL"}};
constexpr Named kMemfdFlags[] = {{0x1, "MFD_CLOEXEC"},
                                 {0x2, "MFD_ALLOW_SEALING"},
                                 {0x4, "MFD_HUGETLB"},
                                 {0x8, "MFD_NOEXEC_SEAL"},
                                 {0x10, "MFD_EXEC"}};

constexpr Named kErrnos[] = {{EPERM, "EPERM"},
                             {ENOENT, "ENOENT"},
                             {ESRCH, "ESRCH"},
                             {EINTR, "EINTR"},
                             {EIO, "EIO"},
                             {ENXIO, "ENXIO"},
                             {E2BIG, "E2BIG"},
                             {EBADF, "EBADF"},
                             {EAGAIN, "EAGAIN"},
                             {ENOMEM, "ENOMEM"},
                             {EACCES, "EACCES"},
                             {EFAULT, "EFAULT"},
                             {EBUSY, "EBUSY"},
                             {EEXIST, "EEXIST"},
                             {ENODEV, "ENODEV"},
                             {ENOTDIR, "ENOTDIR"},
                             {EISDIR, "EISDIR"},
                             {EINVAL, "EINVAL"},
                             {ENFILE, "ENFILE"},
                             {EMFILE, "EMFILE"},
                             {EFBIG, "EFBIG"},
                             {ENOSPC, "ENOSPC"},
                             {ESPIPE, "ESPIPE"},
                             {EROFS, "EROFS"},
                             {ERANGE, "ERANGE"},
                             {ENOSYS, "ENOSYS"},
                             {EOVERFLOW, "EOVERFLOW"},
                             {ENOTSUP, "EOPNOTSUPP"},
                             {EHWPOISON, "EHWPOISON"},
                             {ETIMEDOUT, "ETIMEDOUT"},
                             {ENAMETOOLONG, "ENAMETOOLONG"}};

constexpr Named kSignals[] = {{SIGBUS, "SIGBUS"},
                              {SIGKILL, "SIGKILL"},
                              {SIGSEGV, "SIGSEGV"},
                              {SIGABRT, "SIGABRT"},
                              {SIGTERM, "SIGTERM"}};

// The operations' names: every call's but page_size's (SysOp -1, the first).
constexpr const char* const* kOpNames = sysop_detail::kCallNames + 1;

template <size_t N>
const char* lookup(const Named (&table)[N], long v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return nullptr;
}

std::string hex(unsigned long v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#lx", v);
  return buf;
}

void join(std::string& out, const char* name) {
  if (!out.empty()) out += '|';
  out += name;
}

// Bit flags from `table`, then whatever is left as hex; "0" when nothing is set.
template <size_t N>
std::string bits(const Named (&table)[N], unsigned long v, std::string out = {}) {
  for (const auto& e : table) {
    if ((v & static_cast<unsigned long>(e.value)) == static_cast<unsigned long>(e.value)) {
      join(out, e.name);
      v &= ~static_cast<unsigned long>(e.value);
    }
  }
  if (v) join(out, hex(v).c_str());
  return out.empty() ? "0" : out;
}

// The hugepage size field (bits 26..31 = log2 size), as strace prints it: MAP_HUGE_2MB.
std::string huge_size_name(const char* prefix, unsigned log2) {
  unsigned long long size = 1ULL << log2;
  char buf[48];
  if (size >= (1ULL << 30) && size % (1ULL << 30) == 0)
    std::snprintf(buf, sizeof buf, "%s_HUGE_%lluGB", prefix, size >> 30);
  else if (size >= (1ULL << 20) && size % (1ULL << 20) == 0)
    std::snprintf(buf, sizeof buf, "%s_HUGE_%lluMB", prefix, size >> 20);
  else
    std::snprintf(buf, sizeof buf, "%s_HUGE_%lluKB", prefix, size >> 10);
  return buf;
}

constexpr unsigned kHugeShift = 26;
constexpr unsigned kHugeMask = 0x3f;

}  // namespace

const char* sysop_name(SysOp op) {
  int i = static_cast<int>(op);
  return i >= 0 && i < kSysOpCount ? kOpNames[i] : "?";
}

int sysop_from_name(const std::string& name) {
  for (int i = 0; i < kSysOpCount; ++i)
    if (name == kOpNames[i]) return i;
  return -1;
}

namespace call_args {
namespace {
SyscallArgs at(SysOp op, void* addr = nullptr, size_t length = 0) {
  SyscallArgs a;
  a.op = op;
  a.addr = reinterpret_cast<uintptr_t>(addr);
  a.length = length;
  return a;
}
}  // namespace

SyscallArgs mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  SyscallArgs a = at(SysOp::mmap, addr, length);
  a.prot = prot;
  a.flags = flags;
  a.fd = fd;
  a.offset = offset;
  return a;
}

SyscallArgs munmap(void* addr, size_t length) { return at(SysOp::munmap, addr, length); }

SyscallArgs madvise(void* addr, size_t length, int advice) {
  SyscallArgs a = at(SysOp::madvise, addr, length);
  a.advice = advice;
  return a;
}

SyscallArgs mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                  unsigned long maxnode, unsigned flags) {
  SyscallArgs a = at(SysOp::mbind, addr, length);
  a.mode = mode;
  bool readable = true;
  a.nodes = mask_nodes(nodemask, maxnode, &readable);
  a.null_mask = nodemask == nullptr;
  a.mask_unreadable = !readable;
  a.mask_addr = reinterpret_cast<uintptr_t>(nodemask);
  a.maxnode = maxnode;
  a.flags = static_cast<int>(flags);
  return a;
}

SyscallArgs memfd_create(const char* name, unsigned flags) {
  SyscallArgs a = at(SysOp::memfd_create);
  a.text = name ? name : "";
  a.flags = static_cast<int>(flags);
  return a;
}

SyscallArgs ftruncate(int fd, off_t length) {
  SyscallArgs a = at(SysOp::ftruncate, nullptr, static_cast<size_t>(length));
  a.fd = fd;
  return a;
}

SyscallArgs close(int fd) {
  SyscallArgs a = at(SysOp::close);
  a.fd = fd;
  return a;
}

SyscallArgs read_file(const std::string& path) {
  SyscallArgs a = at(SysOp::read_file);
  a.text = path;
  return a;
}

SyscallArgs touch(void* addr, size_t length, size_t stride) {
  SyscallArgs a = at(SysOp::touch, addr, length);
  a.stride = stride;
  return a;
}
}  // namespace call_args

std::vector<unsigned> mask_nodes(const unsigned long* mask, unsigned long maxnode, bool* readable) {
  std::vector<unsigned> nodes;
  if (readable) *readable = true;
  if (!mask || maxnode < 2) return nodes;
  constexpr unsigned long kBits = sizeof(unsigned long) * CHAR_BIT;
  const unsigned long n = maxnode - 1;  // the kernel reads maxnode-1 bits
  if (n > kMaxMaskBits) return nodes;   // no kernel reads it: EINVAL before get_nodes reads
  std::vector<unsigned long> words((n + kBits - 1) / kBits);
  if (!read_user_memory(mask, words.data(), words.size() * sizeof(unsigned long))) {
    if (readable) *readable = false;
    return nodes;
  }
  for (unsigned long i = 0; i < n; ++i)
    if (words[i / kBits] & (1UL << (i % kBits))) nodes.push_back(static_cast<unsigned>(i));
  return nodes;
}

std::string format_prot(int prot) {
  if (prot == 0) return "PROT_NONE";
  return bits(kProt, static_cast<unsigned>(prot));
}

std::string format_mmap_flags(int flags) {
  unsigned long v = static_cast<unsigned>(flags);
  std::string out;
  switch (v & 0x0f) {
    case 0x01:
      out = "MAP_SHARED";
      break;
    case 0x02:
      out = "MAP_PRIVATE";
      break;
    case 0x03:
      out = "MAP_SHARED_VALIDATE";
      break;
    case 0:
      break;
    default:
      out = hex(v & 0x0f);
  }
  v &= ~0x0fUL;
  unsigned huge = (v >> kHugeShift) & kHugeMask;
  v &= ~(static_cast<unsigned long>(kHugeMask) << kHugeShift);
  std::string rest = bits(kMapFlags, v, out);
  if (huge) {
    if (rest == "0") rest.clear();
    join(rest, huge_size_name("MAP", huge).c_str());
  }
  return rest;
}

std::string format_madvise_advice(int advice) {
  const char* n = lookup(kAdvice, advice);
  return n ? n : std::to_string(advice);
}

std::string format_mpol_mode(int mode) {
  unsigned long flags = static_cast<unsigned>(mode) & ((1u << 15) | (1u << 14) | (1u << 13));
  int base = mode & ~static_cast<int>(flags);
  const char* n = lookup(kMpolModes, base);
  std::string out = n ? n : std::to_string(base);
  if (flags) out = bits(kMpolModeFlags, flags, out);
  return out;
}

std::string format_mbind_flags(unsigned flags) { return bits(kMbindFlags, flags); }

std::string format_memfd_flags(unsigned flags) {
  unsigned long v = flags;
  unsigned huge = (v >> kHugeShift) & kHugeMask;
  v &= ~(static_cast<unsigned long>(kHugeMask) << kHugeShift);
  std::string out = bits(kMemfdFlags, v);
  if (huge) {
    if (out == "0") out.clear();
    join(out, huge_size_name("MFD", huge).c_str());
  }
  return out;
}

std::string format_nodes(const std::vector<unsigned>& nodes) {
  std::string out = "[";
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(nodes[i]);
  }
  return out + "]";
}

const char* errno_symbol(int e) {
  if (e == 0) return "";
  const char* n = lookup(kErrnos, e);
  return n ? n : "E?";
}

const char* signal_symbol(int sig) {
  const char* n = lookup(kSignals, sig);
  return n ? n : "SIG?";
}

namespace {
template <size_t N>
std::vector<std::pair<std::string, long>> table_values(const Named (&table)[N]) {
  std::vector<std::pair<std::string, long>> out;
  for (const auto& e : table) out.emplace_back(e.name, e.value);
  return out;
}
}  // namespace

std::vector<std::pair<std::string, long>> named_values(const std::string& kind) {
  if (kind == "errno") return table_values(kErrnos);
  if (kind == "signal") return table_values(kSignals);
  if (kind == "prot") return table_values(kProt);
  if (kind == "mmap_flags") {
    auto out = table_values(kMapFlags);
    out.emplace_back("MAP_SHARED", 0x01);
    out.emplace_back("MAP_PRIVATE", 0x02);
    out.emplace_back("MAP_SHARED_VALIDATE", 0x03);
    return out;
  }
  if (kind == "advice") return table_values(kAdvice);
  if (kind == "mpol_mode") return table_values(kMpolModes);
  if (kind == "mpol_mode_flags") return table_values(kMpolModeFlags);
  if (kind == "mbind_flags") return table_values(kMbindFlags);
  if (kind == "memfd_flags") return table_values(kMemfdFlags);
  return {};
}

namespace {

std::string addr_text(uintptr_t a) { return a ? hex(a) : "NULL"; }

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string format_call(const SyscallArgs& a) {
  std::string out = sysop_name(a.op);
  out += '(';
  switch (a.op) {
    case SysOp::mmap:
      out += addr_text(a.addr) + ", " + std::to_string(a.length) + ", " + format_prot(a.prot) +
             ", " + format_mmap_flags(a.flags) + ", " + std::to_string(a.fd) + ", " +
             std::to_string(a.offset);
      break;
    case SysOp::munmap:
      out += addr_text(a.addr) + ", " + std::to_string(a.length);
      break;
    case SysOp::madvise:
      out += addr_text(a.addr) + ", " + std::to_string(a.length) + ", " +
             format_madvise_advice(a.advice);
      break;
    case SysOp::mbind:
      out += addr_text(a.addr) + ", " + std::to_string(a.length) + ", " + format_mpol_mode(a.mode) +
             ", " +
             (a.null_mask         ? "NULL"
              : a.mask_unreadable ? addr_text(a.mask_addr)
                                  : format_nodes(a.nodes)) +
             ", " + std::to_string(a.maxnode) + ", " +
             format_mbind_flags(static_cast<unsigned>(a.flags));
      break;
    case SysOp::memfd_create:
      out += quoted(a.text) + ", " + format_memfd_flags(static_cast<unsigned>(a.flags));
      break;
    case SysOp::ftruncate:
      out += std::to_string(a.fd) + ", " + std::to_string(a.length);
      break;
    case SysOp::close:
      out += std::to_string(a.fd);
      break;
    case SysOp::read_file:
      out += quoted(a.text);
      break;
    case SysOp::touch:
      out += addr_text(a.addr) + ", " + std::to_string(a.length) + ", " + std::to_string(a.stride);
      break;
    case SysOp::page_size:  // not an operation: never traced
      break;
  }
  return out + ')';
}

std::string format_result(const SyscallArgs& a, const SysResult& r, bool injected) {
  const char* tag = injected ? " (injected)" : "";
  if (r.signal) return std::string(" = ? +++ killed by ") + signal_symbol(r.signal) + " +++" + tag;
  if (r.error) {
    std::string out = std::string(" = -1 ") + errno_symbol(r.error);
    if (injected)
      out += " (injected)";
    else
      out += std::string(" (") + std::strerror(r.error) + ")";
    return out;
  }
  if (a.op == SysOp::mmap) return " = " + hex(static_cast<unsigned long>(r.value)) + tag;
  return " = " + std::to_string(r.value) + tag;
}

}  // namespace umbp
