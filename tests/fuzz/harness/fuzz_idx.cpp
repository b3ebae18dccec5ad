// Fuzz target `idx`: read_idx_u8 and read_idx_pair on raw or gzipped bytes.
// Input: IMAGES, or IMAGES <separator> LABELS to read the two as an MNIST pair.
// Properties of accepted input: a raw (not gzipped) file's tensor holds exactly the bytes after
// its header; a pair has one label per image and num_classes = max label + 1.
#include <algorithm>
#include <cstring>

#include "fuzz_support.hpp"
#include "lockstep/data/importers.hpp"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::ScratchFile images_file("idx-images"), labels_file("idx-labels");
  const std::vector<std::string> parts = fuzz::split_input(data, size);
  const std::string& images = parts[0];
  images_file.write(images);
  if (parts.size() == 1) {
    fuzz::accepts([&] {
      Tensor t = data::read_idx_u8(images_file.path());
      const bool gzipped = images.size() >= 2 && static_cast<unsigned char>(images[0]) == 0x1f &&
                           static_cast<unsigned char>(images[1]) == 0x8b;
      if (gzipped) return;
      const std::size_t header = 4 + 4 * static_cast<std::size_t>(t.ndim());
      LOCKSTEP_FUZZ_ASSERT(images.size() == header + t.nbytes(), "the file has ", images.size(),
                           " bytes, the tensor ", t.describe());
      LOCKSTEP_FUZZ_ASSERT(std::memcmp(images.data() + header, t.raw_data(), t.nbytes()) == 0,
                           "the tensor differs from the file's data bytes");
    });
    return 0;
  }
  labels_file.write(parts[1]);
  fuzz::accepts([&] {
    data::LabeledArray d = data::read_idx_pair(images_file.path(), labels_file.path());
    LOCKSTEP_FUZZ_ASSERT(d.x.ndim() == 4 && d.x.dim(0) == static_cast<std::int64_t>(d.y.size()),
                         d.x.describe(), " for ", d.y.size(), " labels");
    std::int64_t max_label = -1;
    for (auto v : d.y)
      max_label = std::max<std::int64_t>(max_label, v);
    LOCKSTEP_FUZZ_ASSERT(d.num_classes == max_label + 1, d.num_classes, " classes, max label ",
                         max_label);
  });
  return 0;
}
