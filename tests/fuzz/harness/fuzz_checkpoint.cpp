// Fuzz target `checkpoint`: the input is one file. A file that starts like a checkpoint (the
// "LOCKSTEP-CHECKPOINT" user-block header) is first resealed -- its header's size and CRC are
// recomputed over the mutated bytes -- so the fuzzer gets past the whole-file checksum into the
// header parser and HDF5; read_checkpoint then reads it. Any other file is read as a parameter
// export (read_exported_parameters), which has no checksum in front of HDF5.
// Properties: a checkpoint read back has unique, non-empty tensor names; after every input no
// HDF5 object may be left open.
#include <algorithm>

#include "fuzz_support.hpp"
#include "lockstep/train/checkpoint.hpp"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::ScratchFile file("checkpoint.h5");
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  file.write(bytes);
  if (bytes.rfind("LOCKSTEP-CHECKPOINT", 0) == 0) {
    fuzz::accepts([&] { train::detail::reseal_checkpoint_for_test(file.path()); });
    fuzz::accepts([&] {
      train::CheckpointState s = train::read_checkpoint(file.path());
      std::vector<std::string> names;
      for (const auto& [name, tensor] : s.tensors) {
        LOCKSTEP_FUZZ_ASSERT(!name.empty() && tensor.defined(), "tensor '", name, "'");
        names.push_back(name);
      }
      std::sort(names.begin(), names.end());
      LOCKSTEP_FUZZ_ASSERT(std::adjacent_find(names.begin(), names.end()) == names.end(),
                           "two tensors share a name");
    });
    fuzz::expect_no_open_hdf5_objects("read_checkpoint");
  } else {
    fuzz::accepts([&] { train::read_exported_parameters(file.path()); });
    fuzz::expect_no_open_hdf5_objects("read_exported_parameters");
  }
  return 0;
}
