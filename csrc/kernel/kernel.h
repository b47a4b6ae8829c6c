// The kernel seam: every OS operation the allocator performs goes through Kernel&.
//
// Conventions (Linux's own, made explicit so wrappers cannot clobber errno):
//   - Each call returns a SysResult. On success `error == 0` and `value` holds what the syscall
//     returns (the address for mmap, the fd for memfd_create, 0 otherwise). On failure
//     `value == -1` and `error` is the errno the syscall would set.
//   - A simulated crash (SIGBUS on a hugetlb fault, an OOM kill) is `signal != 0` (killed()):
//     the calling "process" is dead. The allocator must stop issuing calls and return; the
//     kernel that raised the signal records it (kernel/crash_record.h) and the simulated host
//     reports it. LinuxKernel never sets `signal` (a real fault is a real signal).
//   - Errno values and flags are the Linux UAPI ones (<sys/mman.h>, <linux/mempolicy.h>, ...).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace umbp {

struct SysResult {
  long value = 0;
  int error = 0;   // errno, 0 on success
  int signal = 0;  // simulated fatal signal (SIGBUS, SIGKILL), 0 if none

  bool ok() const { return error == 0 && signal == 0; }
  // The calling process died in this call: the caller makes no further call and returns.
  bool killed() const { return signal != 0; }
  static SysResult Ok(long v = 0) { return SysResult{v, 0, 0}; }
  static SysResult Err(int e) { return SysResult{-1, e, 0}; }
  static SysResult Crash(int sig) { return SysResult{-1, 0, sig}; }
  void* ptr() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(value)); }
};

// read_file's answer: the file's bytes, or an errno (ENOENT for a missing file).
struct FileResult {
  std::string data;
  int error = 0;
  bool ok() const { return error == 0; }
};

// Every call of the seam, once: X(return type, name, (parameters), (arguments)). Adding a
// call to the seam is one line here (and its definition in each kernel):
//   page_size     sysconf(_SC_PAGESIZE).
//   mmap, munmap, madvise, memfd_create, ftruncate, close: the syscalls.
//   mbind         mbind(2) as the raw syscall: the kernel reads maxnode-1 bits of nodemask.
//   read_file     whole contents of a /proc or /sys file.
//   touch         write one byte at addr, addr+stride, ... below addr+length: the page faults of
//                 the manual prefault path. A simulated kernel may answer with a crash (signal)
//                 instead of faulting.
#define UMBP_KERNEL_CALLS(X)                                                                    \
  X(size_t, page_size, (), ())                                                                  \
  X(SysResult, mmap, (void* addr, size_t length, int prot, int flags, int fd, off_t offset),    \
    (addr, length, prot, flags, fd, offset))                                                    \
  X(SysResult, munmap, (void* addr, size_t length), (addr, length))                             \
  X(SysResult, madvise, (void* addr, size_t length, int advice), (addr, length, advice))        \
  X(SysResult, mbind,                                                                           \
    (void* addr, size_t length, int mode, const unsigned long* nodemask, unsigned long maxnode, \
     unsigned flags),                                                                           \
    (addr, length, mode, nodemask, maxnode, flags))                                             \
  X(SysResult, memfd_create, (const char* name, unsigned flags), (name, flags))                 \
  X(SysResult, ftruncate, (int fd, off_t length), (fd, length))                                 \
  X(SysResult, close, (int fd), (fd))                                                           \
  X(FileResult, read_file, (const std::string& path), (path))                                   \
  X(SysResult, touch, (void* addr, size_t length, size_t stride), (addr, length, stride))

// In a class deriving from Kernel: the declaration of every call as an override.
#define UMBP_KERNEL_OVERRIDE_ONE(ret, name, params, args) ret name params override;
#define UMBP_KERNEL_OVERRIDES UMBP_KERNEL_CALLS(UMBP_KERNEL_OVERRIDE_ONE)

class Kernel {
 public:
  Kernel() : id_(next_id()) {}
  virtual ~Kernel() = default;
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  // Which "process" this kernel is: unique among every Kernel of this real process, never
  // reused, so a handle can name the kernel it came from.
  uint64_t id() const { return id_; }

  // State that lives exactly as long as this kernel (one simulated process) and is shared by
  // everything built on it: the allocator's table of live buffers and its shm registry (mori's
  // registry is process-wide). Created on first use.
  template <class T>
  std::shared_ptr<T> process_state(const std::string& key) {
    std::lock_guard<std::mutex> lock(state_mu_);
    auto& slot = process_state_[key];
    if (!slot) slot = std::make_shared<T>();
    return std::static_pointer_cast<T>(slot);
  }

  // The calls, declared once by UMBP_KERNEL_CALLS above (what each does is said there).
#define UMBP_KERNEL_PURE_VIRTUAL(ret, name, params, args) virtual ret name params = 0;
  UMBP_KERNEL_CALLS(UMBP_KERNEL_PURE_VIRTUAL)
#undef UMBP_KERNEL_PURE_VIRTUAL

 private:
  static uint64_t next_id() {
    static std::atomic<uint64_t> counter{0};
    return ++counter;
  }

  const uint64_t id_;
  std::mutex state_mu_;
  std::map<std::string, std::shared_ptr<void>> process_state_;
};

// Calls the C library makes on the program's behalf (malloc taking a large block with an mmap
// of its own). On a real build they never reach umbp-sim's interposer (glibc calls its
// internal mmap, not the interposable symbol), so a fault plan, which counts the program's
// calls, does not see them; a model of that program marks them with this scope so its fault
// plan does not either (FaultyKernel passes them through uncounted). The simulated host still
// serves them: its memory and limits are the field host's.
class CLibraryCallScope {
 public:
  CLibraryCallScope() { ++depth_; }
  ~CLibraryCallScope() { --depth_; }
  CLibraryCallScope(const CLibraryCallScope&) = delete;
  CLibraryCallScope& operator=(const CLibraryCallScope&) = delete;
  static bool active() { return depth_ > 0; }

 private:
  inline static thread_local int depth_ = 0;
};

using KernelPtr = std::shared_ptr<Kernel>;

}  // namespace umbp
