// A small JSON reader for the host file `umbp-sim exec` writes (csrc/capi/exec_host.cpp): the
// whole document into a tree, numbers kept as their text so that a uint64_t (UINT64_MAX is
// "unlimited") is read exactly. Errors are JsonError with the byte offset.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace umbp::capi {

struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object };
  Type type = Type::Null;
  bool boolean = false;
  std::string text;  // a string's value, or a number as written
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;  // in document order

  static Json parse(const std::string& doc);

  // Typed reads; JsonError naming `what` when the value is not of that type or range.
  uint64_t as_u64(const std::string& what) const;
  int64_t as_i64(const std::string& what) const;
  double as_double(const std::string& what) const;
  bool as_bool(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
  const std::vector<Json>& as_array(const std::string& what) const;
  const std::vector<std::pair<std::string, Json>>& as_object(const std::string& what) const;
  bool is_null() const { return type == Type::Null; }
};

}  // namespace umbp::capi
