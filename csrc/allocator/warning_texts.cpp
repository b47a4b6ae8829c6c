#include "allocator/warning_texts.h"

namespace umbp::texts {

// One pass over the template: values are never scanned again, so a value read from a file
// (a node list) cannot be taken for a placeholder.
std::string Fill(const char* text, Values values) {
  const std::string t = text;
  std::string out;
  size_t pos = 0;
  for (size_t open = t.find('{'); open != std::string::npos; open = t.find('{', pos)) {
    const size_t close = t.find('}', open);
    out.append(t, pos, open - pos);
    const std::string key = t.substr(open + 1, close - open - 1);
    for (const Value& v : values)
      if (key == v.key) out += *v.value;
    pos = close + 1;
  }
  out.append(t, pos, std::string::npos);
  return out;
}

}  // namespace umbp::texts
