#include "lockstep/ops/precision.hpp"

#include "lockstep/core/error.hpp"

namespace lockstep::ops {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::TF32:
      return "tf32";
    case Precision::BF16:
      return "bf16";
  }
  return "?";
}

Precision precision_from_name(const std::string& name) {
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
    if (name == precision_name(p)) return p;
  LOCKSTEP_FAIL("unknown precision '", name, "' (expected fp32, tf32 or bf16)");
}

}  // namespace lockstep::ops
