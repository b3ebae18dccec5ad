// Fuzz target `csv`: read_csv with options chosen by the input's first two bytes, the rest being
// the CSV text.
//   byte 0: bit 0 dtype (0 f32, 1 u8); bits 1-2 label column ("0", "1", "label", "2");
//           bits 3-4 --classes (0 = max label + 1, 2, 10, 256)
//   byte 1: features = 1 + byte % 6; bit 3 picks the sample shape [features] or [1, features]
// Properties of accepted input: one label per sample, every label below num_classes, and every
// f32 value finite (NaN/Inf and values beyond float's range are rejected by the importer).
#include <cmath>

#include "fuzz_support.hpp"
#include "lockstep/data/importers.hpp"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::ScratchFile file("csv");
  if (size < 2) return 0;
  static const char* const kLabel[] = {"0", "1", "label", "2"};
  static const std::int64_t kClasses[] = {0, 2, 10, 256};
  data::CsvOptions o;
  o.dtype = (data[0] & 1) ? DType::U8 : DType::F32;
  o.label_column = kLabel[(data[0] >> 1) & 3];
  o.num_classes = kClasses[(data[0] >> 3) & 3];
  const std::int64_t features = 1 + data[1] % 6;
  o.sample_shape = (data[1] & 8) ? Shape{1, features} : Shape{features};
  file.write(std::string_view(reinterpret_cast<const char*>(data) + 2, size - 2));

  fuzz::accepts([&] {
    data::LabeledArray d = data::read_csv(file.path(), o);
    const auto n = static_cast<std::int64_t>(d.y.size());
    Shape want{n};
    want.insert(want.end(), o.sample_shape.begin(), o.sample_shape.end());
    LOCKSTEP_FUZZ_ASSERT(n > 0 && d.x.shape() == want && d.x.dtype() == o.dtype, d.x.describe(),
                         " for ", n, " labels");
    for (auto y : d.y)
      LOCKSTEP_FUZZ_ASSERT(y >= 0 && y < d.num_classes, "label ", y, " of ", d.num_classes);
    if (o.dtype == DType::F32) {
      const float* x = d.x.data<float>();
      for (std::int64_t i = 0; i < d.x.numel(); ++i)
        LOCKSTEP_FUZZ_ASSERT(std::isfinite(x[i]), "value ", i, " is ", x[i]);
    }
  });
  return 0;
}
