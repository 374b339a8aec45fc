// Metering: what each request costs the way EFS bills it, and the totals of the mount.
//
// The rules are the control plane's (fusethrottle/metering/meter.py): it hands the engine the
// profile's numbers and the class of every request kind, and the engine only does the
// arithmetic, once per request, at the one place every request passes (ops.cc: Counted),
// failed ones included (a failed request was still sent to the target). A parity test holds
// the two to the same charge for every size (tests/test_engine_meter.py).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "fusethrottle_engine.h"

namespace ft {

// FT_METER_* of fusethrottle_engine.h without the flag bits.
enum class OpClass : uint8_t { kNone = 0, kDataRead = 1, kDataWrite = 2, kMetaRead = 3, kMetaWrite = 4 };
constexpr int kClasses = 5;

// The class a FT_METER_* code names (its flag bits aside): kNone for any code of no class, so
// a bad table from the control plane never indexes past the totals.
constexpr OpClass op_class_of(unsigned code) {
  unsigned cls = code & FT_METER_CLASS_MASK;
  return cls < kClasses ? static_cast<OpClass>(cls) : OpClass::kNone;
}

struct MeterProfile {
  uint64_t data_min = 32 * 1024;
  uint64_t meta_min = 4 * 1024;
  uint64_t granule = 1024;
  double read_factor = 1.0 / 3;
  uint32_t read_units = 1;
  uint32_t write_units = 5;
};

struct Charge {
  uint64_t metered = 0;
  uint32_t units = 0;
};

// What a request of *nbytes* in *cls* costs (nothing for kNone).
Charge price(const MeterProfile& profile, OpClass cls, uint64_t nbytes);

class Meter {
 public:
  // *classes*: each request kind's class (FT_METER_* with its flag bits).
  Meter(const MeterProfile& profile, const uint8_t (&classes)[FT_OP_COUNT]);

  OpClass class_of(ft_engine_op op) const { return op_class_of(classes_[op]); }
  // The request waits at the ceilings (reads and metadata only with throttle_reads).
  bool may_wait(ft_engine_op op) const { return (classes_[op] & FT_METER_NO_WAIT) == 0; }
  const MeterProfile& profile() const { return profile_; }

  // A request of *op* moving *nbytes* was served (ended with *error*, 0 if none).
  void record(ft_engine_op op, uint64_t nbytes, int error);

  void read(ft_engine_stats& out) const;
  // The error answers, by kind and errno, that were counted: at most *max* into *out*.
  size_t errors(ft_engine_error* out, size_t max) const;

 private:
  static constexpr int kErrnos = 134;  // errno values counted by value (ERFKILL+1); others at 0
  struct Totals {
    std::atomic<uint64_t> ops{0}, bytes{0}, metered{0}, units{0};
  };
  MeterProfile profile_;
  std::array<uint8_t, FT_OP_COUNT> classes_{};
  std::array<Totals, kClasses> totals_{};
  std::array<std::array<std::atomic<uint64_t>, kErrnos>, FT_OP_COUNT> errors_{};
};

}  // namespace ft
