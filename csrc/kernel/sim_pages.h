// PageRuns: the state of every page of a backing object, kept as interval runs so that a mapping
// of 2^31 pages costs a few map entries. Pages not covered by a run are "None" (neither reserved
// nor faulted).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>

#include "kernel/small_vec.h"

namespace umbp {

enum class PageState : uint8_t { None, Reserved, Faulted };

// Faulted pages of a run by node, in page order: {node, count}. Inline: a run's pages are on one
// or two nodes on most hosts.
using NodeCounts = SmallVec<std::pair<int, uint64_t>, 2>;

struct PageSegment {
  uint64_t start = 0;
  uint64_t len = 0;
  PageState state = PageState::None;
  NodeCounts nodes;  // Faulted only
};
// Most ranges asked about are one run, or a run and a gap.
using PageSegments = SmallVec<PageSegment, 2>;

class PageRuns {
 public:
  // The pieces of [first, first+count), gaps included as None segments, in order.
  PageSegments segments(uint64_t first, uint64_t count) const;
  // Overwrite [first, first+count) with one state (nodes: for Faulted, summing to count).
  void assign(uint64_t first, uint64_t count, PageState state, const NodeCounts& nodes = {});
  // Pages of each state in [first, first+count).
  uint64_t count(uint64_t first, uint64_t count, PageState state) const;
  void clear() { runs_.clear(); }

  // Split node counts at `k` pages: the first k pages go to `head`, the rest to `tail`.
  static void split_nodes(const NodeCounts& in, uint64_t k, NodeCounts* head, NodeCounts* tail);

 private:
  struct Run {
    uint64_t len = 0;
    PageState state = PageState::None;
    NodeCounts nodes;
  };
  void split_at(uint64_t at);
  void merge_around(uint64_t at);
  std::map<uint64_t, Run> runs_;  // by start index; never None
};

}  // namespace umbp
