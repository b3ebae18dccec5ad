#include "lockstep/core/device.hpp"
#include "lockstep/core/dtype.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::I32:
      return "i32";
    case DType::U8:
      return "u8";
    case DType::BF16:
      return "bf16";
    case DType::F64:
      return "f64";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::F32, DType::I32, DType::U8, DType::BF16, DType::F64})
    if (name == dtype_name(t)) return t;
  LOCKSTEP_FAIL("unknown dtype '", name, "' (expected f32, i32, u8, bf16 or f64)");
}

std::string Device::str() const {
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    try {
      std::size_t used = 0;
      int index = std::stoi(text.substr(5), &used);
      if (used == text.size() - 5 && index >= 0) return Device::cuda(index);
    } catch (const std::exception&) {
    }
  }
  LOCKSTEP_FAIL("unknown device '", text, "' (expected cpu, cuda or cuda:N)");
}

#ifndef LOCKSTEP_HAVE_CUDA
bool cuda_available() {
  return false;
}
int cuda_device_count() {
  return 0;
}
#endif

}  // namespace lockstep
