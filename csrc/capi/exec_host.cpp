// libumbp_sim_exec.so (capi/exec_host.h): the host file read into a SimConfig and fault rules, and
// the kernel stack an external run uses (TracingKernel over FaultyKernel over SimKernel) handed
// out through the C ABI.
#include "capi/exec_host.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "capi/json_reader.h"
#include "capi/kernel_capi.h"
#include "kernel/faulty_kernel.h"
#include "kernel/sim_config.h"
#include "kernel/sim_kernel.h"
#include "kernel/syscall_format.h"
#include "kernel/tracing_kernel.h"

namespace umbp::capi {
namespace {

// The members of one object, each read once: a missing key or one never read is an error.
class Fields {
 public:
  Fields(const Json& obj, std::string where) : where_(std::move(where)) {
    for (const auto& [key, value] : obj.as_object(where_)) members_[key] = &value;
  }
  const Json& at(const std::string& key) {
    auto it = members_.find(key);
    if (it == members_.end()) throw JsonError(where_ + "." + key + ": missing");
    read_.insert(key);
    return *it->second;
  }
  std::string name(const std::string& key) const { return where_ + "." + key; }
  void done() const {
    for (const auto& [key, value] : members_)
      if (!read_.count(key)) throw JsonError(where_ + "." + key + ": unknown key");
  }

 private:
  std::string where_;
  std::map<std::string, const Json*> members_;
  std::set<std::string> read_;
};

void get(const Json& j, const std::string& w, uint64_t& out) { out = j.as_u64(w); }
void get(const Json& j, const std::string& w, long& out) { out = j.as_i64(w); }
void get(const Json& j, const std::string& w, bool& out) { out = j.as_bool(w); }
void get(const Json& j, const std::string& w, double& out) { out = j.as_double(w); }
void get(const Json& j, const std::string& w, std::string& out) { out = j.as_string(w); }
void get(const Json& j, const std::string& w, int& out) {
  const int64_t v = j.as_i64(w);
  if (v < INT32_MIN || v > INT32_MAX) throw JsonError(w + ": out of range");
  out = static_cast<int>(v);
}
void get(const Json& j, const std::string& w, unsigned& out) {
  const uint64_t v = j.as_u64(w);
  if (v > UINT32_MAX) throw JsonError(w + ": out of range");
  out = static_cast<unsigned>(v);
}
void get(const Json& j, const std::string& w, SimPoolConfig& out);
void get(const Json& j, const std::string& w, SimNodeConfig& out);

template <typename T>
void get(const Json& j, const std::string& w, std::vector<T>& out) {
  out.clear();
  const auto& items = j.as_array(w);
  for (size_t i = 0; i < items.size(); ++i) {
    T v{};
    get(items[i], w + "[" + std::to_string(i) + "]", v);
    out.push_back(std::move(v));
  }
}

template <typename V>
void get(const Json& j, const std::string& w, std::map<uint64_t, V>& out) {
  out.clear();
  for (const auto& [key, value] : j.as_object(w)) {
    Json k;
    k.type = Json::Type::Number;
    k.text = key;
    V v{};
    get(value, w + "[" + key + "]", v);
    out[k.as_u64(w + " key " + key)] = std::move(v);
  }
}

#define UMBP_FIELD(f, obj, key) get(f.at(#key), f.name(#key), (obj).key)
// One member of `out` read from the object `f` reads (the lists in sim_config.h, faulty_kernel.h).
#define UMBP_READ(key) UMBP_FIELD(f, out, key);

void get(const Json& j, const std::string& w, SimPoolConfig& out) {
  Fields f(j, w);
  UMBP_SIM_POOL_FIELDS(UMBP_READ)
  f.done();
}

void get(const Json& j, const std::string& w, SimNodeConfig& out) {
  Fields f(j, w);
  UMBP_SIM_NODE_FIELDS(UMBP_READ)
  f.done();
}

SimConfig sim_config(const Json& j) {
  SimConfig out;
  Fields f(j, "sim_config");
  UMBP_SIM_CONFIG_FIELDS(UMBP_READ)
  f.done();
  return out;
}

constexpr const char* kWhenNames[] = {"always", "nth", "range", "every", "first"};

FaultRule fault_rule(const Json& j, const std::string& w) {
  FaultRule out;
  Fields f(j, w);
  const std::string op = f.at("op").as_string(f.name("op"));
  const int op_index = sysop_from_name(op);
  if (op_index < 0) throw JsonError(f.name("op") + ": unknown operation '" + op + "'");
  out.op = static_cast<SysOp>(op_index);
  const Json& content = f.at("content");
  out.has_content = !content.is_null();
  if (out.has_content) out.content = content.as_string(f.name("content"));
  const std::string when = f.at("when").as_string(f.name("when"));
  bool known = false;
  for (int i = 0; i < 5; ++i)
    if (when == kWhenNames[i]) {
      out.when = static_cast<FaultRule::When>(i);
      known = true;
    }
  if (!known) throw JsonError(f.name("when") + ": unknown schedule '" + when + "'");
  UMBP_FAULT_RULE_FIELDS(UMBP_READ)
  f.done();
  return out;
}

#undef UMBP_READ
#undef UMBP_FIELD

void start(const char* path, umbp_sim_exec_host* out) {
  std::ifstream in(path);
  if (!in) throw JsonError(std::string(path) + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  const Json doc = Json::parse(text.str());
  Fields f(doc, "host");
  const uint64_t format = f.at("format").as_u64("host.format");
  if (format != UMBP_SIM_EXEC_HOST_FORMAT)
    throw JsonError("host.format: " + std::to_string(format) + ", this library reads " +
                    std::to_string(UMBP_SIM_EXEC_HOST_FORMAT));
  const SimConfig cfg = sim_config(f.at("sim_config"));
  std::vector<FaultRule> rules;
  const auto& items = f.at("fault_rules").as_array("host.fault_rules");
  for (size_t i = 0; i < items.size(); ++i)
    rules.push_back(fault_rule(items[i], "host.fault_rules[" + std::to_string(i) + "]"));
  const uint64_t trace_limit = f.at("trace_limit").as_u64("host.trace_limit");
  f.done();
  KernelPtr kernel = std::make_shared<SimKernel>(cfg);
  if (!rules.empty()) kernel = std::make_shared<FaultyKernel>(kernel, std::move(rules));
  kernel = std::make_shared<TracingKernel>(kernel, static_cast<size_t>(trace_limit));
  out->kernel = make_c_kernel(std::move(kernel));
}

}  // namespace
}  // namespace umbp::capi

extern "C" __attribute__((visibility("default"))) int umbp_sim_exec_start(const char* path,
                                                                          umbp_sim_exec_host* out,
                                                                          char* err, size_t cap) {
  try {
    umbp::capi::start(path, out);
    return 0;
  } catch (const std::exception& e) {
    if (cap) std::snprintf(err, cap, "%s", e.what());
  }
  return -1;
}
