// How a communicator that owns device-side state ends (the NCCL one; tested on the CPU). Destroy
// flushes what is in flight with the peers first and may therefore wait for them; Abort frees
// this rank's resources at once. A communicator destroyed while an exception unwinds the stack
// must abort: the peers may never join the collectives a destroy would wait for, and a rank
// blocked there would never print the error that is unwinding (and its peers would hang until
// their timeout without it).
#pragma once

namespace lockstep::comm::detail {

enum class Teardown { Destroy, Abort };

// `uncaught` is std::uncaught_exceptions() in the destructor deciding.
inline Teardown teardown_for(int uncaught) {
  return uncaught > 0 ? Teardown::Abort : Teardown::Destroy;
}

}  // namespace lockstep::comm::detail
