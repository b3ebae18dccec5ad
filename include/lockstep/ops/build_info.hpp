// What this build of lockstep is and can do, for `lockstep-train --version` and bug reports: the
// version, the libraries compiled in (CUDA, cuDNN, NCCL, oneDNN), and what this machine offers at
// run time (GPUs visible, the CPU's bf16 units as oneDNN sees them).
#pragma once

#include <string>

namespace lockstep::ops {

// "lockstep 0.1.0" and then one "  key: value" line per capability, each line ending in '\n'.
std::string build_info();

}  // namespace lockstep::ops
