// The allocator's warning texts, declared once: product (scenarios and tests match them
// exactly), so each lives here as a template and nowhere else. Fill() puts the values in.
//
// Placeholders: {n} bytes as a decimal, {page} the base page ("4 KiB"), {hp} hugepage_size in
// bytes, {hp_kb} the hugepage size ("2048 kB"), {e} errno name ("ENOMEM"), {err} mori's
// "<errno>: <strerror>", {addr} "0x7f...", {b} a backing name, {to} the backing fallen back
// to, {fd}, {node}, {list} /sys/devices/system/node/possible as read, {k} registrations,
// {what} an exception's what(), {counters} the hugepage counters of the requested size
// (kCounters*), {meminfo} mori's three /proc/meminfo lines.
//
// Once-only warnings are once per allocator process state (every HostMemAllocator on one
// Kernel) and reason; the reason keys are built next to the warning, in alloc_run.cpp.
#pragma once

#include <initializer_list>
#include <string>

namespace umbp::texts {

// ---- umbp-sim (policy mori_texts = false) --------------------------------------------------
// Alloc's arguments.
inline constexpr char kNoKernel[] = "Alloc: no kernel; returning an invalid handle";
inline constexpr char kUnknownBacking[] = "Alloc: unknown backing {v}; returning an invalid handle";
inline constexpr char kSizeZero[] =
    "Alloc(size=0): nothing to allocate; returning an invalid handle";
inline constexpr char kRoundingOverflows[] =
    "Alloc(size={n}): rounding up to {pages} pages overflows; returning an invalid handle";
inline constexpr char kInternalError[] =
    "Alloc: internal error ({what}); returning an invalid handle";
// Once per (fallback backing, hugepage_size).
inline constexpr char kHugepageSizeNotPowerOfTwo[] =
    "hugepage_size {hp} is not a power of two; falling back to {page} pages ({to})";
inline constexpr char kHugepageSizeNotAboveBasePage[] =
    "hugepage_size {hp} cannot be encoded in MAP_HUGE_* (not larger than the {page} base page); "
    "falling back to {page} pages ({to})";
// A hugetlb step failed, once per (backing, step, size, errno); {counters} below.
inline constexpr char kHugetlbMemfdFailed[] =
    "hugetlb memfd_create ({hp_kb} pages) failed: {e}; {counters}; falling back to {page} pages "
    "({to})";
inline constexpr char kHugetlbFtruncateFailed[] =
    "hugetlb ftruncate of the memfd to {n} bytes ({hp_kb} pages) failed: {e}; {counters}; "
    "falling back to {page} pages ({to})";
inline constexpr char kHugetlbMmapFailed[] =
    "hugetlb mmap of {n} bytes ({hp_kb} pages) failed: {e}; {counters}; falling back to {page} "
    "pages ({to})";
inline constexpr char kHugetlbPopulateEfault[] =
    "MADV_POPULATE_WRITE of {n} bytes ({hp_kb} pages) failed: EFAULT (no free hugepage on the "
    "allowed nodes); {counters}; unmapped, falling back to {page} pages ({to})";
// {counters}: sysfs of the size, or /proc/meminfo when it is the default size.
inline constexpr char kCounters[] = "HugePages of {kb} kB: free {f}, total {t}, reserved {r}";
inline constexpr char kCountersNotConfigured[] =
    "HugePages of {kb} kB: not configured on this kernel";
inline constexpr char kCountersUnavailable[] = "HugePages of {kb} kB: counters unavailable";
// Base-page steps, every time.
inline constexpr char kMmapFailed[] =
    "mmap of {n} bytes ({b}, {page} pages) failed: {e}; returning an invalid handle";
inline constexpr char kMemfdFailed[] =
    "memfd_create(umbp_host_buffer) failed: {e}; returning an invalid handle";
inline constexpr char kFtruncateFailed[] =
    "ftruncate of the memfd to {n} bytes failed: {e}; returning an invalid handle";
inline constexpr char kPopulateFailed[] =
    "MADV_POPULATE_WRITE of {n} bytes ({b}, {pages} pages) failed: {e}; unmapped, returning an "
    "invalid handle";
inline constexpr char kTouchFailed[] =
    "prefault touch of {n} bytes failed: {e}; buffer left unpopulated";
// Once.
inline constexpr char kPopulateEinval[] =
    "madvise(MADV_POPULATE_WRITE) is not supported by this kernel (EINVAL; needs Linux 5.14); "
    "prefaulting by touching one byte per page";
// NUMA, once per reason.
inline constexpr char kPossibleUnreadable[] =
    "numa_node {node} requested but /sys/devices/system/node/possible cannot be read ({e}); "
    "buffer not bound";
inline constexpr char kPossibleUnparsable[] =
    "numa_node {node} requested but /sys/devices/system/node/possible cannot be parsed "
    "('{list}'); buffer not bound";
inline constexpr char kNodeNotPossible[] =
    "numa_node {node} is not a possible NUMA node (possible: {list}); buffer not bound";
inline constexpr char kMbindFailed[] =
    "mbind(MPOL_BIND, node {node}) of {n} bytes failed: {e}; buffer not bound to node {node}";
// Cleanup.
inline constexpr char kCleanupMunmapFailed[] =
    "munmap({addr}, {n}) while cleaning up a failed Alloc failed: {e}";
inline constexpr char kCloseFailed[] = "close({fd}) of the memfd of {addr} failed: {e}";
inline constexpr char kStepCloseFailed[] =
    "close({fd}) of a memfd after a failed Alloc step failed: {e}";
// Free and the shm registry (also under mori-624002c: kFreeNotOwned).
inline constexpr char kFreeNotOwned[] =
    "Free of {addr}, which no allocator on this kernel owns (freed through a copy of its handle, "
    "or allocated on another kernel); nothing unmapped, handle unchanged";
inline constexpr char kFreeDeferred[] =
    "Free of {b} buffer {addr} ({n} bytes) while {k} registration(s) hold it; munmap and close "
    "deferred to the last ReleaseShmAllocation";
inline constexpr char kFreeMunmapThrew[] =
    "Free of {addr}: internal error in munmap ({what}); nothing released, the handle stays valid";
inline constexpr char kFreeMunmapFailed[] =
    "munmap({addr}, {n}) failed: {e}; handle invalidated anyway so a later Free cannot unmap a "
    "reused address";
inline constexpr char kReleaseUnknown[] =
    "ReleaseShmAllocation({addr}): no shm allocation is based there; ignored";
inline constexpr char kReleaseUnmatched[] =
    "ReleaseShmAllocation({addr}) without a matching AcquireShmAllocation; ignored";
inline constexpr char kDeferredMunmapFailed[] =
    "deferred munmap({addr}, {n}) at the last ReleaseShmAllocation failed: {e}";

// ---- mori-624002c (policy mori_texts = true): mori's MORI_UMBP_WARN lines ------------------
// mori prints nothing for size 0, rounding overflow, a failed anonymous mmap, an unknown backing
// or a failed close. Once for every hugetlb fallback of the process together:
inline constexpr char kMoriHugetlbFallback[] =
    "HostMemAllocator: MAP_HUGETLB allocation failed for size={n} hugepage_size={hp} ({err}); "
    "falling back to anonymous pages. {meminfo}";
// Once (mbind ENOSYS).
inline constexpr char kMoriNumaUnavailable[] =
    "HostMemAllocator: NUMA binding unavailable on this build; ignoring numa_node";
// Every time.
inline constexpr char kMoriInvalidHugepageSize[] =
    "HostMemAllocator: invalid hugepage_size={hp}; falling back to anonymous pages";
inline constexpr char kMoriInvalidHugepageSizeShm[] =
    "HostMemAllocator: invalid hugepage_size={hp}; falling back to AnonymousShm (4 KiB pages)";
inline constexpr char kMoriMemfdFailed[] = "HostMemAllocator: memfd_create failed ({err})";
inline constexpr char kMoriFtruncateFailed[] =
    "HostMemAllocator: ftruncate({what}, {n}) failed ({err})";
inline constexpr char kMoriMmapFailed[] = "HostMemAllocator: mmap(memfd, {n}) failed ({err})";
inline constexpr char kMoriMbindFailed[] = "HostMemAllocator: mbind(node={node}) failed ({err})";
inline constexpr char kMoriPopulateFailed[] =
    "HostMemAllocator: madvise(MADV_POPULATE_WRITE) failed ({err}); falling back to manual page "
    "touching";
inline constexpr char kMoriFreeDeferred[] =
    "HostMemAllocator: freeing AnonymousShm buffer ptr={addr} while {k} active registration(s) "
    "still reference it; deferring munmap/close until deregistration";
inline constexpr char kMoriMunmapFailed[] =
    "HostMemAllocator: munmap failed ({err}); invalidating handle anyway to prevent a possible "
    "double-free of a reused VA range";
inline constexpr char kMoriDeferredMunmapFailed[] =
    "HostMemAllocator: deferred munmap failed ({err})";

// One "{key}" and its value. Holds a pointer: the value (often a temporary) lives until the end
// of the Fill call's full expression, and the list needs no per-element cleanup.
struct Value {
  Value(const char* k, const std::string& v) : key(k), value(&v) {}
  const char* key;
  const std::string* value;
};
using Values = std::initializer_list<Value>;

// The template with every "{name}" replaced by its value.
std::string Fill(const char* text, Values values);

}  // namespace umbp::texts
