// Memory kinds (see memory.h).
#include "ir/memory.h"
#include "ir/op.h"

namespace txc {

const char* memory_kind_name(int kind) { return kind == kPinnedHost ? "pinned_host" : "device"; }

int parse_memory_kind(const std::string& s) {
  if (s == "device") return kDevice;
  if (s == "pinned_host") return kPinnedHost;
  return -1;
}

int memory_kind_of(const Node& n) {
  static const uint16_t data = op_id("data"), place = op_id("place");
  if (n.op == data) return n.memory;
  if (n.op == place) return parse_memory_kind(n.attr_str(0));
  return kDevice;
}

}  // namespace txc
