#include "meter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ft {

Charge price(const MeterProfile& p, OpClass cls, uint64_t nbytes) {
  if (cls == OpClass::kNone) return {};
  bool data = cls == OpClass::kDataRead || cls == OpClass::kDataWrite;
  uint64_t size = std::max(nbytes, data ? p.data_min : p.meta_min);
  uint64_t granule = std::max<uint64_t>(p.granule, 1);
  uint64_t metered = (size + granule - 1) / granule * granule;
  if (cls == OpClass::kDataRead || cls == OpClass::kMetaRead) {
    // As Python's math.ceil(metered * read_factor): the same double product, rounded up (a
    // factor that is not a number, or negative, charges nothing; one past 2^64, 2^64 - 1).
    double read = std::ceil(static_cast<double>(metered) * p.read_factor);
    constexpr double kMax = 18446744073709551616.0;  // 2^64
    uint64_t charged = !(read > 0) ? 0 : read >= kMax ? UINT64_MAX : static_cast<uint64_t>(read);
    return {charged, p.read_units};
  }
  return {metered, p.write_units};
}

Meter::Meter(const MeterProfile& profile, const uint8_t (&classes)[FT_OP_COUNT]) : profile_(profile) {
  std::copy(std::begin(classes), std::end(classes), classes_.begin());
}

void Meter::record(ft_engine_op op, uint64_t nbytes, int error) {
  if (error > 0) errors_[op][error < kErrnos ? error : 0].fetch_add(1, std::memory_order_relaxed);
  OpClass cls = class_of(op);
  if (cls == OpClass::kNone) return;
  Charge charge = price(profile_, cls, nbytes);
  Totals& t = totals_[static_cast<int>(cls)];
  t.ops.fetch_add(1, std::memory_order_relaxed);
  t.bytes.fetch_add(nbytes, std::memory_order_relaxed);
  t.metered.fetch_add(charge.metered, std::memory_order_relaxed);
  t.units.fetch_add(charge.units, std::memory_order_relaxed);
}

void Meter::read(ft_engine_stats& out) const {
  for (int cls = 1; cls < kClasses; cls++) {
    const Totals& t = totals_[cls];
    ft_engine_meter_totals& o = out.meter[cls - 1];
    o.ops = t.ops.load(std::memory_order_relaxed);
    o.bytes = t.bytes.load(std::memory_order_relaxed);
    o.metered_bytes = t.metered.load(std::memory_order_relaxed);
    o.units = t.units.load(std::memory_order_relaxed);
  }
}

size_t Meter::errors(ft_engine_error* out, size_t max) const {
  size_t n = 0;
  for (int op = 0; op < FT_OP_COUNT; op++) {
    for (int e = 0; e < kErrnos; e++) {
      uint64_t count = errors_[op][e].load(std::memory_order_relaxed);
      if (count == 0) continue;
      if (n == max) return n;
      out[n++] = ft_engine_error{static_cast<uint32_t>(op), e, count};
    }
  }
  return n;
}

}  // namespace ft
