// The optional ceilings on metered bytes/s and op units/s (metered_limit=, ops_limit=): two
// token buckets every write pays into before it reaches the target (reads and metadata too
// with throttle_reads), priced by the meter. A request over its budget waits on its own
// thread (a delayed reply, never an error), as at the window's gate. The bucket is the same as
// fusethrottle/metering/token_bucket.py's (which paces the fleet share).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "meter.h"

namespace ft {

// A rate with a burst, as a reservation: take tokens now, be told how long to wait. The
// balance may go negative (a request larger than the burst still passes, later ones wait
// behind its debt, in arrival order). Rate 0: unlimited. Not locked: Ceilings holds it.
class TokenBucket {
 public:
  TokenBucket(double rate, double burst, double now) : rate_(rate), burst_(burst), tokens_(burst), last_(now) {}
  bool unlimited() const { return rate_ <= 0; }
  double delay_for(double now, double amount);
  void refund(double now, double amount);
  // A new rate (and burst) from *now* on; debt is kept, so callers already queued keep their
  // place. From unlimited, the bucket starts full.
  void set_rate(double now, double rate, double burst);
  double rate() const { return rate_; }

 private:
  void refill(double now);
  double rate_, burst_, tokens_, last_;
};

struct CeilingStats {
  uint64_t delayed = 0;
  double delay_seconds = 0;
};

class Ceilings {
 public:
  // A quarter of a second of budget may be spent at once (tests/test_ceilings.py and
  // bench/ceilings.py count on it: BURST_SECONDS).
  static constexpr double kBurstSeconds = 0.25;

  Ceilings(double metered_limit, double ops_limit, bool throttle_reads, double now);

  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Requests of *cls* pay (writes; reads and metadata too with throttle_reads).
  bool applies_to(OpClass cls) const {
    return cls != OpClass::kNone && (cls == OpClass::kDataWrite || throttle_reads_);
  }
  // Reserve *charge* of a request of class *cls*, and wait until it may go (or the mount
  // closes: then it goes at once, its tokens given back).
  void pay(OpClass cls, Charge charge);
  // Wake every waiting request: the mount is closing.
  void open_up();
  // New limits from now on (0: none), changed while the mount serves (`fusethrottle set`, the
  // pressure guard): requests already waiting rescale what is left of their wait to the new
  // rate, so a loosened limit lets them go at once rather than after the old, longer wait.
  void set_limits(double metered_limit, double ops_limit);
  double metered_limit();
  double ops_limit();
  CeilingStats stats();

 private:
  std::mutex lock_;
  std::condition_variable wake_;
  TokenBucket bytes_, units_;
  std::atomic<bool> active_;
  bool throttle_reads_;
  bool open_ = false;
  uint64_t generation_ = 0;  // bumped by set_limits: waiters look at the new rates
  CeilingStats stats_;
};

}  // namespace ft
