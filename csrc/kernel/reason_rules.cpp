#include "kernel/reason_rules.h"

#include <cstdint>
#include <sstream>

namespace umbp {

namespace {
const ReasonRuleInfo kRules[] = {
#define UMBP_SIM_REASON_RULE_INFO(id, numbers, meaning) {#id, numbers, meaning},
    UMBP_SIM_REASON_RULES(UMBP_SIM_REASON_RULE_INFO)
#undef UMBP_SIM_REASON_RULE_INFO
};
}  // namespace

const ReasonRuleInfo& reason_rule(ReasonRule rule) { return kRules[static_cast<int>(rule)]; }

const std::vector<ReasonRuleInfo>& reason_rules() {
  static const std::vector<ReasonRuleInfo> all(std::begin(kRules), std::end(kRules));
  return all;
}

std::string reason_numbers_problem(const std::string& rule,
                                   const std::vector<std::pair<std::string, int64_t>>& numbers) {
  for (const auto& r : kRules) {
    if (rule != r.id) continue;
    std::istringstream declared(r.numbers);
    std::string name;
    for (const auto& [have, value] : numbers) {
      (void)value;
      while (declared >> name && name != have) {
      }
      if (name != have)
        return "rule " + rule + ": number " + have + " is not one it declares, in order (" +
               r.numbers + ")";
    }
    return {};
  }
  return "rule " + rule + " is not in UMBP_SIM_REASON_RULES";
}

}  // namespace umbp
