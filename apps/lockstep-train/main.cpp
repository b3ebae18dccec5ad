// lockstep-train: runs one experiment from a config file (see --help). Launch with mpirun/srun for
// several ranks; every rank runs this same main.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/mpi_communicator.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/ops/build_info.hpp"
#include "lockstep/train/config.hpp"
#include "lockstep/train/doctor.hpp"
#include "lockstep/train/signals.hpp"
#include "lockstep/train/trainer.hpp"

int main(int argc, char** argv) {
  using namespace lockstep;
  // --version before anything else, so a site admin can check an installed build (what it was
  // built with, what this node offers) without a config file or an MPI launch.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--version") {
      std::cout << ops::build_info();
      return 0;
    }
  }
  // --doctor: the preflight check of include/lockstep/train/doctor.hpp instead of training; the
  // rest of the command line is the job's own.
  bool doctor = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--doctor") {
      doctor = true;
      for (int j = i; j + 1 < argc; ++j)
        argv[j] = argv[j + 1];
      argv[--argc] = nullptr;
      break;
    }
  }
  // Parse before MPI so --help and config errors need no MPI launch; under mpirun every rank
  // parses the same arguments, so an error here is the same on every rank.
  train::ParsedArgs args;
  try {
    args = train::parse_args(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-train: error: %s\n", e.what());
    return 2;
  }
  if (args.help) {
    std::cout << train::help_text()
              << "  --version  the version and what this build can do here (CUDA, cuDNN, NCCL, "
                 "GPUs visible, oneDNN, bf16)\n"
              << "  --doctor   check the job as launched instead of training: every rank's node "
                 "(/dev/shm, network, GPUs, libraries, free space, data), the config on every "
                 "rank, clock skew; exit 1 naming each problem\n";
    return 0;
  }
  if (args.print_config) {
    std::cout << train::to_ini(args.config);
    return 0;
  }
  // Before MPI starts its threads and before any thread computes: asynchronous signals are taken
  // by a thread of their own, never by one inside a JIT kernel
  // (include/lockstep/train/signals.hpp).
  train::SignalThread signal_thread;
  comm::MpiSession session(&argc, &argv);
  return comm::run_or_abort([&] {
    auto comm = comm::make_mpi_communicator(session, {.timeout_s = args.config.dist_timeout_s});
    if (session.rank() == 0 && args.config.log_progress != "none")
      std::fprintf(stderr, "lockstep-train: %s\n", session.describe().c_str());
    if (doctor) {
      for (const train::DoctorFinding& f :
           train::run_doctor(args.config, *comm, session.describe()))
        if (f.error) return 1;
      return 0;
    }
    train::TrainResult result = train::run_training(args.config, *comm, args.eval_only);
    return result.stopped_by_signal ? train::kExitRequeue : 0;
  });
}
