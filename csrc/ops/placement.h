// Memory kinds (where a buffer lives) and the placement op that moves a value
// between them (ops/placement.cpp). Used by lowering (argument and result
// memory kinds of @main) and by graph cuts (the cache key, donation).
#pragma once
#include <string>
#include "ir/node.h"

namespace txc {

enum MemoryKind : uint8_t { kDevice = 0, kPinnedHost = 1 };

const char* memory_kind_name(int kind);      // "device", "pinned_host"
int parse_memory_kind(const std::string& s);  // -1 when unknown

// The memory kind a node's value lives in: a "place" node's target kind, a
// data node's buffer's kind, else the device.
int memory_kind_of(const Node& n);

// StableHLO for moving value `v` of node type `type` into `kind`:
// custom_call @annotate_device_placement, as XLA's host-offload passes expect.
class LowerCtx;
std::string annotate_placement(LowerCtx& cx, const std::string& v, const std::string& type, int kind);

}  // namespace txc
