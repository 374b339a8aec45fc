#include "relief.h"

#include <algorithm>
#include <chrono>
#include <utility>

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
    wake_.wait_for(guard, kCheckInterval, [this] { return full_ || pressed_ || stopping_; });
    if (stopping_) break;
    bool pressed = std::exchange(pressed_, false);
    full_ = false;
    guard.unlock();
    size_t known = table_.size();
    if (pressed) {
      relieve(std::min(bounds_.low, known / 5 * 4));
    } else if (known > bounds_.high) {
      relieve(bounds_.low);
    }
    guard.lock();
  }
}

void Relief::make_room(std::chrono::milliseconds bound) {
  if (session_ == nullptr) return;  // not started: no limit is kept
  size_t before = table_.size();
  {
    std::lock_guard<std::mutex> guard(lock_);
    pressed_ = true;
  }
  wake_.notify_one();
  // Woken by the FORGETs' files leaving the table, not by polling it.
  table_.wait_for_size(before / 10 * 9, bound);
}

void Relief::relieve(size_t down_to) {
  size_t known = table_.size();
  if (known <= down_to) return;
  for (auto& name : table_.oldest_names(known - down_to, kAskAgainAfter)) {
    if (window_.busy(*name.inode)) continue;
    // ENOENT, ENOTDIR, EBUSY: the kernel no longer holds the name, or cannot drop it now.
    fuse_lowlevel_notify_inval_entry(session_, name.parent, name.name.c_str(), name.name.size());
    asked_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace ft
