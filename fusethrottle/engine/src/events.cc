#include "events.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>

namespace ft {

int EventRing::open() {
  signal_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  return signal_ ? 0 : -errno;
}

void EventRing::push(const ft_engine_event& event) {
  {
    std::lock_guard<std::mutex> guard(lock_);
    if (event.kind == FT_EVENT_LOST) {
      // One notice of a file is enough while it waits: a target that fails every write of
      // a file would otherwise fill the queue with it.
      for (const auto& queued : queue_) {
        if (queued.kind == FT_EVENT_LOST && queued.node == event.node) return;
      }
    } else if (samples_ >= kCapacity) {
      // The oldest sample makes room; a notice of lost data never does (it is not dropped).
      auto oldest = std::find_if(queue_.begin(), queue_.end(),
                                 [](const ft_engine_event& e) { return e.kind != FT_EVENT_LOST; });
      queue_.erase(oldest);
      samples_--;
      dropped_++;
    }
    queue_.push_back(event);
    if (event.kind != FT_EVENT_LOST) samples_++;
  }
  poke();
}

void EventRing::poke() {
  uint64_t one = 1;
  if (signal_) (void)!::write(signal_.get(), &one, sizeof one);  // full counter: already signalled
}

size_t EventRing::drain(ft_engine_event* out, size_t max) {
  std::lock_guard<std::mutex> guard(lock_);
  size_t n = 0;
  while (n < max && !queue_.empty()) {
    out[n++] = queue_.front();
    if (queue_.front().kind != FT_EVENT_LOST) samples_--;
    queue_.pop_front();
  }
  return n;
}

void EventRing::lost(uint64_t node, int path_fd, int error) {
  switch (error) {
    case ENOSPC: case EDQUOT: case EFBIG: case EIO: case EROFS: case ETIMEDOUT: break;
    default: return;
  }
  ft_engine_event event{};
  event.kind = FT_EVENT_LOST;
  event.error = error;
  event.node = node;
  std::string link = proc_path(path_fd);
  ssize_t n = ::readlink(link.c_str(), event.path, sizeof event.path - 1);
  event.path[n > 0 ? n : 0] = '\0';
  push(event);
}

uint64_t EventRing::dropped() {
  std::lock_guard<std::mutex> guard(lock_);
  return dropped_;
}

}  // namespace ft
