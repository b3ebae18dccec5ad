// TrainState: what a checkpoint must hold to continue a run exactly (the model's parameters and
// buffers, the optimizer's state and step count, the dropout RNG position, the step and the data
// position), and the one place that names it in checkpoint files. It saves and restores itself;
// the functions below decide, once for every rank, which checkpoint a run starts from and whether
// the checkpoint folder may be written, so no work is ever overwritten by accident.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "lockstep/comm/communicator.hpp"
#include "lockstep/nn/model.hpp"
#include "lockstep/ops/context.hpp"
#include "lockstep/optim/optimizer.hpp"
#include "lockstep/train/checkpoint.hpp"
#include "lockstep/train/config.hpp"

namespace lockstep::train {

// Where the next optimizer step takes its batches: epoch in progress and loader batches of it
// already consumed (per rank). After restore, batch_in_epoch is a whole number of steps.
struct DataPosition {
  std::int64_t epoch = 0;
  std::int64_t batch_in_epoch = 0;
};

// Facts about the run a state belongs to, recorded in checkpoints and checked on resume.
struct RunLayout {
  int world_size = 1;
  int rank = 0;                               // of this process: only rank 0 writes checkpoints
  std::int64_t samples_per_loader_batch = 1;  // local batch x world size
  std::int64_t accumulation = 1;
  std::string parallel = "none";
  std::string config_ini;                    // the resolved config, recorded for the record
  std::map<std::string, std::string> attrs;  // more checkpoint attributes (token data: tokenizer)
};

class TrainState {
 public:
  TrainState(nn::Model& model, optim::Optimizer& optimizer, RunLayout layout);

  std::int64_t step = 0;  // optimizer steps done (skipped non-finite steps included)
  DataPosition position;

  // The checkpoint of this state (tensors share the model's and optimizer's storage; a ZeRO-1
  // optimizer's state is gathered whole over the communicator, so every rank must call it then).
  CheckpointState to_checkpoint() const;
  // The communicator a sharded (ZeRO-1) optimizer's state is gathered over: the engine's.
  void set_communicator(comm::Communicator& comm) { comm_ = &comm; }
  // Loads a checkpoint read from `path` (named in every error): the model must have the same
  // structure and the optimizer be of the same kind. The data position is rescaled when the
  // samples per loader batch changed, and rounded down to whole optimizer steps.
  void restore(ops::Context& ctx, const CheckpointState& checkpoint, const std::string& path);
  // Every rank calls it (a ZeRO-1 optimizer's state is gathered first); rank 0 writes
  // DIR/ckpt-<step>.h5 atomically and prunes to the newest `keep`; every rank returns the path,
  // so all decide alike whether a step is saved. The file is the same with or without ZeRO-1, so
  // either mode and any world size resumes it.
  std::string save(const std::string& dir, int keep) const;

  const RunLayout& layout() const { return layout_; }

 private:
  nn::Model& model_;
  optim::Optimizer& optimizer_;
  RunLayout layout_;
  comm::Communicator* comm_ = nullptr;
};

// checkpoint.async: TrainState::save split in two. save() runs at the step boundary on every rank
// (collective under ZeRO-1, like TrainState::save): it copies the state to host memory and
// returns the path; rank 0's background thread then writes the file and prunes while training
// goes on. At most one write is in flight: a save() while one is pending first waits for it. A
// write's error is thrown by the next save() or by wait(). A process killed during a write loses
// nothing older: the file is written under DIR/.tmp-* and renamed, and pruning runs only after.
// The price is one host copy of the state (parameters, buffers, optimizer state) while a write
// runs.
class BackgroundCheckpoints {
 public:
  BackgroundCheckpoints() = default;
  ~BackgroundCheckpoints();  // waits for the write in flight; an error then goes to stderr
  BackgroundCheckpoints(const BackgroundCheckpoints&) = delete;
  BackgroundCheckpoints& operator=(const BackgroundCheckpoints&) = delete;

  std::string save(const TrainState& state, const std::string& dir, int keep);
  // Waits for the write in flight, if any; throws its error.
  void wait();

 private:
  std::thread writer_;
  std::exception_ptr error_;
};

// The checkpoint a run starts from, "" for a fresh start, decided by rank 0 from train.resume and
// checkpoint.dir and the same on every rank (an error on rank 0 is thrown on every rank):
//   ""     a fresh start; an error if checkpoint.dir already holds checkpoints
//   auto   the newest checkpoint; fresh when there is none; an error naming it and why when it
//          does not read back completely (never skipped: the run would overwrite it by name)
//   fresh  a fresh start over existing checkpoints, which are moved to a new folder
//          checkpoint.dir/replaced-<UTC time>[-N]/ first (never deleted, never over another)
//   FILE   that checkpoint; an error if checkpoint.dir holds newer ones (they would be replaced)
// `writes` false (--eval-only) skips the rules that protect checkpoints from being overwritten.
// Collective over `comm`.
std::string choose_resume(const Config& config, comm::Communicator& comm,
                          const std::function<void(const std::string&)>& warn, bool writes = true);

// Creates checkpoint.dir (and checkpoint.export's folder) if needed and proves them writable by
// creating and removing a file, so a run does not train for hours to fail at its first save or
// its export. Checked by rank 0, thrown on every rank, naming the key. writes_checkpoints false
// (--eval-only, which may read a read-only folder) checks the export only. Collective.
void check_outputs_writable(const Config& config, comm::Communicator& comm,
                            bool writes_checkpoints = true);

// Runs fn on rank 0 only; its lockstep::Error (message and hint) is rethrown on every rank, its
// result broadcast. For decisions that read the shared file system once.
std::string on_rank0(comm::Communicator& comm, const std::function<std::string()>& fn);

}  // namespace lockstep::train
