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

const std::vector<CatalogueEntry>& Catalogue() {
  static const std::vector<CatalogueEntry> all{
      {"umbp-sim", &kNoKernel},
      {"umbp-sim", &kUnknownBacking},
      {"umbp-sim", &kSizeZero},
      {"umbp-sim", &kRoundingOverflows},
      {"umbp-sim", &kInternalError},
      {"umbp-sim", &kHugepageSizeNotPowerOfTwo},
      {"umbp-sim", &kHugepageSizeNotAboveBasePage},
      {"umbp-sim", &kHugetlbMemfdFailed},
      {"umbp-sim", &kHugetlbFtruncateFailed},
      {"umbp-sim", &kHugetlbMmapFailed},
      {"umbp-sim", &kHugetlbPopulateEfault},
      {"umbp-sim", &kMmapFailed},
      {"umbp-sim", &kMemfdFailed},
      {"umbp-sim", &kFtruncateFailed},
      {"umbp-sim", &kPopulateFailed},
      {"umbp-sim", &kTouchFailed},
      {"umbp-sim", &kPopulateEinval},
      {"umbp-sim", &kPossibleUnreadable},
      {"umbp-sim", &kPossibleUnparsable},
      {"umbp-sim", &kNodeNotPossible},
      {"umbp-sim", &kMbindFailed},
      {"umbp-sim", &kCleanupMunmapFailed},
      {"umbp-sim", &kCloseFailed},
      {"umbp-sim", &kStepCloseFailed},
      {"umbp-sim", &kFreeNotOwned},
      {"umbp-sim", &kFreeDeferred},
      {"umbp-sim", &kFreeMunmapThrew},
      {"umbp-sim", &kFreeMunmapFailed},
      {"umbp-sim", &kReleaseUnknown},
      {"umbp-sim", &kReleaseUnmatched},
      {"umbp-sim", &kDeferredMunmapFailed},
      {"mori", &kMoriHugetlbFallback},
      {"mori", &kMoriNumaUnavailable},
      {"mori", &kMoriInvalidHugepageSize},
      {"mori", &kMoriInvalidHugepageSizeShm},
      {"mori", &kMoriMemfdFailed},
      {"mori", &kMoriFtruncateFailed},
      {"mori", &kMoriMmapFailed},
      {"mori", &kMoriMbindFailed},
      {"mori", &kMoriPopulateFailed},
      {"mori", &kMoriFreeDeferred},
      {"mori", &kMoriMunmapFailed},
      {"mori", &kMoriDeferredMunmapFailed},
  };
  return all;
}

}  // namespace umbp::texts
