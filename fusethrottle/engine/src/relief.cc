#include "relief.h"

#include <algorithm>
#include <chrono>

#include "inode.h"
#include "thread_name.h"
#include "window.h"

namespace ft {

namespace {
// How often the table's size is looked at besides a lookup's wake-up.
constexpr auto kCheckInterval = std::chrono::milliseconds(250);
// A name asked about is not asked about again for this long (its FORGET may be on its way).
constexpr auto kAskAgainAfter = std::chrono::seconds(5);
}  // namespace

ReliefBounds relief_bounds(size_t descriptor_limit) {
  size_t high = std::max<size_t>(64, descriptor_limit / 4 * 3);
  return {high, std::max<size_t>(32, high / 5 * 4)};
}

Relief::~Relief() {
  {
    std::lock_guard<std::mutex> guard(lock_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Relief::start(fuse_session* session, ReliefBounds bounds) {
  session_ = session;
  bounds_ = bounds;
  table_.when_past(bounds.high, [this] {
    {
      std::lock_guard<std::mutex> guard(lock_);
      full_ = true;
    }
    wake_.notify_one();
  });
  thread_ = std::thread([this] {
    name_this_thread("ft-relief");
    run();
  });
}

void Relief::run() {
  std::unique_lock<std::mutex> guard(lock_);
  while (!stopping_) {
    wake_.wait_for(guard, kCheckInterval, [this] { return full_ || stopping_; });
    if (stopping_) break;
    full_ = false;
    guard.unlock();
    if (table_.size() > bounds_.high) relieve();
    guard.lock();
  }
}

void Relief::relieve() {
  size_t known = table_.size();
  if (known <= bounds_.low) return;
  for (auto& name : table_.oldest_names(known - bounds_.low, kAskAgainAfter)) {
    if (window_.busy(*name.inode)) continue;
    // ENOENT, ENOTDIR, EBUSY: the kernel no longer holds the name, or cannot drop it now.
    fuse_lowlevel_notify_inval_entry(session_, name.parent, name.name.c_str(), name.name.size());
    asked_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace ft
