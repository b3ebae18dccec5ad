#include <cstdlib>

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
  switch (kind) {
    case DeviceKind::CPU:
      return "cpu";
    case DeviceKind::CUDA:
      return "cuda:" + std::to_string(index);
    case DeviceKind::EMU:
      return "emu:" + std::to_string(index);
  }
  return "?";
}

namespace {

// The N of "PREFIX:N", or -1 when text is not of that form.
int device_index(const std::string& text, const std::string& prefix) {
  if (text.rfind(prefix + ":", 0) != 0) return -1;
  const std::string digits = text.substr(prefix.size() + 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  try {
    return std::stoi(digits);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (const int i = device_index(text, "cuda"); i >= 0) return Device::cuda(i);
  if (text == "emu" || device_index(text, "emu") >= 0) {
    const int i = text == "emu" ? 0 : device_index(text, "emu");
    const int n = emu_device_count();
    LOCKSTEP_CHECK_HINT(n > 0, "rebuild with -DLOCKSTEP_EMU=ON (the default), or use cpu",
                        "device '", text, "': this build has no emulated device");
    LOCKSTEP_CHECK_HINT(i < n, "set LOCKSTEP_EMU_DEVICES to have more", "device '", text,
                        "': this process has ", n, " emulated devices (emu:0 to emu:", n - 1, ")");
    return Device::emu(i);
  }
  LOCKSTEP_FAIL("unknown device '", text, "' (expected cpu, cuda, cuda:N, emu or emu:N)");
}

int emu_device_count() {
#ifdef LOCKSTEP_HAVE_EMU
  // Read once: the emulated devices are fixed for the life of the process, as GPUs are.
  static const int count = [] {
    const char* text = std::getenv("LOCKSTEP_EMU_DEVICES");
    if (!text || !*text) return 8;
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    LOCKSTEP_CHECK(end && *end == '\0' && n >= 0 && n <= 1024, "LOCKSTEP_EMU_DEVICES = '", text,
                   "' is not a device count from 0 to 1024");
    return static_cast<int>(n);
  }();
  return count;
#else
  return 0;
#endif
}

bool emu_available() {
  return emu_device_count() > 0;
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
