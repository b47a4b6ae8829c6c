// SmallVec<T, N>: a vector whose first N elements live inside it. The simulator's per-call lists
// (a run's node counts, a fault's node order, a range's segments) hold one or two items on
// almost every call; as std::vectors each cost a malloc and a free per alloc+free of a buffer.
// Past N elements they all move to a std::vector. Only what the simulator uses of a vector.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <new>
#include <utility>
#include <vector>

namespace umbp {

template <typename T, size_t N>
class SmallVec {
 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVec() = default;
  SmallVec(std::initializer_list<T> items) {
    for (const T& x : items) push_back(x);
  }
  template <typename It>
  SmallVec(It first, It last) {
    for (; first != last; ++first) push_back(*first);
  }
  SmallVec(const SmallVec& o) { copy_from(o); }
  SmallVec(SmallVec&& o) noexcept { move_from(o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) {
      clear();
      copy_from(o);
    }
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) {
      clear();
      move_from(o);
    }
    return *this;
  }
  ~SmallVec() { destroy_inline(); }

  size_t size() const { return heap_used_ ? heap_.size() : size_; }
  bool empty() const { return size() == 0; }
  T* data() { return heap_used_ ? heap_.data() : inline_data(); }
  const T* data() const { return heap_used_ ? heap_.data() : inline_data(); }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size() - 1]; }
  const T& back() const { return data()[size() - 1]; }

  void push_back(const T& x) { emplace_back(x); }
  void push_back(T&& x) { emplace_back(std::move(x)); }
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    if (!heap_used_ && size_ < N) {
      T* x = new (inline_data() + size_) T(std::forward<Args>(args)...);
      ++size_;
      return *x;
    }
    if (!heap_used_) spill();
    heap_.emplace_back(std::forward<Args>(args)...);
    return heap_.back();
  }
  void clear() {
    destroy_inline();
    heap_.clear();
    heap_used_ = false;
  }

  bool operator==(const SmallVec& o) const {
    return size() == o.size() && std::equal(begin(), end(), o.begin());
  }

 private:
  // Past N: every element moves to heap_.
  void spill() {
    heap_.reserve(2 * N);
    for (size_t i = 0; i < size_; ++i) heap_.push_back(std::move(inline_data()[i]));
    destroy_inline();
    heap_used_ = true;
  }
  void copy_from(const SmallVec& o) {
    for (const T& x : o) push_back(x);
  }
  void move_from(SmallVec& o) {
    if (o.heap_used_) {
      heap_ = std::move(o.heap_);
      heap_used_ = true;
    } else {
      for (size_t i = 0; i < o.size_; ++i) new (inline_data() + i) T(std::move(o.inline_data()[i]));
      size_ = o.size_;
    }
    o.clear();
  }

  T* inline_data() { return std::launder(reinterpret_cast<T*>(inline_)); }
  const T* inline_data() const { return std::launder(reinterpret_cast<const T*>(inline_)); }
  void destroy_inline() {
    for (size_t i = 0; i < size_; ++i) inline_data()[i].~T();
    size_ = 0;
  }

  // Raw storage: an empty SmallVec constructs no T (a range's segments are made per fault).
  alignas(T) unsigned char inline_[N * sizeof(T)];
  size_t size_ = 0;  // elements constructed in inline_ (0 once they are in heap_)
  bool heap_used_ = false;
  std::vector<T> heap_;
};

}  // namespace umbp
