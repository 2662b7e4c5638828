// The walk of a replayed step's inputs (replay/_walk.py Walk), shared by
// py/replay_walk.cpp (the walk) and py/replay.cpp (ReplayPlan, which writes
// outputs back to the locations the walk found).
#pragma once
#include <pybind11/pybind11.h>

namespace txc {

// Where an input slot's tensor lives (replay/_walk.py's Walk kinds): parallel
// lists kinds / owners / keys, so that a walk allocates nothing per tensor.
// An interned Python string (attribute names read per tensor), made once by each static.
inline PyObject* str(const char* s) { return PyUnicode_InternFromString(s); }

enum Where { kArg = 0, kParam = 1, kGrad = 2, kBuffer = 3, kState = 4, kGroup = 5 };

void bind_replay_walk(pybind11::module_& m);

}  // namespace txc
