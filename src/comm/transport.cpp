#include "lockstep/comm/transport.hpp"

#include "lockstep/comm/nccl_communicator.hpp"

namespace lockstep::comm {

std::shared_ptr<Communicator> gradient_communicator(Communicator& control, ops::Context& ctx) {
#ifdef LOCKSTEP_HAVE_CUDA
  if (ctx.device().is_cuda()) return make_nccl_communicator(control, ctx);
#endif
  (void)ctx;
  return std::shared_ptr<Communicator>(&control, [](Communicator*) {});
}

}  // namespace lockstep::comm
