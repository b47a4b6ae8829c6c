// SimKernel: /proc and /sys rendered from the model, byte-exact in format
// (docs/kernel-model.md section 7). read_file and Python's render_all see the same bytes.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>

#include "kernel/sim_kernel.h"

namespace umbp {

namespace {

// show_val_kb: a 16-column label, the value right-aligned to 8, " kB\n".
void kb_line(std::string& out, const std::string& prefix, const char* label, uint64_t kb) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s%-16s%8" PRIu64 " kB\n", prefix.c_str(), label, kb);
  out += buf;
}

std::string num(long v) { return std::to_string(v) + "\n"; }

// %*pbl: "0,2-3".
std::string node_list(std::vector<int> nodes) {
  std::sort(nodes.begin(), nodes.end());
  std::string s;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(nodes[i]);
    if (j > i) s += "-" + std::to_string(nodes[j]);
    i = j + 1;
  }
  return s + "\n";
}

std::string size_dir(uint64_t size) { return "hugepages-" + std::to_string(size / 1024) + "kB"; }

}  // namespace

std::map<std::string, std::string> SimKernel::render_all() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::string> f;
  render_locked(f, "");
  return f;
}

// Each group of files is rendered only when `only` (a path; empty: every file) lies under it,
// so read_file renders one group, or one node's directory, instead of the whole tree.
void SimKernel::render_locked(std::map<std::string, std::string>& f, const std::string& only) {
  auto wants = [&](const std::string& prefix) {
    return only.empty() || only.compare(0, prefix.size(), prefix) == 0;
  };
  const SimHState* def = nullptr;
  if (cfg_.default_hugepage_size) {
    auto it = hstates_.find(cfg_.default_hugepage_size);
    if (it != hstates_.end()) def = &it->second;
  }

  // /proc/meminfo
  if (wants("/proc/meminfo")) {
    std::string m;
    const uint64_t total = cfg_.mem_total;
    const int64_t free = mem_free_now_locked();
    const int64_t avail = mem_available_now_locked();
    uint64_t cache = 0, slab = 0;
    for (const auto& n : cfg_.nodes) {
      cache += n.page_cache;
      slab += n.slab_reclaimable;
    }
    const uint64_t cache_now = cache - std::min<uint64_t>(cache, reclaimed_cache_);
    const uint64_t slab_now =
        slab - std::min<uint64_t>(slab, static_cast<uint64_t>(reclaimed_ - reclaimed_cache_));
    uint64_t anon = 0;
    for (const auto& [s, v] : vmas_)
      if (!v.hugetlb() && !v.obj->shared)
        anon +=
            v.obj->pages.count(v.pgoff, v.len() / v.obj->page, PageState::Faulted) * v.obj->page;
    kb_line(m, "", "MemTotal:", total / 1024);
    kb_line(m, "", "MemFree:", static_cast<uint64_t>(free) / 1024);
    if (rules::shows_mem_available(cfg_))
      kb_line(m, "", "MemAvailable:", static_cast<uint64_t>(avail) / 1024);
    kb_line(m, "", "Buffers:", 0);
    kb_line(m, "", "Cached:", cache_now / 1024);
    for (const char* l : {"SwapCached:", "Active:"}) kb_line(m, "", l, 0);
    kb_line(m, "", "Inactive:", cache_now / 1024);
    for (const char* l : {"Active(anon):", "Inactive(anon):", "Active(file):"})
      kb_line(m, "", l, 0);
    kb_line(m, "", "Inactive(file):", cache_now / 1024);
    for (const char* l : {"Unevictable:", "Mlocked:"}) kb_line(m, "", l, 0);
    kb_line(m, "", "SwapTotal:", cfg_.swap_total / 1024);
    kb_line(m, "", "SwapFree:", cfg_.swap_total / 1024);
    kb_line(m, "", "Dirty:", 0);
    kb_line(m, "", "Writeback:", 0);
    kb_line(m, "", "AnonPages:", anon / 1024);
    for (const char* l : {"Mapped:", "Shmem:"}) kb_line(m, "", l, 0);
    for (const char* l : {"KReclaimable:", "Slab:", "SReclaimable:"})
      kb_line(m, "", l, slab_now / 1024);
    for (const char* l : {"SUnreclaim:", "KernelStack:", "PageTables:", "NFS_Unstable:", "Bounce:",
                          "WritebackTmp:"})
      kb_line(m, "", l, 0);
    kb_line(m, "", "CommitLimit:", commit_limit_locked() / 1024);
    kb_line(m, "", "Committed_AS:", (cfg_.committed_as + committed_) / 1024);
    kb_line(m, "", "VmallocTotal:", 34359738367ULL);
    kb_line(m, "", "VmallocUsed:", 0);
    kb_line(m, "", "VmallocChunk:", 0);
    kb_line(m, "", "Percpu:", 0);
    for (const char* l : {"AnonHugePages:", "ShmemHugePages:", "ShmemPmdMapped:", "FileHugePages:",
                          "FilePmdMapped:"})
      kb_line(m, "", l, 0);
    if (def) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "HugePages_Total:   %5ld\nHugePages_Free:    %5ld\nHugePages_Rsvd:    %5ld\n"
                    "HugePages_Surp:    %5ld\nHugepagesize:   %8" PRIu64 " kB\n",
                    def->nr(), def->free(), def->resv, def->surp(), def->size / 1024);
      m += buf;
      if (version_at_least(4, 16)) {
        uint64_t all = 0;
        for (const auto& [size, h] : hstates_) all += static_cast<uint64_t>(h.nr()) * size;
        kb_line(m, "", "Hugetlb:", all / 1024);
      }
    }
    f["/proc/meminfo"] = m;
  }

  // /proc/zoneinfo: one Normal zone per node with memory; its "low" line is the node's share
  // (by MemTotal) of the host's low watermarks, in pages: what psutil reads to estimate
  // MemAvailable on a kernel that does not print it.
  {
    std::string z;
    uint64_t total = 0;
    for (const auto& n : cfg_.nodes) total += n.mem_total;
    uint64_t left = cfg_.watermark_low / cfg_.page_size;
    std::vector<int> with = memory_nodes();
    for (size_t i = 0; i < with.size(); ++i) {
      const SimNodeConfig* nc = nullptr;
      for (const auto& n : cfg_.nodes)
        if (n.id == with[i]) nc = &n;
      uint64_t share = i + 1 == with.size() || total == 0
                           ? left
                           : static_cast<uint64_t>(
                                 static_cast<double>(cfg_.watermark_low / cfg_.page_size) *
                                 static_cast<double>(nc->mem_total) / static_cast<double>(total));
      share = std::min(share, left);
      left -= share;
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "Node %d, zone   Normal\n  pages free     %" PRIu64
                    "\n        min      %" PRIu64 "\n        low      %" PRIu64
                    "\n        high     %" PRIu64 "\n",
                    with[i], static_cast<uint64_t>(node_mem_free(with[i])) / cfg_.page_size,
                    share * 4 / 5, share, share * 6 / 5);
      z += buf;
    }
    f["/proc/zoneinfo"] = z;
  }

  // /proc/sys
  if (wants("/proc/sys/")) render_sysctl_locked(f, def);
  if (wants("/sys/kernel/mm/hugepages/")) render_hugepages_locked(f);
  if (cfg_.numa_sysfs && wants("/sys/devices/system/node/")) render_nodes_locked(f, def, only);
}

void SimKernel::render_sysctl_locked(std::map<std::string, std::string>& f, const SimHState* def) {
  f["/proc/sys/kernel/osrelease"] = cfg_.kernel_release + "\n";
  f["/proc/sys/vm/overcommit_memory"] = num(cfg_.overcommit_memory);
  f["/proc/sys/vm/overcommit_ratio"] = num(cfg_.overcommit_ratio);
  f["/proc/sys/vm/overcommit_kbytes"] = num(static_cast<long>(cfg_.overcommit_kbytes));
  f["/proc/sys/vm/admin_reserve_kbytes"] = num(static_cast<long>(cfg_.admin_reserve_kbytes));
  f["/proc/sys/vm/user_reserve_kbytes"] = num(static_cast<long>(cfg_.user_reserve_kbytes));
  if (def) {
    f["/proc/sys/vm/nr_hugepages"] = num(def->max_persistent);
    f["/proc/sys/vm/nr_hugepages_mempolicy"] = num(def->max_persistent);
    f["/proc/sys/vm/nr_overcommit_hugepages"] = num(def->overcommit);
  }
}

// /sys/kernel/mm/hugepages
void SimKernel::render_hugepages_locked(std::map<std::string, std::string>& f) {
  uint64_t smaller = 0;
  for (const auto& [size, h] : hstates_) {
    std::string d = "/sys/kernel/mm/hugepages/" + size_dir(size) + "/";
    f[d + "nr_hugepages"] = num(h.nr());
    f[d + "nr_hugepages_mempolicy"] = num(h.nr());
    f[d + "free_hugepages"] = num(h.free());
    f[d + "resv_hugepages"] = num(h.resv);
    f[d + "surplus_hugepages"] = num(h.surp());
    f[d + "nr_overcommit_hugepages"] = num(h.overcommit);
    if (smaller && version_at_least(5, 16))
      f[d + "demote_size"] = std::to_string(smaller / 1024) + "kB\n";
    smaller = size;
  }
}

// /sys/devices/system/node: the node list files, and the directory of the node `only` names
// (every node's for an empty `only`).
void SimKernel::render_nodes_locked(std::map<std::string, std::string>& f, const SimHState* def,
                                    const std::string& only) {
  const std::string base = "/sys/devices/system/node/";
  std::vector<int> cpus;
  for (const auto& n : cfg_.nodes)
    if (!n.cpulist.empty()) cpus.push_back(n.id);
  f[base + "online"] = node_list(cfg_.online_nodes);
  f[base + "possible"] = node_list(cfg_.possible_nodes);
  f[base + "has_memory"] = node_list(memory_nodes());
  f[base + "has_normal_memory"] = node_list(memory_nodes());
  f[base + "has_cpu"] = node_list(cpus);
  // A node list file ("online") wants no node directory; "node<N>/..." wants one.
  const bool one_node = only.compare(0, base.size() + 4, base + "node") == 0;
  if (!only.empty() && !one_node) return;
  for (const auto& n : cfg_.nodes) {
    std::string d = base + "node" + std::to_string(n.id) + "/";
    if (one_node && only.compare(0, d.size(), d) != 0) continue;
    std::string prefix = "Node " + std::to_string(n.id) + " ";
    std::string m;
    const SimNodeNumbers now = node_numbers_locked(n);
    const uint64_t nfree = now.mem_free, ncache = now.page_cache, nslab = now.slab_reclaimable;
    kb_line(m, prefix, "MemTotal:", n.mem_total / 1024);
    kb_line(m, prefix, "MemFree:", nfree / 1024);
    kb_line(m, prefix, "MemUsed:", (n.mem_total > nfree ? n.mem_total - nfree : 0) / 1024);
    for (const char* l : {"SwapCached:", "Active:"}) kb_line(m, prefix, l, 0);
    kb_line(m, prefix, "Inactive:", ncache / 1024);
    for (const char* l : {"Active(anon):", "Inactive(anon):", "Active(file):"})
      kb_line(m, prefix, l, 0);
    kb_line(m, prefix, "Inactive(file):", ncache / 1024);
    for (const char* l : {"Unevictable:", "Mlocked:", "Dirty:", "Writeback:"})
      kb_line(m, prefix, l, 0);
    kb_line(m, prefix, "FilePages:", ncache / 1024);
    for (const char* l : {"Mapped:", "AnonPages:", "Shmem:", "KernelStack:", "PageTables:",
                          "SecPageTables:", "NFS_Unstable:", "Bounce:", "WritebackTmp:"})
      kb_line(m, prefix, l, 0);
    for (const char* l : {"KReclaimable:", "Slab:", "SReclaimable:"})
      kb_line(m, prefix, l, nslab / 1024);
    for (const char* l : {"SUnreclaim:", "AnonHugePages:", "ShmemHugePages:", "ShmemPmdMapped:",
                          "FileHugePages:", "FilePmdMapped:"})
      kb_line(m, prefix, l, 0);
    if (def) {
      auto it = def->node.find(n.id);
      SimNodePool p = it == def->node.end() ? SimNodePool{} : it->second;
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "Node %d HugePages_Total: %5ld\nNode %d HugePages_Free:  %5ld\n"
                    "Node %d HugePages_Surp:  %5ld\n",
                    n.id, p.nr, n.id, p.free, n.id, p.surp);
      m += buf;
    }
    f[d + "meminfo"] = m;
    f[d + "cpulist"] = n.cpulist + "\n";
    std::string dist;
    if (!n.distances.empty()) {
      for (int x : n.distances) dist += (dist.empty() ? "" : " ") + std::to_string(x);
    } else {
      for (int o : cfg_.online_nodes)
        dist += (dist.empty() ? "" : " ") + std::to_string(o == n.id ? 10 : 20);
    }
    f[d + "distance"] = dist + "\n";
    for (const auto& [size, h] : hstates_) {
      auto it = h.node.find(n.id);
      SimNodePool p = it == h.node.end() ? SimNodePool{} : it->second;
      std::string hd = d + "hugepages/" + size_dir(size) + "/";
      f[hd + "nr_hugepages"] = num(p.nr);
      f[hd + "free_hugepages"] = num(p.free);
      f[hd + "surplus_hugepages"] = num(p.surp);
    }
  }
}

FileResult SimKernel::read_file(const std::string& path) {
  FileResult r;
  std::map<std::string, std::string> files;
  {
    std::lock_guard<std::mutex> lock(mu_);
    render_locked(files, path);
  }
  auto it = files.find(path);
  if (it == files.end()) {
    r.error = ENOENT;
  } else {
    r.data = it->second;
  }
  return r;
}

}  // namespace umbp
