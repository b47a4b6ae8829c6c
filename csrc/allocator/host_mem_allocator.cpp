// What both allocators share of the API: the shm registry's queries and the tables' records.
#include "allocator/host_mem_allocator.h"

#include <limits>
#include <map>
#include <mutex>

namespace umbp {

HostMemAllocator::HostMemAllocator(KernelPtr kernel, LogSink sink)
    : support_(std::move(kernel), std::move(sink)) {}

HostMemAllocator::~HostMemAllocator() = default;

namespace {
// mori 496-512: the record whose [base, base + size) holds [ptr, ptr + size), not pending free.
template <typename Map>
typename Map::iterator FindContaining(Map& shm, uintptr_t ptr, size_t size) {
  if (ptr == 0 || size == 0) return shm.end();
  if (ptr > std::numeric_limits<uintptr_t>::max() - (size - 1)) return shm.end();
  auto it = shm.upper_bound(reinterpret_cast<void*>(ptr));
  if (it == shm.begin()) return shm.end();
  --it;
  const uintptr_t base = reinterpret_cast<uintptr_t>(it->first);
  const uintptr_t end = base + it->second.mapped_size;
  if (ptr < base || ptr + size > end || it->second.fd < 0 || it->second.pending_free) {
    return shm.end();
  }
  return it;
}
}  // namespace

std::optional<HostMemAllocator::ShmAllocation> HostMemAllocator::LookupShmAllocation(uintptr_t ptr,
                                                                                     size_t size) {
  if (!support_.ready()) return std::nullopt;
  ProcessTables& t = support_.tables();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = FindContaining(t.shm, ptr, size);
  if (it == t.shm.end()) return std::nullopt;
  return ShmAllocation{it->first, it->second.mapped_size, it->second.fd};
}

std::optional<HostMemAllocator::ShmAllocation> HostMemAllocator::AcquireShmAllocation(uintptr_t ptr,
                                                                                      size_t size) {
  if (!support_.ready()) return std::nullopt;
  ProcessTables& t = support_.tables();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = FindContaining(t.shm, ptr, size);
  if (it == t.shm.end()) return std::nullopt;
  ++it->second.active_registrations;
  return ShmAllocation{it->first, it->second.mapped_size, it->second.fd};
}

HostMemAllocator::Released HostMemAllocator::DropRegistration(uintptr_t base) {
  Released out;
  ProcessTables& t = support_.tables();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.shm.find(reinterpret_cast<void*>(base));
  if (it == t.shm.end()) {
    out.status = Released::kUnknown;
  } else if (it->second.active_registrations == 0) {
    out.status = Released::kUnmatched;
  } else if (--it->second.active_registrations == 0 && it->second.pending_free) {
    out.ptr = it->first;
    out.len = it->second.mapped_size;
    out.fd = it->second.fd;
    t.shm.erase(it);
  }
  return out;
}

namespace {
// The records of one of the tables, by address, copied under its lock; none without tables. A
// copy that runs out of memory throws (an empty answer would hide what is held).
template <typename T>
std::vector<T> Records(const AllocatorSupport& s, std::map<void*, T> ProcessTables::*table) {
  std::vector<T> out;
  if (!s.ready()) return out;
  ProcessTables& t = s.tables();
  std::lock_guard<std::mutex> lock(t.mu);
  for (const auto& kv : t.*table) out.push_back(kv.second);
  return out;
}
}  // namespace

std::vector<LiveBuffer> HostMemAllocator::LiveBuffers() const {
  return Records(support_, &ProcessTables::live);
}

std::vector<ShmRegistryEntry> HostMemAllocator::ShmRegistry() const {
  return Records(support_, &ProcessTables::shm);
}

}  // namespace umbp
