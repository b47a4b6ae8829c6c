// The allocator's decision points as data. One allocator (host_mem_allocator.cpp), two profiles:
//
//   umbp-sim      mori's allocator plus umbp-sim's fixes (the reference for "what a fixed
//                 allocator would do");
//   mori-624002c  what mori's HostMemAllocator does at ROCm/mori commit 624002c (2026-08-21),
//                 src/umbp/local/host_mem_allocator.cpp, measured in docs/deployed-behaviour.md:
//                 the behaviour of the servers in the field.
//
// Each field names the lines of mori's source it reproduces. `umbp-sim profiles` prints the table.
#pragma once

#include <string>
#include <vector>

namespace umbp {

struct AllocatorPolicy {
  std::string name;

  // What a failed MADV_POPULATE_WRITE leads to.
  //   UnmapThenDemoteOrFail: hugetlb EFAULT unmaps and demotes, EINVAL touches one byte per page,
  //                          any other error unmaps and returns an invalid handle;
  //   TouchByHand:           mori 151-164: warn, then touch every page by hand whatever the
  //                          errno (a SIGBUS on a hugetlb mapping with no page on the node).
  enum class PopulateFailure { UnmapThenDemoteOrFail, TouchByHand } populate_failure;

  // Read /sys/devices/system/node/possible and skip mbind for nodes outside it.
  // mori 167-187: no check, mbind is always called.
  bool check_possible_nodes;

  // maxnode passed to mbind. NodePlusTwo: the kernel reads maxnode-1 bits, so bit `node` is
  // among them. WordBits: mori 178, word_count * 64: node 63 (mod 64) is the dropped last bit.
  enum class Maxnode { NodePlusTwo, WordBits } maxnode;

  // Nodes whose mask would exceed the kernel's limit (maxnode - 1 > 32768 bits) are refused
  // without building a mask. mori 171-175 builds numa_node/64+1 words (256 MiB for 2^31-1)
  // through malloc, which takes large blocks from mmap: a refused mmap is std::bad_alloc
  // escaping Alloc, the mapping leaked.
  bool cap_nodemask;

  // hugepage_size must be larger than the base page (1..4096 demote at once). mori 218-226,
  // 387: only "power of two", so 1 maps the default hugepage size with mapped_size == size and
  // 2..4096 ask the kernel (mmap EINVAL, memfd_create ENODEV) before falling back.
  bool hugepage_size_above_base_page;

  // Free trusts the table of live buffers (a stale copy of a handle is refused) or, mori
  // 451-494, the handle itself: munmap(handle.ptr, handle.mapped_size), and for shm backings
  // the registry record found at handle.ptr (erased, its fd closed) whatever buffer it is.
  bool free_trusts_handle;

  // Warning texts: umbp-sim's (host_mem_allocator.cpp's catalogue) or mori's MORI_UMBP_WARN
  // lines ("HostMemAllocator: ..." with "(errno: strerror)"). mori prints nothing for size 0,
  // rounding overflow, a failed anonymous mmap, an unknown backing or a failed close.
  bool mori_texts;

  // Once-only hugetlb fallback warnings: per (backing, step, size, errno) key, or mori 126-135:
  // one std::once_flag for every hugetlb fallback of the process (both backings, every size and
  // errno), consumed even when the log level drops the line.
  bool one_hugetlb_warning_per_process;

  // Exceptions (std::bad_alloc from the nodemask) escape Alloc, leaving what was mapped
  // (mori: no try/catch). umbp-sim releases every resource and returns an invalid handle.
  bool exceptions_escape;

  // mori 287-296, 370-379: the shm registry record is written before mbind and prefault.
  // umbp-sim registers only a buffer it returns.
  bool register_shm_before_policies;

  // mori 355: the hugetlb memfd is mapped MAP_SHARED|MAP_HUGETLB (umbp-sim: MAP_SHARED; the
  // kernel takes the page size from the file either way). Only the trace differs.
  bool map_hugetlb_on_memfd;
};

const AllocatorPolicy& UmbpSimPolicy();
const AllocatorPolicy& Mori624002cPolicy();
// "umbp-sim", "mori-624002c" or the alias "mori"; nullptr for another name.
const AllocatorPolicy* PolicyByName(const std::string& name);
std::vector<std::string> PolicyNames();

}  // namespace umbp
