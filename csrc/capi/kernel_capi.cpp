// The C ABI over the Kernel seam: one static ops table, one heap object per handle holding a
// shared_ptr to the kernel and a reference count (the capsule and any C user share it).
#include "capi/kernel_capi.h"

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "kernel/faulty_kernel.h"
#include "kernel/sim_kernel.h"
#include "kernel/syscall_format.h"
#include "kernel/tracing_kernel.h"

namespace umbp::capi {
namespace {

struct Handle {
  umbp_sim_kernel c;
  KernelPtr kernel;
  std::atomic<long> refs{1};
};

Kernel& K(void* self) { return *static_cast<Handle*>(self)->kernel; }

umbp_sim_result to_c(const SysResult& r) { return umbp_sim_result{r.value, r.error, r.signal}; }

// The next layer down of a wrapper kernel, or nullptr.
Kernel* inner_of(Kernel* k) {
  if (auto* t = dynamic_cast<TracingKernel*>(k)) return t->inner().get();
  if (auto* f = dynamic_cast<FaultyKernel*>(k)) return f->inner().get();
  return nullptr;
}

template <typename T>
T* find_layer(Kernel* k) {
  for (; k; k = inner_of(k))
    if (auto* t = dynamic_cast<T*>(k)) return t;
  return nullptr;
}

size_t c_page_size(void* self) { return K(self).page_size(); }

// The call site set_call_site named is this call's only: a stack without a TracingKernel does
// not take it, and it must not pass to the thread's next call.
struct SiteOfThisCall {
  ~SiteOfThisCall() { pending_call_site() = CallSite{}; }
};

void c_set_call_site(void* /*self*/, const char* object, unsigned long offset) {
  pending_call_site() = CallSite{object, static_cast<uintptr_t>(offset)};
}

umbp_sim_result c_mmap(void* self, void* addr, size_t length, int prot, int flags, int fd,
                       long offset) {
  SiteOfThisCall once;
  return to_c(K(self).mmap(addr, length, prot, flags, fd, static_cast<off_t>(offset)));
}
umbp_sim_result c_munmap(void* self, void* addr, size_t length) {
  SiteOfThisCall once;
  return to_c(K(self).munmap(addr, length));
}
umbp_sim_result c_madvise(void* self, void* addr, size_t length, int advice) {
  SiteOfThisCall once;
  return to_c(K(self).madvise(addr, length, advice));
}
umbp_sim_result c_mbind(void* self, void* addr, size_t length, int mode,
                        const unsigned long* nodemask, unsigned long maxnode, unsigned flags) {
  SiteOfThisCall once;
  return to_c(K(self).mbind(addr, length, mode, nodemask, maxnode, flags));
}
umbp_sim_result c_memfd_create(void* self, const char* name, unsigned flags) {
  SiteOfThisCall once;
  return to_c(K(self).memfd_create(name, flags));
}
umbp_sim_result c_ftruncate(void* self, int fd, long length) {
  SiteOfThisCall once;
  return to_c(K(self).ftruncate(fd, static_cast<off_t>(length)));
}
umbp_sim_result c_close(void* self, int fd) {
  SiteOfThisCall once;
  return to_c(K(self).close(fd));
}

umbp_sim_result c_read_file(void* self, const char* path, char** data) {
  FileResult r = K(self).read_file(path ? path : "");
  if (!r.ok()) {
    if (data) *data = nullptr;
    return umbp_sim_result{-1, r.error, 0};
  }
  if (data) {
    char* buf = static_cast<char*>(std::malloc(r.data.size() + 1));
    if (!buf) return umbp_sim_result{-1, ENOMEM, 0};
    std::memcpy(buf, r.data.data(), r.data.size());
    buf[r.data.size()] = '\0';
    *data = buf;
  }
  return umbp_sim_result{static_cast<long>(r.data.size()), 0, 0};
}

umbp_sim_result c_touch(void* self, void* addr, size_t length, size_t stride) {
  return to_c(K(self).touch(addr, length, stride));
}

unsigned long c_mapping_end(void* self, void* addr) {
  SimKernel* sim = find_layer<SimKernel>(&K(self));
  if (!sim) return 0;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (const auto& m : sim->mappings())
    if (a >= m.start && a < m.start + m.length) return m.start + m.length;
  return 0;
}

int c_page_node(void* self, void* addr) {
  SimKernel* sim = find_layer<SimKernel>(&K(self));
  return sim ? sim->page_node(reinterpret_cast<uintptr_t>(addr)) : -ENOSYS;
}

std::string crash_text(Kernel* k) {
  SimKernel* sim = find_layer<SimKernel>(k);
  if (!sim) return "";
  SimCrash c = sim->crash();
  if (!c.signal) return "";
  std::string s = std::string(signal_symbol(c.signal)) + " in " + c.where;
  // "(node 1, 2048 kB pages)": what the built-in run's SimulatedCrash says of it
  std::string at;
  if (c.node >= 0) at = "node " + std::to_string(c.node);
  if (c.hugepage_size)
    at += (at.empty() ? "" : ", ") + std::to_string(c.hugepage_size / 1024) + " kB pages";
  if (!at.empty()) s += " (" + at + ")";
  if (!c.detail.empty()) s += ": " + c.detail;
  return s;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += ch;
    }
  }
  out += '"';
}

void json_signal_or_null(std::string& out, int sig) {
  if (sig)
    json_string(out, signal_symbol(sig));
  else
    out += "null";
}

// A crash record's field in JSON, by its kind (UMBP_SIM_CRASH_FIELDS).
void crash_json_Signal(std::string& out, int sig) { json_signal_or_null(out, sig); }
void crash_json_Text(std::string& out, const std::string& s) { json_string(out, s); }
void crash_json_Node(std::string& out, int node) {
  out += node >= 0 ? std::to_string(node) : std::string("null");
}
void crash_json_Size(std::string& out, uint64_t size) {
  out += size ? std::to_string(size) : std::string("null");
}

// One of SimKernel's reasons as a JSON object: {"call", "rule", "errno", "signal", "numbers",
// "text"} as umbp_sim.sim.Reason holds them (errno and signal by name, null when none).
template <typename R>
void reason_json(std::string& out, const R& r) {
  out += "{\"call\": ";
  json_string(out, r.call);
  out += ", \"rule\": ";
  json_string(out, r.rule);
  out += ", \"errno\": ";
  if (r.err)
    json_string(out, errno_symbol(r.err));
  else
    out += "null";
  out += ", \"signal\": ";
  json_signal_or_null(out, r.signal);
  out += ", \"numbers\": {";
  bool first = true;
  for (const auto& [key, v] : r.numbers) {
    if (!first) out += ", ";
    first = false;
    json_string(out, key);
    out += ": " + std::to_string(v);
  }
  out += "}, \"text\": ";
  json_string(out, r.text);
  out += "}";
}

// SimKernel's reasons, one JSON object a line.
std::string reasons_json(Kernel* k) {
  SimKernel* sim = find_layer<SimKernel>(k);
  if (!sim) return "";
  std::string out;
  for (const auto& r : sim->reasons()) {
    reason_json(out, r);
    out += "\n";
  }
  return out;
}

// The post-mortem as one JSON object (describe 3): {"crash": SimKernel's crash record or null,
// "reasons": [...], "trace": [the TracingKernel's lines]}.
std::string postmortem_json(Kernel* k) {
  std::string out = "{\"crash\": ";
  SimKernel* sim = find_layer<SimKernel>(k);
  const SimCrash c = sim ? sim->crash() : SimCrash{};
  if (c.signal) {
    out += "{";
    // The declared fields (UMBP_SIM_CRASH_FIELDS), then the whole account as one text.
#define UMBP_SIM_CRASH_JSON(name, type, unset, kind) \
  out += "\"" #name "\": ";                          \
  crash_json_##kind(out, c.name);                    \
  out += ", ";
    UMBP_SIM_CRASH_FIELDS(UMBP_SIM_CRASH_JSON)
#undef UMBP_SIM_CRASH_JSON
    out += "\"text\": ";
    json_string(out, crash_text(k));
    out += "}";
  } else {
    out += "null";
  }
  out += ", \"reasons\": [";
  if (sim) {
    bool first = true;
    for (const auto& r : sim->reasons()) {
      if (!first) out += ", ";
      first = false;
      reason_json(out, r);
    }
  }
  out += "], \"trace\": [";
  // Each trace line's call site (an index in "call_sites", -1 none) and the sites, as the
  // TracingKernel keeps them: where the calls a death's report shows came from.
  std::string sites = "], \"sites\": [", table = "], \"call_sites\": [";
  if (auto* t = find_layer<TracingKernel>(k)) {
    bool first = true;
    for (const auto& rec : t->records()) {
      if (!first) {
        out += ", ";
        sites += ", ";
      }
      first = false;
      json_string(out, rec.text());
      sites += std::to_string(rec.site);
    }
    first = true;
    for (const auto& [object, offset] : t->call_sites()) {
      if (!first) table += ", ";
      first = false;
      table += "[";
      json_string(table, object);
      table += ", " + std::to_string(offset) + "]";
    }
  }
  out += sites + table + "]}";
  return out;
}

size_t c_describe(void* self, int what, char* buf, size_t cap) {
  std::string s;
  try {
    if (what == 0) {
      s = crash_text(&K(self));
    } else if (what == 1) {
      if (auto* t = find_layer<TracingKernel>(&K(self))) s = t->text();
    } else if (what == 2) {
      s = reasons_json(&K(self));
    } else if (what == 3) {
      s = postmortem_json(&K(self));
    }
  } catch (const std::bad_alloc&) {
    s.clear();
  }
  if (buf && cap) {
    const size_t n = std::min(cap - 1, s.size());
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return s.size();
}

void c_retain(void* self) { static_cast<Handle*>(self)->refs.fetch_add(1); }
void c_release(void* self) {
  auto* h = static_cast<Handle*>(self);
  if (h->refs.fetch_sub(1) == 1) delete h;
}

umbp_sim_kernel_ops make_ops(unsigned flags) {
  umbp_sim_kernel_ops o{};
  o.abi_version = UMBP_SIM_KERNEL_ABI_VERSION;
  o.flags = flags;
  o.page_size = c_page_size;
  o.mmap = c_mmap;
  o.munmap = c_munmap;
  o.madvise = c_madvise;
  o.mbind = c_mbind;
  o.memfd_create = c_memfd_create;
  o.ftruncate = c_ftruncate;
  o.close = c_close;
  o.read_file = c_read_file;
  o.touch = c_touch;
  o.mapping_end = c_mapping_end;
  o.describe = c_describe;
  o.retain = c_retain;
  o.release = c_release;
  o.page_node = c_page_node;
  o.set_call_site = c_set_call_site;
  return o;
}

const umbp_sim_kernel_ops kRealOps = make_ops(UMBP_SIM_KERNEL_CALL_SITES);
const umbp_sim_kernel_ops kSimOps =
    make_ops(UMBP_SIM_KERNEL_SIMULATED | UMBP_SIM_KERNEL_CALL_SITES);

}  // namespace

umbp_sim_kernel* make_c_kernel(KernelPtr kernel) {
  auto* h = new Handle;
  const bool simulated = find_layer<SimKernel>(kernel.get()) != nullptr;
  h->kernel = std::move(kernel);
  h->c.ops = simulated ? &kSimOps : &kRealOps;
  h->c.self = h;
  return &h->c;
}

KernelPtr kernel_of(const umbp_sim_kernel* handle) {
  return static_cast<Handle*>(handle->self)->kernel;
}

}  // namespace umbp::capi
