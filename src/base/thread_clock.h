// The calling thread's CPU time as a std::chrono clock. A bound on work measured with it is the
// same on a loaded machine as on an idle one: time spent waiting for a core does not count.
#pragma once

#include <time.h>

#include <chrono>

namespace gale {

struct ThreadCpuClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<ThreadCpuClock>;
  static constexpr bool is_steady = true;

  static time_point now() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(static_cast<rep>(ts.tv_sec) * 1000000000 + ts.tv_nsec));
  }
};

}  // namespace gale
