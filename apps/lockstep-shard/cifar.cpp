// lockstep-shard cifar: the CIFAR-10/100 binary batches to a train and a test set, both
// normalised with the training set's statistics, carrying the class names when the folder has
// them.
#include <cstdio>

#include "image_commands.hpp"
#include "lockstep/data/cifar.hpp"

namespace lockstep::shard_app {

int cmd_cifar(Options o) {
  const std::string source = o.need("source"), out = o.need("out");
  const std::string labels = o.get("labels", "fine");
  const std::int64_t shards = o.get_int("shards", 1);
  data::ShardWriterOptions writer;
  writer.deflate_level = static_cast<int>(o.get_int("deflate", data::kDefaultDeflateLevel));
  o.check_all_used();
  LOCKSTEP_CHECK_HINT(labels == "fine" || labels == "coarse",
                      "fine: CIFAR-100's 100 classes; coarse: its 20 superclasses",
                      "--labels=", labels, " is neither fine nor coarse");
  const data::CifarSplits cifar = data::read_cifar(source, labels == "coarse");
  std::vector<float> mean, stddev;
  data::channel_stats(cifar.train.x, mean, stddev);
  for (const auto* split : {&cifar.train, &cifar.test}) {
    const char* name = split == &cifar.train ? "train" : "test";
    const auto paths = data::write_shard_set(*split, out, name, shards, mean, stddev, writer);
    std::printf("%s %s: %lld images of u8 [3, 32, 32], %lld classes, %zu shard(s) in %s\n",
                cifar.kind.c_str(), name, static_cast<long long>(split->x.dim(0)),
                static_cast<long long>(split->num_classes), paths.size(), out.c_str());
  }
  for (std::size_t c = 0; c < mean.size(); ++c)
    std::printf("  channel %zu: mean %.6f std %.6f\n", c, mean[c], stddev[c]);
  if (cifar.train.class_names.empty())
    std::printf("  no class names (%s has no label-name file)\n", source.c_str());
  return 0;
}

}  // namespace lockstep::shard_app
