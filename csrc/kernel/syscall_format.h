// strace-style decoding of the seam's arguments and results, shared by TracingKernel (its log)
// and FaultyKernel (what fired). Everything here is pure formatting: no kernel state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernel/kernel.h"

namespace umbp {

namespace sysop_detail {
// Every call's name, in the order UMBP_KERNEL_CALLS declares them (page_size first).
constexpr const char* kCallNames[] = {
#define UMBP_SYSOP_CALL_NAME(ret, name, params, args) #name,
    UMBP_KERNEL_CALLS(UMBP_SYSOP_CALL_NAME)
#undef UMBP_SYSOP_CALL_NAME
};
constexpr bool same(const char* a, const char* b) {
  return *a == *b && (*a == '\0' || same(a + 1, b + 1));
}
constexpr int call_index(const char* name) {
  for (int i = 0; i < static_cast<int>(sizeof kCallNames / sizeof *kCallNames); ++i)
    if (same(kCallNames[i], name)) return i;
  return -1;
}
}  // namespace sysop_detail

// The operations of the seam that can be traced or faulted, one per call of the seam's one
// declaration (UMBP_KERNEL_CALLS, kernel/kernel.h) and named as the call is. page_size, the
// first call, is neither traced nor faulted: it is -1, and the operations count from 0.
enum class SysOp : int {
#define UMBP_SYSOP_ENUMERATOR(ret, name, params, args) name = sysop_detail::call_index(#name) - 1,
  UMBP_KERNEL_CALLS(UMBP_SYSOP_ENUMERATOR)
#undef UMBP_SYSOP_ENUMERATOR
};
static_assert(static_cast<int>(SysOp::page_size) == -1,
              "page_size must stay the first call of UMBP_KERNEL_CALLS");
constexpr int kSysOpCount =
    static_cast<int>(sizeof sysop_detail::kCallNames / sizeof *sysop_detail::kCallNames) - 1;

const char* sysop_name(SysOp op);
// -1 for an unknown name.
int sysop_from_name(const std::string& name);

// One call's arguments, whatever the operation (unused fields keep their defaults). Cheap to
// fill: no allocation except for mbind's mask and the memfd name / read_file path.
struct SyscallArgs {
  SysOp op = SysOp::mmap;
  uintptr_t addr = 0;
  size_t length = 0;
  int prot = 0;
  int flags = 0;  // mmap flags, mbind flags, memfd flags
  int fd = -1;
  long offset = 0;  // mmap offset; ftruncate length lives in `length`
  int advice = 0;
  int mode = 0;                  // mbind mode incl. MPOL_F_* mode flags
  std::vector<unsigned> nodes;   // mbind: the set bits among the maxnode-1 the kernel reads
  bool null_mask = false;        // mbind: nodemask == NULL
  bool mask_unreadable = false;  // mbind: the nodemask cannot be read (the call is EFAULT)
  uintptr_t mask_addr = 0;       // mbind: where the nodemask is (shown when unreadable)
  unsigned long maxnode = 0;     // mbind
  size_t stride = 0;             // touch
  std::string text;              // memfd name or read_file path
};

// One call's SyscallArgs, from the call's own arguments: what FaultyKernel's rules match and
// TracingKernel records. mbind's mask is decoded here, before the call, as it was passed.
namespace call_args {
SyscallArgs mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset);
SyscallArgs munmap(void* addr, size_t length);
SyscallArgs madvise(void* addr, size_t length, int advice);
SyscallArgs mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                  unsigned long maxnode, unsigned flags);
SyscallArgs memfd_create(const char* name, unsigned flags);
SyscallArgs ftruncate(int fd, off_t length);
SyscallArgs close(int fd);
SyscallArgs read_file(const std::string& path);
SyscallArgs touch(void* addr, size_t length, size_t stride);
}  // namespace call_args

// The set bits of an mbind mask as the kernel reads it (maxnode-1 bits), read as the kernel
// does (kernel/user_memory.h: never a SIGSEGV): none when it cannot be read (*readable false)
// or when maxnode-1 exceeds kMaxMaskBits (every kernel refuses that with EINVAL unread).
constexpr unsigned long kMaxMaskBits = 65536UL * 8;  // PAGE_SIZE*8 of the largest base page
std::vector<unsigned> mask_nodes(const unsigned long* mask, unsigned long maxnode,
                                 bool* readable = nullptr);

// Symbolic decoders; unknown bits come out as hex (e.g. "PROT_READ|0x80").
std::string format_prot(int prot);
std::string format_mmap_flags(int flags);
std::string format_madvise_advice(int advice);
std::string format_mpol_mode(int mode);
std::string format_mbind_flags(unsigned flags);
std::string format_memfd_flags(unsigned flags);
std::string format_nodes(const std::vector<unsigned>& nodes);  // "[0,3]"
const char* errno_symbol(int e);                               // "ENOMEM", "" for 0, "E?"
const char* signal_symbol(int sig);                            // "SIGBUS"

// The name tables behind the decoders, for parsers (the Python FaultPlan): kind is one of
// "errno", "signal", "prot", "mmap_flags", "advice", "mpol_mode", "mpol_mode_flags",
// "mbind_flags", "memfd_flags". Unknown kind: empty.
std::vector<std::pair<std::string, long>> named_values(const std::string& kind);

// "mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0)": the call part.
std::string format_call(const SyscallArgs& a);
// " = 0x7f.." / " = -1 ENOMEM (injected)" / " = ? +++ killed by SIGBUS +++": the result part.
// For read_file, `result.value` is the byte count on success.
std::string format_result(const SyscallArgs& a, const SysResult& r, bool injected);

}  // namespace umbp
