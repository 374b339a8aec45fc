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
  if (!active_ || !applies_to(cls)) return;
  std::unique_lock<std::mutex> guard(lock_);
  if (open_) return;
  double now = now_seconds();
  double delay = std::max(bytes_.delay_for(now, static_cast<double>(charge.metered)),
                          units_.delay_for(now, static_cast<double>(charge.units)));
  if (delay <= 0) return;
  stats_.delayed++;
  stats_.delay_seconds += delay;
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(delay);
  if (wake_.wait_until(guard, until, [this] { return open_; })) {
    // Woken by the close: what it did not wait for is given back.
    double at = now_seconds();
    bytes_.refund(at, static_cast<double>(charge.metered));
    units_.refund(at, static_cast<double>(charge.units));
  }
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
