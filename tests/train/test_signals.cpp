#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <thread>

#include "lockstep/core/error.hpp"
#include "lockstep/train/signals.hpp"

using namespace lockstep;
using namespace lockstep::train;

namespace {
volatile std::sig_atomic_t g_custom_hits = 0;
extern "C" void custom_handler(int) {
  g_custom_hits = g_custom_hits + 1;
}
}  // namespace

TEST(StopRequest, RecordsTheFirstStopSignalAndKeepsRunning) {
  StopRequest stop;
  EXPECT_EQ(stop.requested(), 0);
  EXPECT_STREQ(stop.name(), "");
  ASSERT_EQ(std::raise(SIGUSR1), 0);  // default action would end the process
  EXPECT_EQ(stop.requested(), SIGUSR1);
  EXPECT_STREQ(stop.name(), "SIGUSR1");
  ASSERT_EQ(std::raise(SIGTERM), 0);
  EXPECT_EQ(stop.requested(), SIGUSR1) << "a later signal must not overwrite the first";
}

TEST(StopRequest, SeesASigtermSentFromAnotherThread) {
  StopRequest stop;
  std::thread([] { ::kill(::getpid(), SIGTERM); }).join();
  // kill() to the own process delivers before it returns to some thread; poll briefly anyway.
  for (int i = 0; i < 1000 && stop.requested() == 0; ++i)
    std::this_thread::yield();
  EXPECT_EQ(stop.requested(), SIGTERM);
  EXPECT_STREQ(stop.name(), "SIGTERM");
}

TEST(StopRequest, RestoresThePreviousHandlersAndStartsClean) {
  struct sigaction custom = {}, saved = {};
  custom.sa_handler = custom_handler;
  sigemptyset(&custom.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &custom, &saved), 0);
  {
    StopRequest stop;
    std::raise(SIGUSR1);
    EXPECT_EQ(stop.requested(), SIGUSR1);
    EXPECT_EQ(g_custom_hits, 0);
  }
  std::raise(SIGUSR1);
  EXPECT_EQ(g_custom_hits, 1);
  StopRequest again;
  EXPECT_EQ(again.requested(), 0) << "a new StopRequest must not inherit an old signal";
  ASSERT_EQ(sigaction(SIGUSR1, &saved, nullptr), 0);
}

TEST(StopRequest, OnlyOneMayBeInstalled) {
  StopRequest first;
  EXPECT_THROW(StopRequest second, Error);
}

TEST(StopRequest, RequeueStatusIsDistinctFromErrorsAndSignalDeaths) {
  EXPECT_NE(kExitRequeue, 0);
  EXPECT_NE(kExitRequeue, 1);
  EXPECT_LT(kExitRequeue, 128);
}
