#include "lockstep/train/state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/ops.hpp"

namespace fs = std::filesystem;

namespace lockstep::train {
namespace {

// Checkpoint names of the state's parts. Attributes are strings: integers in decimal.
constexpr const char* kParam = "param/";
constexpr const char* kBuffer = "buffer/";
constexpr const char* kOptim = "optim/";
constexpr const char* kOptimizerSteps = "optimizer_steps";
constexpr const char* kDropoutCalls = "dropout_calls";
constexpr const char* kSamplesPerLoaderBatch = "samples_per_loader_batch";
constexpr const char* kParallel = "parallel";

}  // namespace

TrainState::TrainState(nn::Model& model, optim::Optimizer& optimizer, RunLayout layout)
    : model_(model), optimizer_(optimizer), layout_(std::move(layout)) {}

CheckpointState TrainState::to_checkpoint() const {
  CheckpointState s;
  s.step = step;
  s.epoch = position.epoch;
  s.batch_in_epoch = position.batch_in_epoch;
  s.world_size = layout_.world_size;
  s.config_ini = layout_.config_ini;
  s.model_structure = model_.structure();
  s.attrs[kOptimizerSteps] = std::to_string(optimizer_.steps());
  s.attrs[kDropoutCalls] = std::to_string(model_.dropout_calls());
  s.attrs[kSamplesPerLoaderBatch] = std::to_string(layout_.samples_per_loader_batch);
  s.attrs[kParallel] = layout_.parallel;
  for (nn::Parameter* p : model_.parameters())
    s.tensors.emplace_back(kParam + p->name, p->value);
  for (nn::Buffer* b : model_.buffers())
    s.tensors.emplace_back(kBuffer + b->name, b->value);
  for (optim::StateTensor& t : optimizer_.state())
    s.tensors.emplace_back(kOptim + t.name, t.value);
  return s;
}

void TrainState::restore(ops::Context& ctx, const CheckpointState& c, const std::string& path) {
  LOCKSTEP_CHECK_HINT(c.model_structure == model_.structure(),
                      "resume with the model.spec and data the checkpoint was made with",
                      "checkpoint ", path,
                      " holds a different model than model.spec = ", model_.spec());
  auto attr = [&](const char* key) -> std::int64_t {
    auto it = c.attrs.find(key);
    LOCKSTEP_CHECK(it != c.attrs.end(), "checkpoint ", path, " has no attribute '", key, "'");
    try {
      return std::stoll(it->second);
    } catch (const std::exception&) {
      LOCKSTEP_FAIL("checkpoint ", path, ": attribute '", key, "' is '", it->second,
                    "', not an integer");
    }
  };
  for (nn::Parameter* p : model_.parameters())
    ops::copy(ctx, c.tensor(kParam + p->name), p->value);
  for (nn::Buffer* b : model_.buffers())
    ops::copy(ctx, c.tensor(kBuffer + b->name), b->value);
  for (optim::StateTensor& t : optimizer_.state())
    ops::copy(ctx, c.tensor(kOptim + t.name), t.value);
  optimizer_.set_steps(attr(kOptimizerSteps));
  model_.set_dropout_calls(static_cast<std::uint64_t>(attr(kDropoutCalls)));
  step = c.step;
  position.epoch = c.epoch;
  const std::int64_t batch = rescale_batch_in_epoch(c.batch_in_epoch, attr(kSamplesPerLoaderBatch),
                                                    layout_.samples_per_loader_batch);
  // Whole optimizer steps only: a partial accumulation is replayed.
  position.batch_in_epoch = batch / layout_.accumulation * layout_.accumulation;
}

std::string TrainState::save(const std::string& dir, int keep) const {
  const std::string path = checkpoint_path(dir, step);
  write_checkpoint(path, to_checkpoint());
  prune_checkpoints(dir, keep);
  return path;
}

std::string on_rank0(comm::Communicator& comm, const std::function<std::string()>& fn) {
  // One broadcast carries either the result or the error: "ok\n<result>" or
  // "error\n<message>\0<hint>".
  std::string outcome;
  if (comm.rank() == 0) {
    try {
      outcome = "ok\n" + fn();
    } catch (const Error& e) {
      outcome = "error\n" + e.message() + '\0' + e.hint();
    }
  }
  outcome = comm.broadcast(outcome, 0);
  if (outcome.rfind("ok\n", 0) == 0) return outcome.substr(3);
  const std::string body = outcome.substr(6);
  const auto split = body.find('\0');
  throw Error(body.substr(0, split), split == std::string::npos ? "" : body.substr(split + 1),
              __FILE__, __LINE__);
}

std::string choose_resume(const Config& config, comm::Communicator& comm,
                          const std::function<void(const std::string&)>& warn, bool writes) {
  (void)writes;
  if (config.train_resume != "auto") return config.train_resume;
  LOCKSTEP_CHECK_HINT(!config.checkpoint_dir.empty(), "set checkpoint.dir",
                      "train.resume = auto needs checkpoint.dir to look in");
  std::vector<std::string> warnings;
  std::string chosen = on_rank0(comm, [&]() -> std::string {
    return find_latest_checkpoint(config.checkpoint_dir,
                                  [&](const std::string& w) { warnings.push_back(w); })
        .value_or("");
  });
  for (const std::string& w : warnings)
    if (warn) warn(w);
  return chosen;
}

}  // namespace lockstep::train
