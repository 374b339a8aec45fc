// This mount's share of a fleet budget (budget=redis://...), spent by its requests. The lease
// itself is the control plane's (metering/fleet_share.py: LeasePool, renewed from Redis by
// fleet.py); the gate only spends it. The control plane hands it two things: how far the
// requests may spend, as totals (what they spent so far plus the lease's balance, so a hand-out
// never races the spending), and the pace of the share. It reads back what was spent and how
// many wait. A request past the allowance waits for the next hand-out; within it, it waits out
// the pace. Nothing here waits on Python: the control plane renews on its own clock, and on
// the fallback hands out no limit.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>

#include "ceilings.h"
#include "meter.h"

namespace ft {

struct FleetGateStats {
  double spent_metered = 0;  // metered bytes and op units taken, in all
  double spent_units = 0;
  uint64_t waiting = 0;   // requests waiting for a lease now
  uint64_t pacing = 0;    // requests waiting out the pace now
  uint64_t waited = 0;    // requests that waited, for a lease or the pace
  double wait_seconds = 0;
};

class FleetGate {
 public:
  // The pace may run ahead by this much of a second (fleet_share.py: PACE_BURST_SECONDS).
  static constexpr double kPaceBurstSeconds = 0.05;
  static constexpr double kUnlimited = std::numeric_limits<double>::infinity();

  // *on*: the mount has a budget (else spend() returns at once). *starved* is called when a
  // request starts waiting for a lease, so the control plane renews at once (it pokes the
  // event descriptor trio waits on).
  FleetGate(bool on, double now, std::function<void()> starved);

  bool on() const { return on_; }
  // Take *charge*; return once the allowance holds it and its pace turn has come, the mount
  // closes (open_up), or *abandoned* says nobody waits for the request any more (its caller
  // was answered EINTR: looked at every kAbandonedCheck). Nothing waits here past the stop:
  // Engine::stop opens the gate whatever else the stop could do.
  void spend(Charge charge, const std::function<bool()>& abandoned = {});
  static constexpr double kAbandonedCheck = 0.1;
  // The control plane's hand-out: spend up to these totals (kUnlimited: no lease needed), at
  // these rates (0: unpaced).
  void hand_out(double allow_metered, double allow_units, double pace_metered, double pace_units);
  // Wake every waiting request: the mount is closing.
  void open_up();
  FleetGateStats stats();

 private:
  bool within_allowance(const Charge& charge) const;

  const bool on_;
  std::function<void()> starved_;
  std::mutex lock_;
  std::condition_variable wake_;
  double allow_metered_ = 0;  // nothing before the first lease
  double allow_units_ = 0;
  TokenBucket pace_metered_, pace_units_;
  uint64_t pace_generation_ = 0;  // bumped when the pace moves: sleepers queue again
  bool open_ = false;
  FleetGateStats stats_;
};

}  // namespace ft
