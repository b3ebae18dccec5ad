#include "lockstep/train/state.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <utility>

#include "lockstep/core/error.hpp"
#include "lockstep/core/file.hpp"
#include "lockstep/ops/ops.hpp"
#include "lockstep/parallel/zero.hpp"

namespace fs = std::filesystem;

namespace lockstep::train {
namespace {

// Checkpoint names of the state's parts. Attributes are strings: integers in decimal.
constexpr const char* kParam = "param/";
constexpr const char* kBuffer = "buffer/";
constexpr const char* kOptim = "optim/";
constexpr const char* kOptimizerSteps = "optimizer_steps";
constexpr const char* kOptimizer = "optimizer";
constexpr const char* kDropoutCalls = "dropout_calls";
constexpr const char* kSamplesPerLoaderBatch = "samples_per_loader_batch";
constexpr const char* kParallel = "parallel";

std::string utc_stamp() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::gmtime(&now));
  return buf;
}

// A new folder DIR/replaced-<UTC second>[-N] for train.resume = fresh. mkdir fails on an existing
// folder, so two fresh starts within one second (or a folder left by hand) never share one, and
// no earlier run's moved checkpoints are overwritten.
fs::path make_replaced_folder(const std::string& dir) {
  const std::string base = (fs::path(dir) / ("replaced-" + utc_stamp())).string();
  for (int n = 1;; ++n) {
    const std::string path = n == 1 ? base : str(base, "-", n);
    if (::mkdir(path.c_str(), 0777) == 0) return path;
    LOCKSTEP_CHECK(
        errno == EEXIST && n < 1000, path,
        ": cannot create (train.resume = fresh moves the old checkpoints there): ", errno_text());
  }
}

std::string names_of(const std::vector<CheckpointFile>& files, std::size_t shown = 3) {
  std::string out;
  for (std::size_t i = 0; i < files.size() && i < shown; ++i)
    out += (i ? ", " : "") + fs::path(files[i].path).filename().string();
  if (files.size() > shown) out += str(" and ", files.size() - shown, " more");
  return out;
}

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
  s.attrs[kOptimizer] = optimizer_.type();
  s.attrs[kDropoutCalls] = std::to_string(model_.dropout_calls());
  s.attrs[kSamplesPerLoaderBatch] = std::to_string(layout_.samples_per_loader_batch);
  s.attrs[kParallel] = layout_.parallel;
  for (const auto& [key, value] : layout_.attrs)
    s.attrs[key] = value;
  // A padded table is stored without its padding (nn::unpadded), as the optimizer lists its state:
  // files do not depend on the padding of the model that wrote them.
  for (nn::Parameter* p : model_.parameters())
    s.tensors.emplace_back(kParam + p->name, nn::unpadded(*p, p->value));
  for (nn::Buffer* b : model_.buffers())
    s.tensors.emplace_back(kBuffer + b->name, b->value);
  const bool sharded = optimizer_.shard().sharded();
  LOCKSTEP_CHECK(!sharded || comm_ != nullptr,
                 "train state: a ZeRO-1 optimizer's state needs a communicator to be gathered");
  for (optim::StateTensor& t :
       sharded ? parallel::gather_optimizer_state(*comm_, optimizer_) : optimizer_.state())
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
  auto it = c.attrs.find(kOptimizer);
  const std::string saved =
      it != c.attrs.end() ? it->second : ini_value(c.config_ini, "optim.name");
  LOCKSTEP_CHECK_HINT(saved.empty() || saved == optimizer_.type(),
                      str("resume with --optim.name=", saved,
                          ", or start a new run (another checkpoint.dir) to change optimizer"),
                      "checkpoint ", path, " was written by optimizer '", saved,
                      "' but this run uses optim.name = ", optimizer_.type());
  for (nn::Parameter* p : model_.parameters()) {
    Tensor value = nn::unpadded(*p, p->value);  // the padding stays zero
    ops::copy(ctx, c.tensor(kParam + p->name), value);
  }
  for (nn::Buffer* b : model_.buffers())
    ops::copy(ctx, c.tensor(kBuffer + b->name), b->value);
  // Whole tensors in the file; a ZeRO-1 optimizer takes its shard's part (no communication).
  optimizer_.load_state(ctx, [&](const std::string& name) { return c.tensor(kOptim + name); });
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
  const CheckpointState state = to_checkpoint();  // collective under ZeRO-1
  if (layout_.rank != 0) return path;
  write_checkpoint(path, state);
  prune_checkpoints(dir, keep);
  return path;
}

BackgroundCheckpoints::~BackgroundCheckpoints() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: error: background checkpoint write: %s\n", e.what());
  }
}

void BackgroundCheckpoints::wait() {
  if (writer_.joinable()) writer_.join();
  if (std::exception_ptr error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
}

std::string BackgroundCheckpoints::save(const TrainState& state, const std::string& dir, int keep) {
  wait();
  const std::string path = checkpoint_path(dir, state.step);
  CheckpointState snapshot = state.to_checkpoint();  // collective under ZeRO-1
  if (state.layout().rank != 0) return path;
  // The tensors share the model's and optimizer's storage, which the next step overwrites.
  for (auto& [name, tensor] : snapshot.tensors)
    tensor = tensor.to(Device::cpu());
  writer_ = std::thread([this, path, dir, keep, snapshot = std::move(snapshot)] {
    try {
      write_checkpoint(path, snapshot);
      prune_checkpoints(dir, keep);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
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
  const std::string& resume = config.train_resume;
  const std::string& dir = config.checkpoint_dir;
  std::vector<std::string> warnings;
  std::string chosen = on_rank0(comm, [&]() -> std::string {
    const std::vector<CheckpointFile> existing =
        dir.empty() ? std::vector<CheckpointFile>{} : list_checkpoints(dir);
    if (resume.empty()) {
      LOCKSTEP_CHECK_HINT(existing.empty() || !writes,
                          "continue that run with --train.resume=auto, or start over with "
                          "--train.resume=fresh (moves them aside), or use another checkpoint.dir",
                          "checkpoint.dir = ", dir, " already holds ", existing.size(),
                          " checkpoint(s) (", names_of(existing),
                          ") and train.resume is empty: a fresh run would overwrite them");
      return "";
    }
    if (resume == "fresh") {
      if (existing.empty() || !writes) return "";
      const fs::path aside = make_replaced_folder(dir);
      std::error_code ec;
      for (const CheckpointFile& f : existing) {
        fs::rename(f.path, aside / fs::path(f.path).filename(), ec);
        LOCKSTEP_CHECK(!ec, f.path, ": cannot move to ", aside.string(), ": ", ec.message());
      }
      warnings.push_back(str("train.resume = fresh: moved ", existing.size(),
                             " old checkpoint(s) to ", aside.string()));
      return "";
    }
    if (resume == "auto") {
      LOCKSTEP_CHECK_HINT(!dir.empty(), "set checkpoint.dir",
                          "train.resume = auto needs checkpoint.dir to look in");
      if (existing.empty()) return "";
      // Only the newest: one that cannot be read is never skipped. A run resumed below it would
      // write a file of its name over it and prune the rest (a newer format version, or a copy
      // still arriving, is not damage to step around).
      const CheckpointFile& newest = existing.front();
      try {
        (void)read_checkpoint(newest.path);
      } catch (const Error& e) {
        const std::string older =
            existing.size() > 1 ? fs::path(existing[1].path).filename().string() : "";
        LOCKSTEP_FAIL_HINT(
            str("move it out of ", dir, older.empty() ? "" : " to resume from " + older,
                " (nothing there was written or pruned), or resume another checkpoint with "
                "--train.resume=FILE and a new checkpoint.dir",
                e.hint().empty() ? "" : "; " + e.hint()),
            "train.resume = auto: the newest checkpoint in ", dir,
            " cannot be read: ", e.message());
      }
      return newest.path;
    }
    // A named file: read fully by every rank later; here only the rule about newer files.
    if (writes && !dir.empty()) {
      std::vector<CheckpointFile> newer;
      std::int64_t step = -1;
      std::error_code ec;
      for (const CheckpointFile& f : existing) {
        if (fs::equivalent(f.path, resume, ec)) step = f.step;
      }
      if (step < 0) step = read_checkpoint(resume).step;
      for (const CheckpointFile& f : existing)
        if (f.step > step) newer.push_back(f);
      LOCKSTEP_CHECK_HINT(newer.empty(),
                          "set checkpoint.dir to a new folder for the continued run, or move the "
                          "newer checkpoints away",
                          "train.resume = ", resume, " is at step ", step,
                          " but checkpoint.dir = ", dir, " holds newer checkpoints (",
                          names_of(newer), "), which the continued run would replace");
    }
    return resume;
  });
  // Warnings were collected on rank 0; only it prints them (as every progress line).
  for (const std::string& w : warnings)
    if (warn) warn(w);
  return chosen;
}

void check_writable_folder(comm::Communicator& comm, const std::string& key,
                           const std::string& value, const std::string& dir) {
  on_rank0(comm, [&]() -> std::string {
    const std::string hint = "set " + key + " to a place this user can write";
    std::error_code ec;
    fs::create_directories(dir, ec);
    LOCKSTEP_CHECK_HINT(!ec, hint, key, " = ", value, ": cannot create the folder ", dir, ": ",
                        ec.message());
    const std::string probe = (fs::path(dir) / str(".tmp-write-test.", ::getpid())).string();
    const UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    LOCKSTEP_CHECK_HINT(fd.valid(), hint, key, " = ", value, ": cannot write in ", dir, ": ",
                        errno_text());
    const bool wrote = ::write(fd.get(), "x", 1) == 1;
    const std::string reason = errno_text();
    ::unlink(probe.c_str());
    LOCKSTEP_CHECK_HINT(wrote, hint, key, " = ", value, ": cannot write in ", dir, ": ", reason);
    return "";
  });
}

void check_outputs_writable(const Config& config, comm::Communicator& comm,
                            bool writes_checkpoints) {
  if (writes_checkpoints && !config.checkpoint_dir.empty())
    check_writable_folder(comm, "checkpoint.dir", config.checkpoint_dir, config.checkpoint_dir);
  if (!config.checkpoint_export.empty()) {
    const fs::path parent = fs::path(config.checkpoint_export).parent_path();
    check_writable_folder(comm, "checkpoint.export", config.checkpoint_export,
                          parent.empty() ? "." : parent.string());
  }
}

}  // namespace lockstep::train
