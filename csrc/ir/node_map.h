// NodeMap: a flat open-addressing map from node pointers to small values,
// the scratch of a graph walk (GraphCut's post-order positions). Nodes are
// immutable and hold no marks, so a walk keeps its own here: one per thread,
// in trace/graph.cpp's WalkScratch, cleared at the start of each walk (its
// storage is reused), so a walk that throws leaves nothing for the next.
//
// One power-of-two array of (key, value) slots, linear probing, grown to
// keep at most half of it full; no erase. A std::unordered_map allocates a
// node per entry: on a 2000-node cut that made the walk ~4x slower than
// the marks nodes used to carry (bench/README.md, "cut walk").
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace txc {

struct Node;

template <class V>
class NodeMap {
 public:
  explicit NodeMap(size_t expected = 8) { reset(expected); }

  // Empties the map, keeping its array when it is big enough for
  // `expected` entries (a walk's scratch reused by the next walk).
  void reset(size_t expected) {
    size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    if (slots_.size() >= cap && slots_.size() <= 4 * cap) {
      std::fill(slots_.begin(), slots_.end(), Slot{});
    } else {
      std::vector<Slot>(cap).swap(slots_);
    }
    size_ = 0;
  }

  // Inserts (k, v) if k is absent. Returns k's value slot and whether it
  // was inserted; the pointer is valid until the next insertion.
  std::pair<V*, bool> emplace(const Node* k, V v) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    Slot* s = probe(k);
    if (s->key == k) return {&s->value, false};
    s->key = k;
    s->value = std::move(v);
    ++size_;
    return {&s->value, true};
  }

  // k's value, or nullptr when k is absent.
  V* find(const Node* k) {
    Slot* s = probe(k);
    return s->key == k ? &s->value : nullptr;
  }
  const V* find(const Node* k) const { return const_cast<NodeMap*>(this)->find(k); }

  size_t size() const { return size_; }
  // Changes exactly when the map grows (value pointers then move).
  size_t capacity() const { return slots_.size(); }

 private:
  struct Slot {
    const Node* key = nullptr;
    V value{};
  };

  static size_t hash(const Node* k) {
    uint64_t x = uint64_t(reinterpret_cast<uintptr_t>(k));
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;  // murmur3's finalizer: allocator addresses differ in few bits
    x ^= x >> 33;
    return size_t(x);
  }

  // k's slot, or the empty slot where k would go.
  Slot* probe(const Node* k) {
    size_t mask = slots_.size() - 1;
    for (size_t i = hash(k) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.key == k || s.key == nullptr) return &s;
    }
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (Slot& s : old)
      if (s.key) *probe(s.key) = std::move(s);
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace txc
