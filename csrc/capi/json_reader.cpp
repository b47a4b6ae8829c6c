#include "capi/json_reader.h"

#include <cerrno>
#include <cstdlib>

namespace umbp::capi {
namespace {

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  Json document() {
    Json v = value(0);
    skip_space();
    if (i_ != s_.size()) fail("text after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw JsonError("JSON at byte " + std::to_string(i_) + ": " + why);
  }
  // After a member or item: true past a ',' (another follows), false past `close` (the end).
  bool more(char close) {
    skip_space();
    if (i_ < s_.size() && (s_[i_] == ',' || s_[i_] == close)) return s_[i_++] == ',';
    fail(std::string("expected ',' or '") + close + "'");
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  bool take(const char* word) {
    size_t n = 0;
    while (word[n]) ++n;
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }

  Json value(int depth) {
    if (depth > 64) fail("nested too deep");
    skip_space();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.type = Json::Type::Object;
      ++i_;
      skip_space();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      for (;;) {
        skip_space();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a key");
        std::string key = string();
        skip_space();
        if (i_ >= s_.size() || s_[i_++] != ':') fail("expected ':'");
        v.members.emplace_back(std::move(key), value(depth + 1));
        if (!more('}')) return v;
      }
    }
    if (c == '[') {
      v.type = Json::Type::Array;
      ++i_;
      skip_space();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      for (;;) {
        v.items.push_back(value(depth + 1));
        if (!more(']')) return v;
      }
    }
    if (c == '"') {
      v.type = Json::Type::String;
      v.text = string();
      return v;
    }
    if (take("true") || take("false")) {
      v.type = Json::Type::Bool;
      v.boolean = s_[i_ - 1] == 'e' && s_[i_ - 4] == 't';  // "true", not "false"
      return v;
    }
    if (take("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t start = i_;
      while (i_ < s_.size() && (std::string("+-.eE").find(s_[i_]) != std::string::npos ||
                                (s_[i_] >= '0' && s_[i_] <= '9')))
        ++i_;
      v.type = Json::Type::Number;
      v.text = s_.substr(start, i_ - start);
      return v;
    }
    fail(std::string("unexpected '") + c + "'");
  }

  // A string; \uXXXX escapes below 0x80 only (the host file is ASCII but for names a person
  // wrote, which Python's json.dumps escapes: those become UTF-8).
  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      c = s_[i_++];
      switch (c) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          const unsigned long cp = std::strtoul(s_.substr(i_, 4).c_str(), nullptr, 16);
          i_ += 4;
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {  // a surrogate half is kept as its own 3 bytes: names only, never compared
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:
          out += c;  // \" \\ \/
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;  // the closing quote
    return out;
  }

  const std::string& s_;
  size_t i_ = 0;
};

[[noreturn]] void wrong(const std::string& what, const char* expected) {
  throw JsonError(what + ": expected " + expected);
}

}  // namespace

Json Json::parse(const std::string& doc) { return Parser(doc).document(); }

uint64_t Json::as_u64(const std::string& what) const {
  if (type != Type::Number || text.empty() || text[0] == '-') wrong(what, "an unsigned integer");
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno || *end) wrong(what, "an unsigned 64-bit integer");
  return v;
}

int64_t Json::as_i64(const std::string& what) const {
  if (type != Type::Number) wrong(what, "an integer");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno || *end) wrong(what, "a 64-bit integer");
  return v;
}

double Json::as_double(const std::string& what) const {
  if (type != Type::Number) wrong(what, "a number");
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (*end) wrong(what, "a number");
  return v;
}

bool Json::as_bool(const std::string& what) const {
  if (type != Type::Bool) wrong(what, "true or false");
  return boolean;
}

const std::string& Json::as_string(const std::string& what) const {
  if (type != Type::String) wrong(what, "a string");
  return text;
}

const std::vector<Json>& Json::as_array(const std::string& what) const {
  if (type != Type::Array) wrong(what, "an array");
  return items;
}

const std::vector<std::pair<std::string, Json>>& Json::as_object(const std::string& what) const {
  if (type != Type::Object) wrong(what, "an object");
  return members;
}

}  // namespace umbp::capi
