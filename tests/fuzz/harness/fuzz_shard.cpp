// Fuzz target `shard`: the input is one shard file. It is opened with ShardFile::open (every
// label and, when small, every sample read), then as a one-file ShardedDataset read into memory
// and again read on demand.
// Properties of an accepted shard: the two datasets return the same bytes and labels for the
// same indices, and every label is in [0, num_classes). After every input, accepted or not, no
// HDF5 object may be left open.
#include <cstring>

#include "fuzz_support.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/shard.hpp"

using namespace lockstep;

namespace {
// Reads past this size are skipped: a valid small shard covers every code path.
constexpr std::int64_t kMaxReadBytes = 4 << 20;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::ScratchFile file("shard.h5");
  file.write(std::string_view(reinterpret_cast<const char*>(data), size));

  fuzz::accepts([&] {
    auto shard = data::ShardFile::open(file.path());
    const data::ShardMeta& m = shard->meta();
    std::vector<std::int32_t> y = shard->read_y();
    LOCKSTEP_FUZZ_ASSERT(static_cast<std::int64_t>(y.size()) == m.num_samples, y.size(),
                         " labels for ", m.num_samples, " samples");
    if (m.num_samples * m.sample_bytes() <= kMaxReadBytes) {
      std::vector<char> x(static_cast<std::size_t>(m.num_samples * m.sample_bytes()));
      shard->read_x(0, m.num_samples, x.data());
    }
  });
  fuzz::expect_no_open_hdf5_objects("ShardFile::open");

  fuzz::accepts([&] {
    auto resident =
        data::ShardedDataset::open(std::vector<std::string>{file.path()}, kMaxReadBytes);
    auto on_demand = data::ShardedDataset::open(std::vector<std::string>{file.path()}, 0);
    const std::int64_t n = resident->size();
    LOCKSTEP_FUZZ_ASSERT(n == on_demand->size(), n, " vs ", on_demand->size());
    if (n == 0 || !resident->in_memory()) return;
    const std::vector<std::int64_t> indices{n - 1, 0, n / 2, n / 2, n - 1};
    Tensor x1, y1, x2, y2;
    resident->gather(indices, x1, y1);
    on_demand->gather(indices, x2, y2);
    LOCKSTEP_FUZZ_ASSERT(
        x1.nbytes() == x2.nbytes() && std::memcmp(x1.raw_data(), x2.raw_data(), x1.nbytes()) == 0,
        "in-memory and on-demand samples differ");
    LOCKSTEP_FUZZ_ASSERT(y1.to_vector<std::int32_t>() == y2.to_vector<std::int32_t>(),
                         "in-memory and on-demand labels differ");
    for (auto label : y1.to_vector<std::int32_t>())
      LOCKSTEP_FUZZ_ASSERT(label >= 0 && label < resident->num_classes(), "label ", label);
  });
  fuzz::expect_no_open_hdf5_objects("ShardedDataset::open");
  return 0;
}
