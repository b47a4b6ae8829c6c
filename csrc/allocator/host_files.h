// What the allocator reads from /proc and /sys (through Kernel::read_file) for its warnings and
// its NUMA check, and how it parses them.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "kernel/kernel.h"

namespace umbp {

// A decimal after optional blanks ("  1024 kB" -> 1024); nullopt if none or it overflows.
std::optional<unsigned long> ParseUlong(const std::string& s);

// "HugePages of <kB> kB: free F, total T, reserved R" for hugepage size `hp` (bytes): sysfs,
// else /proc/meminfo if `hp` is the default size (texts::kCounters*).
std::string HugepageCounters(Kernel& k, size_t hp);

// Is `node` in a "%*pbl" node list ("0", "0-3,5")? nullopt if the text cannot be parsed.
std::optional<bool> NodeListContains(const std::string& text, long node);

// mori's ReadHugepageMeminfoSummary: the three /proc/meminfo lines as read, or "<key>=?".
std::string MoriMeminfoSummary(Kernel& k);

}  // namespace umbp
