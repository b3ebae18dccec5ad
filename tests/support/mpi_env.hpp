// Shared state of the MPI test binary: tests/support/mpi_main.cpp creates the session and one world
// communicator before RUN_ALL_TESTS. Tests run on every rank in the same order; a test must
// reach every collective on every rank, so use EXPECT_* (not ASSERT_*) before a collective.
#pragma once

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/comm/communicator.hpp"

namespace lockstep::test {

comm::Communicator& world();
const comm::MpiSession& session();

}  // namespace lockstep::test
