#include "fleet_gate.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "window.h"

namespace ft {

FleetGate::FleetGate(bool on, double now, std::function<void()> starved)
    : on_(on), starved_(std::move(starved)), pace_metered_(0, 0, now), pace_units_(0, 0, now) {}

bool FleetGate::within_allowance(const Charge& charge) const {
  // As LeasePool.reserve: a request passes while anything is left (the balance may go into
  // debt by one request; the next lease pays for it).
  return (charge.metered == 0 || stats_.spent_metered < allow_metered_) &&
         (charge.units == 0 || stats_.spent_units < allow_units_);
}

void FleetGate::spend(Charge charge, const std::function<bool()>& abandoned) {
  if (!on_ || (charge.metered == 0 && charge.units == 0)) return;
  std::unique_lock<std::mutex> guard(lock_);
  if (open_) return;
  double start = now_seconds();
  bool waited = false;
  if (!within_allowance(charge)) {
    waited = true;
    stats_.waiting++;
    if (starved_) starved_();
    bool left = false;
    while (!open_ && !within_allowance(charge)) {
      if (abandoned && abandoned()) {
        left = true;
        break;
      }
      if (abandoned) {
        wake_.wait_for(guard, std::chrono::duration<double>(kAbandonedCheck));
      } else {
        wake_.wait(guard);
      }
    }
    stats_.waiting--;
    if (open_ || left) return;  // a request nobody waits for spends nothing
  }
  auto metered = static_cast<double>(charge.metered);
  auto units = static_cast<double>(charge.units);
  stats_.spent_metered += metered;
  stats_.spent_units += units;
  while (true) {
    double now = now_seconds();
    double delay = std::max(pace_metered_.delay_for(now, metered), pace_units_.delay_for(now, units));
    if (delay <= 0) break;
    waited = true;
    uint64_t generation = pace_generation_;
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(delay);
    stats_.pacing++;
    bool woken = false;
    for (;;) {
      woken = open_ || pace_generation_ != generation || (abandoned && abandoned());
      if (woken || std::chrono::steady_clock::now() >= until) break;
      auto slice = until;
      if (abandoned) {
        auto check = std::chrono::time_point_cast<decltype(until)::duration>(std::chrono::steady_clock::now()) +
                     std::chrono::duration<double>(kAbandonedCheck);
        slice = std::min(slice, check);
      }
      wake_.wait_until(guard, slice);
    }
    stats_.pacing--;
    if (!woken) break;  // its turn came
    double at = now_seconds();
    pace_metered_.refund(at, metered);
    pace_units_.refund(at, units);
    if (open_ || (abandoned && abandoned())) break;
    // The share moved (a mount left, this one's grew): queue again at the new pace, not the old.
  }
  if (waited) {
    stats_.waited++;
    stats_.wait_seconds += now_seconds() - start;
  }
}

void FleetGate::hand_out(double allow_metered, double allow_units, double pace_metered, double pace_units) {
  std::lock_guard<std::mutex> guard(lock_);
  // Every tick hands out: wake the waiters only when it lets more through or moves the pace.
  bool more = allow_metered > allow_metered_ || allow_units > allow_units_;
  allow_metered_ = allow_metered;
  allow_units_ = allow_units;
  if (pace_metered != pace_metered_.rate() || pace_units != pace_units_.rate()) {
    double now = now_seconds();
    pace_metered_.set_rate(now, pace_metered, pace_metered * kPaceBurstSeconds);
    pace_units_.set_rate(now, pace_units, pace_units * kPaceBurstSeconds);
    pace_generation_++;
    more = true;
  }
  if (more) wake_.notify_all();
}

void FleetGate::open_up() {
  std::lock_guard<std::mutex> guard(lock_);
  open_ = true;
  wake_.notify_all();
}

FleetGateStats FleetGate::stats() {
  std::lock_guard<std::mutex> guard(lock_);
  return stats_;
}

}  // namespace ft
