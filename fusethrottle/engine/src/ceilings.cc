#include "ceilings.h"

#include <algorithm>
#include <chrono>

#include "window.h"

namespace ft {

void TokenBucket::refill(double now) {
  if (now > last_) {
    tokens_ = std::min(burst_, tokens_ + (now - last_) * rate_);
    last_ = now;
  }
}

double TokenBucket::delay_for(double now, double amount) {
  if (unlimited() || amount <= 0) return 0;
  refill(now);
  tokens_ -= amount;
  if (tokens_ >= 0) return 0;
  return -tokens_ / rate_ + std::max(last_ - now, 0.0);
}

void TokenBucket::refund(double now, double amount) {
  if (unlimited() || amount <= 0) return;
  refill(now);
  tokens_ = std::min(burst_, tokens_ + amount);
}

void TokenBucket::set_rate(double now, double rate, double burst) {
  bool was_unlimited = unlimited();
  refill(now);
  rate_ = std::max(rate, 0.0);
  burst_ = rate_ > 0 ? std::max(burst, 1.0) : burst;
  tokens_ = was_unlimited ? burst_ : std::min(tokens_, burst_);
  last_ = std::max(last_, now);
}

Ceilings::Ceilings(double metered_limit, double ops_limit, bool throttle_reads, double now)
    : bytes_(metered_limit, std::max(metered_limit * kBurstSeconds, double(1 << 20)), now),
      units_(ops_limit, std::max(ops_limit * kBurstSeconds, 5.0), now),
      active_(metered_limit > 0 || ops_limit > 0),
      throttle_reads_(throttle_reads) {}

void Ceilings::pay(OpClass cls, Charge charge) {
  if (!active() || !applies_to(cls)) return;
  std::unique_lock<std::mutex> guard(lock_);
  if (open_) return;
  double now = now_seconds();
  double byte_delay = bytes_.delay_for(now, static_cast<double>(charge.metered));
  double unit_delay = units_.delay_for(now, static_cast<double>(charge.units));
  double delay = std::max(byte_delay, unit_delay);
  if (delay <= 0) return;
  stats_.delayed++;
  stats_.delay_seconds += delay;
  // Which bucket holds it back, and at what rate: a new rate rescales what is left.
  bool by_bytes = byte_delay >= unit_delay;
  double rate = by_bytes ? bytes_.rate() : units_.rate();
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(delay);
  for (;;) {
    uint64_t seen = generation_;
    bool woken = wake_.wait_until(guard, until, [this, seen] { return open_ || generation_ != seen; });
    if (!woken) return;  // waited its turn
    if (open_) {
      // Woken by the close: what it did not wait for is given back.
      double at = now_seconds();
      bytes_.refund(at, static_cast<double>(charge.metered));
      units_.refund(at, static_cast<double>(charge.units));
      return;
    }
    double new_rate = by_bytes ? bytes_.rate() : units_.rate();
    if (new_rate <= 0) return;  // that limit is gone
    auto left = until - std::chrono::steady_clock::now();
    until = std::chrono::steady_clock::now() +
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(left * (rate / new_rate));
    rate = new_rate;
  }
}

void Ceilings::set_limits(double metered_limit, double ops_limit) {
  std::lock_guard<std::mutex> guard(lock_);
  double now = now_seconds();
  metered_limit = std::max(metered_limit, 0.0);
  ops_limit = std::max(ops_limit, 0.0);
  bytes_.set_rate(now, metered_limit, std::max(metered_limit * kBurstSeconds, double(1 << 20)));
  units_.set_rate(now, ops_limit, std::max(ops_limit * kBurstSeconds, 5.0));
  active_.store(metered_limit > 0 || ops_limit > 0, std::memory_order_relaxed);
  generation_++;
  wake_.notify_all();
}

double Ceilings::metered_limit() {
  std::lock_guard<std::mutex> guard(lock_);
  return bytes_.rate();
}

double Ceilings::ops_limit() {
  std::lock_guard<std::mutex> guard(lock_);
  return units_.rate();
}

void Ceilings::open_up() {
  std::lock_guard<std::mutex> guard(lock_);
  open_ = true;
  wake_.notify_all();
}

CeilingStats Ceilings::stats() {
  std::lock_guard<std::mutex> guard(lock_);
  return stats_;
}

}  // namespace ft
