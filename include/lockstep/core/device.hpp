// Where a tensor's memory lives. Only ops/ dereferences device memory; everything above just
// passes Devices around.
#pragma once

#include <string>

namespace lockstep {

enum class DeviceKind { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device cuda(int index) { return {DeviceKind::CUDA, index}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  std::string str() const;  // "cpu" or "cuda:3"
  bool operator==(const Device&) const = default;
};

// Parses "cpu", "cuda", "cuda:N" (throws lockstep::Error naming the text otherwise).
Device parse_device(const std::string& text);

// True when this binary has the CUDA backend and at least one GPU answers.
bool cuda_available();
int cuda_device_count();  // 0 without a backend or without GPUs

}  // namespace lockstep
