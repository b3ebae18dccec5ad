#include "lockstep/comm/transport.hpp"

#include "lockstep/comm/nccl_communicator.hpp"
#include "lockstep/comm/stream_communicator.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep::comm {

std::shared_ptr<Communicator> gradient_communicator(Communicator& control, ops::Context& ctx,
                                                    AllreduceAlgorithm algorithm,
                                                    std::string* description) {
  const NodeLayout layout = NodeLayout::detect(control);
  const bool gpu = ctx.device().is_cuda();
  const char* kind = gpu ? "cuda" : ctx.device().is_emu() ? "emu" : "cpu";
  check_same_on_all_hosts(control, layout, "the training device (train.device)", kind,
                          "give every node a GPU, or set train.device = cpu");
  if (gpu) {
    LOCKSTEP_CHECK_HINT(algorithm != AllreduceAlgorithm::Hierarchical,
                        "set dist.algorithm = auto (NCCL already routes within and between nodes)",
                        "dist.algorithm = hierarchical applies to the MPI allreduce of CPU ranks");
#ifdef LOCKSTEP_HAVE_CUDA
    if (description) *description = "nccl over " + layout.describe();
    return make_nccl_communicator(control, ctx);
#endif
  }
  std::unique_ptr<Communicator> two_level = make_gradient_communicator(control, algorithm, layout);
  if (description)
    *description = str(two_level ? "hierarchical" : "flat", " over ", layout.describe());
  std::shared_ptr<Communicator> host =
      two_level ? std::shared_ptr<Communicator>(std::move(two_level))
                : std::shared_ptr<Communicator>(&control, [](Communicator*) {});
  // The emulated GPU: NCCL's contract (a communication stream, waits that order streams) over
  // the same host transport, so the GPU code paths above run here.
  if (ctx.device().is_emu()) {
    if (description) *description = "stream communicator, " + *description;
    return make_stream_communicator(control, std::move(host), ctx);
  }
  return host;
}

}  // namespace lockstep::comm
