// Where a tensor's memory lives. Only ops/ dereferences device memory; everything above just
// passes Devices around.
#pragma once

#include <string>

namespace lockstep {

// EMU is the emulated GPU (src/ops/emu): memory the host cannot dereference, asynchronous streams
// and events, the CPU's kernels. It lets every device code path run on machines without a GPU.
enum class DeviceKind { CPU, CUDA, EMU };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device cuda(int index) { return {DeviceKind::CUDA, index}; }
  static Device emu(int index) { return {DeviceKind::EMU, index}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  bool is_emu() const { return kind == DeviceKind::EMU; }
  std::string str() const;  // "cpu", "cuda:3" or "emu:1"
  bool operator==(const Device&) const = default;
};

// Parses "cpu", "cuda", "cuda:N", "emu", "emu:N" (throws lockstep::Error naming the text
// otherwise, and for emu:N past emu_device_count()).
Device parse_device(const std::string& text);

// True when this binary has the CUDA backend and at least one GPU answers.
bool cuda_available();
int cuda_device_count();  // 0 without a backend or without GPUs

// Emulated GPUs this process has: LOCKSTEP_EMU_DEVICES (default 8), 0 in a build without the
// emulated device (cmake -DLOCKSTEP_EMU=OFF).
int emu_device_count();
bool emu_available();

}  // namespace lockstep
