// The files a run reads and the files it writes. No output (log.metrics, checkpoint.export, the
// files of checkpoint.dir) may name an input (the checkpoint resumed or evaluated, a data shard or
// its folder): the run would destroy what it reads, as an export written over the checkpoint it
// evaluates, or a metrics file that truncates the checkpoint before it is read. Checked before any
// output is opened. Two paths are the same file when they are the same inode (hard and symbolic
// links too), or, where one does not exist yet, when their canonical paths are equal.
#pragma once

#include "lockstep/comm/communicator.hpp"
#include "lockstep/train/config.hpp"

namespace lockstep::train {

// Stops the run, with an Error on every rank naming both keys and the path, when an output names
// an input. eval_only (--eval-only) writes nothing in checkpoint.dir, whose checkpoints are then
// inputs only. Collective: rank 0 looks, every rank throws.
void check_outputs_are_not_inputs(const Config& config, comm::Communicator& comm, bool eval_only);

// Whether `name` is a file name that checkpoint.dir's owner writes, prunes or reads back:
// ckpt-<step>.h5, the lock file, temporary .tmp-* files.
bool is_checkpoint_dir_file(const std::string& name);

}  // namespace lockstep::train
