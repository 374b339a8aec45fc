// Seconds on the steady clock (now_seconds()) as a time point a wait can take, never past
// what the clock holds: its int64 nanoseconds end in 292 years, and a deadline made of an
// option far beyond that (max_age=9999999h, an admission timeout of 1e300 s) would be a
// conversion's undefined behaviour, not a long wait.
#pragma once

#include <chrono>

namespace ft {

// A century of seconds: far beyond any wait, well within the clock's range.
constexpr double kFarSeconds = 100.0 * 365 * 24 * 3600;

// *seconds* as a steady_clock time point: NaN and anything past kFarSeconds is kFarSeconds
// (a wait that ends only when woken), anything before the clock's start is its start.
inline std::chrono::steady_clock::time_point steady_at(double seconds) {
  using Clock = std::chrono::steady_clock;
  if (!(seconds < kFarSeconds)) seconds = kFarSeconds;  // NaN too
  if (seconds < 0) seconds = 0;
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

}  // namespace ft
