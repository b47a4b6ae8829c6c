// The allocators' warning texts, declared once: product (scenarios and tests match them
// exactly), so each lives here as a template with its stable id and nowhere else. The id travels
// beside the text to the log (Python: the LogRecord's `warning_id`), so explanations select a
// warning by id, never by its prose. Fill() puts the values in.
//
// Two catalogues: umbp-sim's allocator (umbp_sim_allocator.cpp) and mori's MORI_UMBP_WARN lines
// (mori_624002c_allocator.cpp); kNoKernel, kFreeNotOwned and kFreeMunmapThrew are the harness's
// (allocator_support.h) and said under both. Catalogue() lists every entry for the binding.
//
// Placeholders: {n} bytes as a decimal, {page} the base page ("4 KiB"), {hp} hugepage_size in
// bytes, {hp_kb} the hugepage size ("2048 kB"), {e} errno name ("ENOMEM"), {err} mori's
// "<errno>: <strerror>", {addr} "0x7f...", {b} a backing name, {to} the backing fallen back
// to, {fd}, {node}, {list} /sys/devices/system/node/possible as read, {k} registrations,
// {what} an exception's what(), {counters} the hugepage counters of the requested size
// (kCounters*), {meminfo} mori's three /proc/meminfo lines.
//
// Once-only warnings are once per process (every allocator on one Kernel) and key; the keys are
// built next to the warning, in each allocator.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

namespace umbp::texts {

// One warning: its stable id (kebab-case, never reworded) and its text template.
struct Warning {
  const char* id;
  const char* text;
};

// ---- umbp-sim's allocator (and the harness's) ---------------------------------------------
// Alloc's arguments.
inline constexpr Warning kNoKernel{"no-kernel", "Alloc: no kernel; returning an invalid handle"};
inline constexpr Warning kUnknownBacking{"unknown-backing",
                                         "Alloc: unknown backing {v}; returning an invalid handle"};
inline constexpr Warning kSizeZero{
    "size-zero", "Alloc(size=0): nothing to allocate; returning an invalid handle"};
inline constexpr Warning kRoundingOverflows{
    "rounding-overflows",
    "Alloc(size={n}): rounding up to {pages} pages overflows; returning an invalid handle"};
inline constexpr Warning kInternalError{
    "internal-error", "Alloc: internal error ({what}); returning an invalid handle"};
// Once per (fallback backing, hugepage_size).
inline constexpr Warning kHugepageSizeNotPowerOfTwo{
    "hugepage-size-not-power-of-two",
    "hugepage_size {hp} is not a power of two; falling back to {page} pages ({to})"};
inline constexpr Warning kHugepageSizeNotAboveBasePage{
    "hugepage-size-not-above-base-page",
    "hugepage_size {hp} cannot be encoded in MAP_HUGE_* (not larger than the {page} base page); "
    "falling back to {page} pages ({to})"};
// A hugetlb step failed, once per (backing, step, size, errno); {counters} below.
inline constexpr Warning kHugetlbMemfdFailed{
    "hugetlb-fallback-memfd",
    "hugetlb memfd_create ({hp_kb} pages) failed: {e}; {counters}; falling back to {page} pages "
    "({to})"};
inline constexpr Warning kHugetlbFtruncateFailed{
    "hugetlb-fallback-ftruncate",
    "hugetlb ftruncate of the memfd to {n} bytes ({hp_kb} pages) failed: {e}; {counters}; "
    "falling back to {page} pages ({to})"};
inline constexpr Warning kHugetlbMmapFailed{
    "hugetlb-fallback-mmap",
    "hugetlb mmap of {n} bytes ({hp_kb} pages) failed: {e}; {counters}; falling back to {page} "
    "pages ({to})"};
inline constexpr Warning kHugetlbPopulateEfault{
    "hugetlb-fallback-populate",
    "MADV_POPULATE_WRITE of {n} bytes ({hp_kb} pages) failed: EFAULT (no free hugepage on the "
    "allowed nodes); {counters}; unmapped, falling back to {page} pages ({to})"};
// {counters}: sysfs of the size, or /proc/meminfo when it is the default size.
inline constexpr char kCounters[] = "HugePages of {kb} kB: free {f}, total {t}, reserved {r}";
inline constexpr char kCountersNotConfigured[] =
    "HugePages of {kb} kB: not configured on this kernel";
inline constexpr char kCountersUnavailable[] = "HugePages of {kb} kB: counters unavailable";
// Base-page steps, every time.
inline constexpr Warning kMmapFailed{
    "mmap-failed",
    "mmap of {n} bytes ({b}, {page} pages) failed: {e}; returning an invalid handle"};
inline constexpr Warning kMemfdFailed{
    "memfd-failed", "memfd_create(umbp_host_buffer) failed: {e}; returning an invalid handle"};
inline constexpr Warning kFtruncateFailed{
    "ftruncate-failed",
    "ftruncate of the memfd to {n} bytes failed: {e}; returning an invalid handle"};
inline constexpr Warning kPopulateFailed{
    "populate-failed",
    "MADV_POPULATE_WRITE of {n} bytes ({b}, {pages} pages) failed: {e}; unmapped, returning an "
    "invalid handle"};
inline constexpr Warning kTouchFailed{
    "touch-failed", "prefault touch of {n} bytes failed: {e}; buffer left unpopulated"};
// Once.
inline constexpr Warning kPopulateEinval{
    "populate-einval",
    "madvise(MADV_POPULATE_WRITE) is not supported by this kernel (EINVAL; needs Linux 5.14); "
    "prefaulting by touching one byte per page"};
// NUMA, once per reason.
inline constexpr Warning kPossibleUnreadable{
    "numa-possible-unreadable",
    "numa_node {node} requested but /sys/devices/system/node/possible cannot be read ({e}); "
    "buffer not bound"};
inline constexpr Warning kPossibleUnparsable{
    "numa-possible-unparsable",
    "numa_node {node} requested but /sys/devices/system/node/possible cannot be parsed "
    "('{list}'); buffer not bound"};
inline constexpr Warning kNodeNotPossible{
    "numa-node-not-possible",
    "numa_node {node} is not a possible NUMA node (possible: {list}); buffer not bound"};
inline constexpr Warning kMbindFailed{
    "mbind-failed",
    "mbind(MPOL_BIND, node {node}) of {n} bytes failed: {e}; buffer not bound to node {node}"};
// Cleanup.
inline constexpr Warning kCleanupMunmapFailed{
    "cleanup-munmap-failed", "munmap({addr}, {n}) while cleaning up a failed Alloc failed: {e}"};
inline constexpr Warning kCloseFailed{"close-failed",
                                      "close({fd}) of the memfd of {addr} failed: {e}"};
inline constexpr Warning kStepCloseFailed{
    "step-close-failed", "close({fd}) of a memfd after a failed Alloc step failed: {e}"};
// Free and the shm registry (also under mori-624002c: kFreeNotOwned).
inline constexpr Warning kFreeNotOwned{
    "free-not-owned",
    "Free of {addr}, which no allocator on this kernel owns (freed through a copy of its handle, "
    "or allocated on another kernel); nothing unmapped, handle unchanged"};
inline constexpr Warning kFreeDeferred{
    "free-deferred",
    "Free of {b} buffer {addr} ({n} bytes) while {k} registration(s) hold it; munmap and close "
    "deferred to the last ReleaseShmAllocation"};
inline constexpr Warning kFreeMunmapThrew{
    "free-munmap-threw",
    "Free of {addr}: internal error in munmap ({what}); nothing released, the handle stays valid"};
inline constexpr Warning kFreeMunmapFailed{
    "free-munmap-failed",
    "munmap({addr}, {n}) failed: {e}; handle invalidated anyway so a later Free cannot unmap a "
    "reused address"};
inline constexpr Warning kReleaseUnknown{
    "release-unknown", "ReleaseShmAllocation({addr}): no shm allocation is based there; ignored"};
inline constexpr Warning kReleaseUnmatched{
    "release-unmatched",
    "ReleaseShmAllocation({addr}) without a matching AcquireShmAllocation; ignored"};
inline constexpr Warning kDeferredMunmapFailed{
    "deferred-munmap-failed",
    "deferred munmap({addr}, {n}) at the last ReleaseShmAllocation failed: {e}"};

// ---- mori-624002c: mori's MORI_UMBP_WARN lines ----------------------------------------------
// mori prints nothing for size 0, rounding overflow, a failed anonymous mmap, an unknown backing
// or a failed close. Once for every hugetlb fallback of the process together:
inline constexpr Warning kMoriHugetlbFallback{
    "mori-hugetlb-fallback",
    "HostMemAllocator: MAP_HUGETLB allocation failed for size={n} hugepage_size={hp} ({err}); "
    "falling back to anonymous pages. {meminfo}"};
// Once (mbind ENOSYS).
inline constexpr Warning kMoriNumaUnavailable{
    "mori-numa-unavailable",
    "HostMemAllocator: NUMA binding unavailable on this build; ignoring numa_node"};
// Every time.
inline constexpr Warning kMoriInvalidHugepageSize{
    "mori-invalid-hugepage-size",
    "HostMemAllocator: invalid hugepage_size={hp}; falling back to anonymous pages"};
inline constexpr Warning kMoriInvalidHugepageSizeShm{
    "mori-invalid-hugepage-size-shm",
    "HostMemAllocator: invalid hugepage_size={hp}; falling back to AnonymousShm (4 KiB pages)"};
inline constexpr Warning kMoriMemfdFailed{"mori-memfd-failed",
                                          "HostMemAllocator: memfd_create failed ({err})"};
inline constexpr Warning kMoriFtruncateFailed{
    "mori-ftruncate-failed", "HostMemAllocator: ftruncate({what}, {n}) failed ({err})"};
inline constexpr Warning kMoriMmapFailed{"mori-mmap-failed",
                                         "HostMemAllocator: mmap(memfd, {n}) failed ({err})"};
inline constexpr Warning kMoriMbindFailed{"mori-mbind-failed",
                                          "HostMemAllocator: mbind(node={node}) failed ({err})"};
inline constexpr Warning kMoriPopulateFailed{
    "mori-populate-failed",
    "HostMemAllocator: madvise(MADV_POPULATE_WRITE) failed ({err}); falling back to manual page "
    "touching"};
inline constexpr Warning kMoriFreeDeferred{
    "mori-free-deferred",
    "HostMemAllocator: freeing AnonymousShm buffer ptr={addr} while {k} active registration(s) "
    "still reference it; deferring munmap/close until deregistration"};
inline constexpr Warning kMoriMunmapFailed{
    "mori-munmap-failed",
    "HostMemAllocator: munmap failed ({err}); invalidating handle anyway to prevent a possible "
    "double-free of a reused VA range"};
inline constexpr Warning kMoriDeferredMunmapFailed{
    "mori-deferred-munmap-failed", "HostMemAllocator: deferred munmap failed ({err})"};

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
inline std::string Fill(const Warning& w, Values values) { return Fill(w.text, values); }

// Every warning of both catalogues, with the catalogue it belongs to ("umbp-sim" or "mori"):
// what umbp_sim.vocabulary.warning_ids matches an external build's log lines against.
struct CatalogueEntry {
  const char* catalogue;
  const Warning* warning;
};
const std::vector<CatalogueEntry>& Catalogue();

}  // namespace umbp::texts
