// Small helpers both allocators use: the formatting of their warnings' values and the
// arithmetic of sizes and backings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "allocator/host_buffer.h"

namespace umbp {

// "ENOMEM" (the libc's name), "errno <n>" for a value it cannot name.
std::string ErrName(int e);
// mori's "<errno>: <strerror>".
std::string MoriErr(int e);
// "0x7f..."
std::string Hex(const void* p);
// The base page: "4 KiB" (or "<n> B").
std::string BasePages(size_t page);
// A hugepage size: "2048 kB".
std::string HugeKb(size_t hp);

bool IsPowerOfTwo(size_t v);
// size rounded up to a power-of-two alignment; nullopt for another alignment or an overflow.
std::optional<size_t> AlignUp(size_t size, size_t alignment);
// The MAP_HUGE_* / MFD_HUGE_* bits of a power-of-two hugepage size: log2 in bits 26..31. Sizes
// >= 2^32 (16 GiB pages) set the sign bit of the int flags, as the kernel's own MAP_HUGE_16GB
// does, so it is shifted as unsigned.
int HugeSizeBits(size_t hp);
// AnonymousHugetlb -> Anonymous, AnonymousShmHugetlb -> AnonymousShm.
HostBufferBacking Demoted(HostBufferBacking b);

}  // namespace umbp
