// SimKernel in Python: the config it is built from (filled by umbp_sim.sim from a Machine),
// admin knobs (nr_hugepages writes), counters, mappings, fds, rendered files and crash_info().
#include <pybind11/stl.h>
#include <signal.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>

#include "kernel/reason_rules.h"
#include "kernel/sim_kernel.h"
#include "kernel/sim_rules.h"
#include "kernel/syscall_format.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace umbp::bindings {
namespace {

const char* signal_name(int sig) {
  switch (sig) {
    case SIGBUS:
      return "SIGBUS";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    default:
      return "SIG?";
  }
}

void check(int err, const std::string& what) {
  if (err) {
    PyErr_SetObject(PyExc_OSError, py::make_tuple(err, std::strerror(err), what).ptr());
    throw py::error_already_set();
  }
}

// {mem_free, mem_available, commit_limit, nodes: [{id, mem_free, page_cache,
// slab_reclaimable}]}, bytes.
py::dict numbers_dict(const SimHostNumbers& x) {
  py::dict d;
  d["mem_free"] = x.mem_free;
  d["mem_available"] = x.mem_available;
  d["commit_limit"] = x.commit_limit;
  py::list nodes;
  for (const auto& n : x.nodes) {
    py::dict nd;
    nd["id"] = n.id;
    nd["mem_free"] = n.mem_free;
    nd["page_cache"] = n.page_cache;
    nd["slab_reclaimable"] = n.slab_reclaimable;
    nodes.append(nd);
  }
  d["nodes"] = nodes;
  return d;
}

py::object ratio_or_none(int64_t r) { return r < 0 ? py::none() : py::object(py::int_(r)); }

// A crash record's field as Python has it, by its kind (UMBP_SIM_CRASH_FIELDS).
py::object crash_Signal(int sig) { return py::str(signal_name(sig)); }
py::object crash_Text(const std::string& s) { return py::str(s); }
py::object crash_Node(int node) { return node >= 0 ? py::object(py::int_(node)) : py::none(); }
py::object crash_Size(uint64_t size) { return size ? py::object(py::int_(size)) : py::none(); }

// Linux's arithmetic (kernel/sim_rules.h), for Python callers that need a number before any
// SimKernel exists: the same code SimKernel runs.
void bind_rules(py::module_& m) {
  m.attr("UNKNOWN") = kUnknown;
  // {id: (numbers, meaning)} of every reason rule (kernel/reason_rules.h), in declared order.
  py::dict reason_rules;
  for (const auto& r : umbp::reason_rules()) {
    py::list numbers;
    std::istringstream names(r.numbers);
    for (std::string n; names >> n;) numbers.append(n);
    reason_rules[py::str(r.id)] = py::make_tuple(py::tuple(numbers), r.meaning);
  }
  m.attr("REASON_RULES") = reason_rules;
  // The fields of SimKernel's crash record (kernel/sim_kernel.h), in declared order.
#define UMBP_SIM_CRASH_NAME(name, type, unset, kind) #name,
  const std::vector<std::string> crash_fields{UMBP_SIM_CRASH_FIELDS(UMBP_SIM_CRASH_NAME)};
#undef UMBP_SIM_CRASH_NAME
  m.attr("CRASH_FIELDS") = py::tuple(py::cast(crash_fields));
  // The counters of a hugepage pool, in hugepage_counters()' order (kernel/sim_kernel.h).
#define UMBP_SIM_POOL_NAME(name) #name,
  const std::vector<std::string> pool_counters{UMBP_SIM_HUGEPAGE_COUNTERS(UMBP_SIM_POOL_NAME)};
#undef UMBP_SIM_POOL_NAME
  m.attr("HUGEPAGE_COUNTERS") = py::tuple(py::cast(pool_counters));
  m.def("reason_numbers_problem", &umbp::reason_numbers_problem, py::arg("rule"),
        py::arg("numbers"),
        "What SimKernel would refuse to record of a reason of `rule` carrying `numbers` "
        "([(name, value)], in order): '' when they are the rule's");
  m.def(
      "host_numbers", [](const SimConfig& cfg) { return numbers_dict(derive_start(cfg)); },
      py::arg("config"),
      "The numbers a SimKernel of `config` starts with (its unknowns derived): {mem_free, "
      "mem_available, commit_limit, nodes: [{id, mem_free, page_cache, slab_reclaimable}]}");
  m.def("default_watermark_low", &rules::default_watermark_low, py::arg("mem_total"),
        "Σ low watermarks of the default min_free_kbytes of a host of mem_total bytes");
  m.def("watermark_low_from_min_free_kbytes", &rules::watermark_low_from_min_free_kbytes,
        py::arg("min_free_kbytes"), "Σ low watermarks (bytes) of vm.min_free_kbytes");
  m.def(
      "solve_overcommit_ratio",
      [](uint64_t commit_limit, uint64_t mem_total, uint64_t pool_bytes, uint64_t swap) {
        return ratio_or_none(
            rules::solve_overcommit_ratio(commit_limit, mem_total, pool_bytes, swap));
      },
      py::arg("commit_limit"), py::arg("mem_total"), py::arg("pool_bytes"), py::arg("swap"),
      "The overcommit_ratio CommitLimit was computed with, or None");
  m.def(
      "overcommit_ratio_for",
      [](const SimConfig& cfg, uint64_t target) {
        return ratio_or_none(rules::overcommit_ratio_for(
            target, cfg.mem_total, rules::pool_pages(cfg), cfg.page_size, cfg.swap_total));
      },
      py::arg("config"), py::arg("commit_limit"),
      "The smallest overcommit_ratio whose CommitLimit reaches commit_limit bytes, or None");
  m.def("interleave", &rules::interleave, py::arg("count"), py::arg("nodes"),
        "Each node's share of count new hugepages written to vm.nr_hugepages (round robin)");
}

}  // namespace

void bind_sim(py::module_& m) {
  bind_rules(m);
  py::class_<SimPoolConfig> pool(m, "SimPoolConfig");
  py::class_<SimNodeConfig> node(m, "SimNodeConfig");
  py::class_<SimConfig> config(m, "SimConfig", "Starting state of a SimKernel (see umbp_sim.sim)");
  pool.def(py::init<>());
  node.def(py::init<>());
  config.def(py::init<>());
#define UMBP_POOL(f) pool.def_readwrite(#f, &SimPoolConfig::f);
#define UMBP_NODE(f) node.def_readwrite(#f, &SimNodeConfig::f);
#define UMBP_CONFIG(f) config.def_readwrite(#f, &SimConfig::f);
  UMBP_SIM_POOL_FIELDS(UMBP_POOL)
  UMBP_SIM_NODE_FIELDS(UMBP_NODE)
  UMBP_SIM_CONFIG_FIELDS(UMBP_CONFIG)
#undef UMBP_POOL
#undef UMBP_NODE
#undef UMBP_CONFIG

  py::class_<SimKernel, Kernel, std::shared_ptr<SimKernel>>(
      m, "SimKernel", "The simulated Linux memory subsystem (docs/kernel-model.md)")
      .def(py::init<const SimConfig&>(), py::arg("config"))
      .def(
          "set_nr_hugepages",
          [](SimKernel& k, uint64_t size, long count, int node) {
            check(k.set_nr_hugepages(size, count, node), "nr_hugepages");
          },
          py::arg("size"), py::arg("count"), py::arg("node") = -1,
          "Write nr_hugepages of one size (node=-1: the global file, interleaved)")
      .def(
          "set_nr_overcommit_hugepages",
          [](SimKernel& k, uint64_t size, long count) {
            check(k.set_nr_overcommit_hugepages(size, count), "nr_overcommit_hugepages");
          },
          py::arg("size"), py::arg("count"))
      .def(
          "set_task_policy",
          [](SimKernel& k, int mode, const std::vector<int>& nodes) {
            check(k.set_task_policy(mode, nodes), "set_mempolicy");
          },
          py::arg("mode"), py::arg("nodes"), "set_mempolicy(2) of the simulated task")
      .def("render_all", &SimKernel::render_all, "{path: contents} of every rendered file")
      .def("dead", &SimKernel::dead)
      .def("crash_info",
           [](SimKernel& k) -> py::object {
             const SimCrash c = k.crash();
             if (!c.signal) return py::none();
             py::dict d;
#define UMBP_SIM_CRASH_KEY(name, type, unset, kind) d[#name] = crash_##kind(c.name);
             UMBP_SIM_CRASH_FIELDS(UMBP_SIM_CRASH_KEY)
#undef UMBP_SIM_CRASH_KEY
             return std::move(d);
           })
      .def(
          "reasons",
          [](SimKernel& k) {
            py::list out;
            for (const auto& r : k.reasons()) {
              py::dict d;
              d["call"] = r.call;
              d["rule"] = r.rule;
              d["errno"] = r.err ? py::object(py::str(errno_symbol(r.err))) : py::none();
              d["signal"] = r.signal ? py::object(py::str(signal_name(r.signal))) : py::none();
              py::dict nums;
              for (const auto& [key, v] : r.numbers) nums[py::str(key)] = v;
              d["numbers"] = nums;
              d["text"] = r.text;
              out.append(d);
            }
            return out;
          },
          "Why each failing call failed, why the process died, and the events that decided an "
          "outcome: [{call, rule, errno, signal, numbers, text}], oldest first")
      .def("clear_reasons", &SimKernel::clear_reasons)
      .def("reclaimable", &SimKernel::node_reclaimable, py::arg("node") = -1,
           "Reclaimable bytes left (page cache + SReclaimable) on a node, or all (-1)")
      .def("hugepage_counters", &SimKernel::hugepage_counters, py::arg("size"),
           py::arg("node") = -1,
           "A pool's counters in HUGEPAGE_COUNTERS' order; [] for an unknown size/node")
      .def("committed_as", &SimKernel::committed_as)
      .def("commit_limit", &SimKernel::commit_limit)
      .def(
          "host_numbers", [](SimKernel& k) { return numbers_dict(k.numbers()); },
          "MemFree, MemAvailable, CommitLimit and each node's MemFree, page cache and "
          "reclaimable slab now, bytes (the shape of umbp_sim._native.host_numbers)")
      .def("total_vm", &SimKernel::total_vm)
      .def("backed", &SimKernel::backed, py::arg("addr"),
           "whether addr is in a simulated mapping with real memory behind it (writable through "
           "the pointer); False for a mapping this process had no room to reserve (RLIMIT_AS)")
      .def("open_fds", &SimKernel::open_fds)
      .def("mappings", [](SimKernel& k) {
        py::list out;
        for (const auto& m : k.mappings()) {
          py::dict d;
          d["start"] = m.start;
          d["length"] = m.length;
          d["prot"] = m.prot;
          d["flags"] = m.flags;
          d["page_size"] = m.page_size;
          d["hugetlb"] = m.hugetlb;
          d["shared"] = m.shared;
          d["policy_mode"] = m.policy_mode;
          d["policy_nodes"] = m.policy_nodes;
          d["faulted_pages"] = m.faulted_pages;
          d["reserved_pages"] = m.reserved_pages;
          d["file_size"] = m.file_size;
          d["file_fds"] = m.file_fds;
          d["file_fds_cloexec"] = m.file_fds_cloexec;
          out.append(d);
        }
        return out;
      });
}

}  // namespace umbp::bindings
