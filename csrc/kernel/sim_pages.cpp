#include "kernel/sim_pages.h"

#include <algorithm>
#include <iterator>

namespace umbp {

void PageRuns::split_nodes(const NodeCounts& in, uint64_t k, NodeCounts* head, NodeCounts* tail) {
  for (const auto& [node, c] : in) {
    uint64_t h = std::min(c, k);
    if (h && head) head->push_back({node, h});
    if (c > h && tail) tail->push_back({node, c - h});
    k -= h;
  }
}

void PageRuns::split_at(uint64_t at) {
  auto it = runs_.upper_bound(at);
  if (it == runs_.begin()) return;
  --it;
  uint64_t s = it->first;
  Run& r = it->second;
  if (at <= s || at >= s + r.len) return;
  Run tail;
  tail.len = s + r.len - at;
  tail.state = r.state;
  if (r.state == PageState::Faulted) {
    NodeCounts head;
    split_nodes(r.nodes, at - s, &head, &tail.nodes);
    r.nodes = std::move(head);
  }
  r.len = at - s;
  runs_.emplace(at, std::move(tail));
}

void PageRuns::merge_around(uint64_t at) {
  auto it = runs_.find(at);
  if (it == runs_.end()) return;
  // Append run q (adjacent, same state) to run p, joining the node counts where they meet.
  auto absorb = [](Run& p, const Run& q) {
    for (const auto& nc : q.nodes) {
      if (!p.nodes.empty() && p.nodes.back().first == nc.first)
        p.nodes.back().second += nc.second;
      else
        p.nodes.push_back(nc);
    }
    p.len += q.len;
  };
  // Merge with the previous run, then with the next.
  if (it != runs_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.len == it->first && prev->second.state == it->second.state) {
      absorb(prev->second, it->second);
      runs_.erase(it);
      it = prev;
    }
  }
  auto next = std::next(it);
  if (next != runs_.end() && it->first + it->second.len == next->first &&
      it->second.state == next->second.state) {
    absorb(it->second, next->second);
    runs_.erase(next);
  }
}

PageSegments PageRuns::segments(uint64_t first, uint64_t count) const {
  PageSegments out;
  uint64_t end = first + count;
  uint64_t pos = first;
  auto it = runs_.upper_bound(first);
  if (it != runs_.begin()) --it;
  for (; it != runs_.end() && it->first < end; ++it) {
    uint64_t s = it->first, e = s + it->second.len;
    if (e <= pos) continue;
    if (s > pos) {
      out.push_back({pos, s - pos, PageState::None, {}});
      pos = s;
    }
    uint64_t cs = std::max(s, pos), ce = std::min(e, end);
    PageSegment seg{cs, ce - cs, it->second.state, {}};
    if (seg.state == PageState::Faulted && cs == s && ce == e) {
      seg.nodes = it->second.nodes;  // the whole run
    } else if (seg.state == PageState::Faulted) {
      NodeCounts skip_tail, mid;
      split_nodes(it->second.nodes, cs - s, nullptr, &skip_tail);
      split_nodes(skip_tail, ce - cs, &mid, nullptr);
      seg.nodes = std::move(mid);
    }
    out.push_back(std::move(seg));
    pos = ce;
  }
  if (pos < end) out.push_back({pos, end - pos, PageState::None, {}});
  return out;
}

void PageRuns::assign(uint64_t first, uint64_t count, PageState state, const NodeCounts& nodes) {
  if (count == 0) return;
  uint64_t end = first + count;
  split_at(first);
  split_at(end);
  auto it = runs_.lower_bound(first);
  while (it != runs_.end() && it->first < end) it = runs_.erase(it);
  if (state == PageState::None) return;
  Run r;
  r.len = count;
  r.state = state;
  if (state == PageState::Faulted) r.nodes = nodes;
  runs_.emplace(first, std::move(r));
  merge_around(first);
}

uint64_t PageRuns::count(uint64_t first, uint64_t n, PageState state) const {
  // The runs overlapping [first, first+n), walked in place: no segments (and their node
  // counts) built to be counted (this is on every fault and mmap).
  const uint64_t end = first + n;
  uint64_t covered = 0, total = 0;
  auto it = runs_.upper_bound(first);
  if (it != runs_.begin()) --it;
  for (; it != runs_.end() && it->first < end; ++it) {
    const uint64_t s = std::max(it->first, first), e = std::min(it->first + it->second.len, end);
    if (e <= s) continue;
    covered += e - s;
    if (it->second.state == state) total += e - s;
  }
  return state == PageState::None ? n - covered : total;
}

}  // namespace umbp
