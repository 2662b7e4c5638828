// Memory kinds: where a value's buffer lives (device memory or pinned host
// memory). A data node's kind is Node::memory; a value moved by the core op
// "place" (ops/placement.cpp) lives in that op's kind. Read by the lowering
// (memory kinds of @main's arguments and results, lower/emitter.cpp) and by
// graph cuts (the cache key, donation: trace/graph.cpp).
#pragma once
#include <cstdint>
#include <string>
#include "ir/node.h"

namespace txc {

enum MemoryKind : uint8_t { kDevice = 0, kPinnedHost = 1 };

const char* memory_kind_name(int kind);      // "device", "pinned_host"
int parse_memory_kind(const std::string& s);  // -1 when unknown

// The memory kind a node's value lives in: a "place" node's target kind, a
// data node's buffer's kind, else the device.
int memory_kind_of(const Node& n);

}  // namespace txc
