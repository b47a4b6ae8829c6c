// SimKernel: memfd_create, ftruncate, close (docs/kernel-model.md section 5). Simulated fds come
// from a private range (1000000 up) so they never collide with real descriptors.
#include <linux/memfd.h>

#include <cerrno>
#include <cstring>

#include "kernel/crash_record.h"
#include "kernel/sim_kernel.h"

namespace umbp {

namespace {
constexpr unsigned kMfdNoexecSeal = 0x0008U;
constexpr unsigned kMfdExec = 0x0010U;
constexpr unsigned kMfdHugeShift = 26;
constexpr unsigned kMfdHugeMask = 0x3f;
}  // namespace

SysResult SimKernel::memfd_create(const char* name, unsigned flags) {
  return syscall(SysOp::memfd_create, [&] { return do_memfd_create(name, flags); });
}

SysResult SimKernel::do_memfd_create(const char* name, unsigned flags) {
  if (!version_at_least(3, 17))
    return fail(ENOSYS, "memfd_create", ReasonRule::memfd_unsupported,
                "kernel " + cfg_.kernel_release +
                    " is older than 3.17, which added memfd_create: "
                    "ENOSYS");
  if ((flags & MFD_HUGETLB) && !version_at_least(4, 14))
    return fail(EINVAL, "memfd_create", ReasonRule::memfd_hugetlb_unsupported,
                "kernel " + cfg_.kernel_release +
                    " is older than 4.14: memfd_create rejects "
                    "MFD_HUGETLB (EINVAL)");
  unsigned known = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (version_at_least(4, 14)) known |= MFD_HUGETLB;
  if (version_at_least(6, 3)) known |= kMfdNoexecSeal | kMfdExec;
  const unsigned size_bits = flags & (kMfdHugeMask << kMfdHugeShift);
  if (!(flags & MFD_HUGETLB) && size_bits) return SysResult::Err(EINVAL);
  if (flags & ~(known | size_bits)) return SysResult::Err(EINVAL);
  if ((flags & MFD_HUGETLB) && (flags & MFD_ALLOW_SEALING) && !version_at_least(4, 16))
    return SysResult::Err(EINVAL);
  if (!name || std::strlen(name) > 249) return SysResult::Err(EINVAL);
  auto obj = std::make_shared<SimObject>();
  obj->shared = true;
  obj->is_file = true;
  obj->name = name;
  obj->page = cfg_.page_size;
  if (flags & MFD_HUGETLB) {
    if (cfg_.hugepage_sizes.empty())  // CONFIG_HUGETLBFS=n
      return fail(ENOSYS, "memfd_create", ReasonRule::hugepage_size_unknown,
                  "this kernel has no hugepages: memfd_create(MFD_HUGETLB) fails with ENOSYS");
    unsigned log = (flags >> kMfdHugeShift) & kMfdHugeMask;
    uint64_t size = log ? (uint64_t{1} << log) : cfg_.default_hugepage_size;
    SimHState* h = hstate(size);
    if (!h)
      return fail(ENODEV, "memfd_create", ReasonRule::hugepage_size_unknown,
                  "this kernel has no " + std::to_string(size / 1024) +
                      " kB hugepages: memfd_create(MFD_HUGETLB) fails with ENODEV",
                  {{"hugepage_size", static_cast<int64_t>(size)}});
    obj->h = h;
    obj->page = size;
  }
  obj->fd_refs = 1;
  int fd = next_fd_++;
  fds_[fd] = SimFd{obj, (flags & MFD_CLOEXEC) != 0};
  return SysResult::Ok(fd);
}

SysResult SimKernel::ftruncate(int fd, off_t length) {
  return syscall(SysOp::ftruncate, [&] { return do_ftruncate(fd, length); });
}

SysResult SimKernel::do_ftruncate(int fd, off_t length) {
  auto it = fds_.find(fd);
  if (it == fds_.end()) return SysResult::Err(EBADF);
  if (length < 0) return SysResult::Err(EINVAL);
  SimObject& o = *it->second.obj;
  uint64_t len = static_cast<uint64_t>(length);
  if (o.h && len % o.h->size) return SysResult::Err(EINVAL);
  // Shrinking frees the pages and reservations past the new end; growing reserves nothing.
  uint64_t keep = (len + o.page - 1) / o.page;
  if (len < o.i_size) release_object_range(o, keep, UINT64_MAX / 2 - keep);
  o.i_size = len;
  return SysResult::Ok(0);
}

SysResult SimKernel::close(int fd) {
  return syscall(SysOp::close, [&] { return do_close(fd); });
}

SysResult SimKernel::do_close(int fd) {
  auto it = fds_.find(fd);
  if (it == fds_.end()) return SysResult::Err(EBADF);
  SimObjectPtr o = it->second.obj;
  fds_.erase(it);
  o->fd_refs--;
  drop_object_ref(o);
  return SysResult::Ok(0);
}

}  // namespace umbp
