// The engine's edges without a mount: the event queue keeps every notice of lost data however
// many samples come, a meter class outside the table counts nothing, and a deadline past the
// clock's range is a long wait, not an overflow. `make test` runs it (sanitized, float casts
// included).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "../src/deadline.h"
#include "../src/events.h"
#include "../src/meter.h"

namespace {

int failures = 0;

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                             \
    }                                                                         \
  } while (0)

ft_engine_event sample(uint64_t bytes) {
  ft_engine_event e{};
  e.kind = FT_EVENT_SYNC;
  e.bytes = bytes;
  return e;
}

ft_engine_event lost(uint64_t node) {
  ft_engine_event e{};
  e.kind = FT_EVENT_LOST;
  e.node = node;
  e.error = 28;  // ENOSPC
  std::snprintf(e.path, sizeof e.path, "/target/file-%llu", static_cast<unsigned long long>(node));
  return e;
}

std::vector<ft_engine_event> drain_all(ft::EventRing& ring) {
  std::vector<ft_engine_event> out(3 * ft::EventRing::kCapacity);
  out.resize(ring.drain(out.data(), out.size()));
  return out;
}

void test_a_burst_of_samples_never_evicts_a_notice_of_lost_data() {
  constexpr size_t kCap = ft::EventRing::kCapacity;
  ft::EventRing ring;
  ring.push(lost(1));  // the oldest of all, where a full queue used to drop from
  for (size_t i = 0; i < kCap; i++) ring.push(sample(i));
  ring.push(lost(2));
  for (size_t i = 0; i < 2 * kCap; i++) ring.push(sample(kCap + i));
  std::vector<ft_engine_event> got = drain_all(ring);
  std::vector<uint64_t> notices;
  size_t samples = 0;
  for (const auto& e : got) {
    if (e.kind == FT_EVENT_LOST) notices.push_back(e.node);
    if (e.kind == FT_EVENT_SYNC) samples++;
  }
  CHECK((notices == std::vector<uint64_t>{1, 2}));
  CHECK(samples == kCap);                     // the samples stay bounded
  CHECK(ring.dropped() == 2 * kCap);          // the evicted ones are counted
  CHECK(got.back().kind == FT_EVENT_SYNC && got.back().bytes == 3 * kCap - 1);  // the newest kept
  CHECK(std::strcmp(got.front().path, "/target/file-1") == 0);
}

void test_notices_of_one_file_wait_as_one_and_of_many_files_each() {
  ft::EventRing ring;
  for (int i = 0; i < 10000; i++) ring.push(lost(7));  // a target failing every write of it
  for (uint64_t node = 100; node < 100 + 2 * ft::EventRing::kCapacity; node++) ring.push(lost(node));
  std::vector<ft_engine_event> got = drain_all(ring);
  CHECK(got.size() == 1 + 2 * ft::EventRing::kCapacity);  // none dropped: every file named
  CHECK(ring.dropped() == 0);
  ring.push(lost(7));  // drained: a new notice of it is queued again
  CHECK(drain_all(ring).size() == 1);
}

void test_a_meter_class_outside_the_table_counts_nothing() {
  uint8_t classes[FT_OP_COUNT] = {};
  classes[FT_OP_WRITE] = FT_METER_DATA_WRITE;
  classes[FT_OP_READ] = 0x0f;                      // masked in, but no class: kNone
  classes[FT_OP_GETATTR] = 0x05 | FT_METER_NO_WAIT;  // one past the last class
  ft::Meter meter(ft::MeterProfile{}, classes);
  CHECK(meter.class_of(FT_OP_READ) == ft::OpClass::kNone);
  CHECK(meter.class_of(FT_OP_GETATTR) == ft::OpClass::kNone);
  meter.record(FT_OP_READ, 4096, 0);
  meter.record(FT_OP_GETATTR, 0, 0);
  meter.record(FT_OP_WRITE, 4096, 0);
  ft_engine_stats stats{};
  meter.read(stats);
  CHECK(stats.meter[FT_METER_DATA_WRITE - 1].ops == 1);
  for (int cls : {FT_METER_DATA_READ, FT_METER_META_READ, FT_METER_META_WRITE}) CHECK(stats.meter[cls - 1].ops == 0);
  ft_engine_error errors[8];
  CHECK(meter.errors(errors, 8) == 0);  // nothing written past the totals into the counts
  CHECK(ft::op_class_of(0xff) == ft::OpClass::kNone);
  CHECK(ft::op_class_of(FT_METER_META_READ | FT_METER_NO_WAIT) == ft::OpClass::kMetaRead);
}

void test_a_read_factor_past_any_charge_saturates() {
  ft::MeterProfile p{};
  p.read_factor = 1e300;
  CHECK(ft::price(p, ft::OpClass::kDataRead, 1 << 20).metered == UINT64_MAX);
  p.read_factor = std::numeric_limits<double>::quiet_NaN();
  CHECK(ft::price(p, ft::OpClass::kDataRead, 1 << 20).metered == 0);
  p.read_factor = -1;
  CHECK(ft::price(p, ft::OpClass::kMetaRead, 0).metered == 0);
}

void test_a_deadline_past_the_clocks_range_is_a_long_wait() {
  using Clock = std::chrono::steady_clock;
  double now = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  const double max_age = 9999999.0 * 3600;  // max_age=9999999h: 3.6e19 ns, past int64
  Clock::time_point far = ft::steady_at(ft::kFarSeconds);
  CHECK(ft::steady_at(now + max_age) == far);
  CHECK(ft::steady_at(1e300) == far);
  CHECK(ft::steady_at(std::numeric_limits<double>::infinity()) == far);
  CHECK(ft::steady_at(std::numeric_limits<double>::quiet_NaN()) == far);
  CHECK(ft::steady_at(-1e300) == Clock::time_point{});
  CHECK(far > Clock::now() + std::chrono::hours(24 * 365 * 50));
  // An ordinary deadline is what it says, to the microsecond.
  auto soon = ft::steady_at(now + 1.5) - Clock::time_point{};
  CHECK(std::llabs(std::chrono::duration_cast<std::chrono::microseconds>(soon).count() -
                   static_cast<long long>((now + 1.5) * 1e6)) <= 1);
}

}  // namespace

int main() {
  test_a_burst_of_samples_never_evicts_a_notice_of_lost_data();
  test_notices_of_one_file_wait_as_one_and_of_many_files_each();
  test_a_meter_class_outside_the_table_counts_nothing();
  test_a_read_factor_past_any_charge_saturates();
  test_a_deadline_past_the_clocks_range_is_a_long_wait();
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::puts("boundary_test: all passed");
  return 0;
}
