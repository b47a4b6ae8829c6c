#include "allocator/host_files.h"

#include <limits>

#include "allocator/warning_texts.h"

namespace umbp {

std::optional<unsigned long> ParseUlong(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  if (i == s.size() || s[i] < '0' || s[i] > '9') return std::nullopt;
  unsigned long v = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    if (v > (std::numeric_limits<unsigned long>::max() - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<unsigned long>(s[i] - '0');
  }
  return v;
}

namespace {

// The value after "<key>:" on its own line of a /proc/meminfo-style text.
std::optional<unsigned long> MeminfoField(const std::string& text, const std::string& key) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    if (text.compare(pos, key.size() + 1, key + ":") == 0) {
      return ParseUlong(text.substr(pos + key.size() + 1, eol - pos - key.size() - 1));
    }
    pos = eol + 1;
  }
  return std::nullopt;
}

}  // namespace

std::string HugepageCounters(Kernel& k, size_t hp) {
  const std::string kb = std::to_string(hp / 1024);
  const std::string dir = "/sys/kernel/mm/hugepages/hugepages-" + kb + "kB/";
  auto read_num = [&](const std::string& name) -> std::optional<unsigned long> {
    FileResult r = k.read_file(dir + name);
    if (!r.ok()) return std::nullopt;
    return ParseUlong(r.data);
  };
  auto fmt = [&](unsigned long f, unsigned long t, unsigned long r) {
    return texts::Fill(
        texts::kCounters,
        {{"kb", kb}, {"f", std::to_string(f)}, {"t", std::to_string(t)}, {"r", std::to_string(r)}});
  };
  auto say = [&](const char* text) { return texts::Fill(text, {{"kb", kb}}); };
  auto f = read_num("free_hugepages");
  auto t = read_num("nr_hugepages");
  auto r = read_num("resv_hugepages");
  if (f && t && r) return fmt(*f, *t, *r);
  FileResult mi = k.read_file("/proc/meminfo");
  if (!mi.ok()) return say(texts::kCountersUnavailable);
  auto def = MeminfoField(mi.data, "Hugepagesize");
  if (def && *def == hp / 1024) {
    auto mf = MeminfoField(mi.data, "HugePages_Free");
    auto mt = MeminfoField(mi.data, "HugePages_Total");
    auto mr = MeminfoField(mi.data, "HugePages_Rsvd");
    if (mf && mt && mr) return fmt(*mf, *mt, *mr);
    return say(texts::kCountersUnavailable);
  }
  if (def) return say(texts::kCountersNotConfigured);
  return say(texts::kCountersUnavailable);
}

std::optional<bool> NodeListContains(const std::string& text, long node) {
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return false;
  size_t pos = 0;
  bool found = false;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    std::string part = s.substr(pos, comma - pos);
    size_t dash = part.find('-');
    auto lo = ParseUlong(part.substr(0, dash));
    auto hi = dash == std::string::npos ? lo : ParseUlong(part.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) return std::nullopt;
    if (static_cast<unsigned long>(node) >= *lo && static_cast<unsigned long>(node) <= *hi) {
      found = true;
    }
    pos = comma + 1;
  }
  return found;
}

std::string MoriMeminfoSummary(Kernel& k) {
  FileResult mi = k.read_file("/proc/meminfo");
  std::string total = "HugePages_Total=?", free = "HugePages_Free=?", size = "Hugepagesize=?";
  if (!mi.ok()) return total + " " + free + " " + size;
  size_t pos = 0;
  while (pos < mi.data.size()) {
    size_t eol = mi.data.find('\n', pos);
    if (eol == std::string::npos) eol = mi.data.size();
    const std::string line = mi.data.substr(pos, eol - pos);
    if (line.rfind("HugePages_Total:", 0) == 0) total = line;
    if (line.rfind("HugePages_Free:", 0) == 0) free = line;
    if (line.rfind("Hugepagesize:", 0) == 0) size = line;
    pos = eol + 1;
  }
  return total + " " + free + " " + size;
}

}  // namespace umbp
