#include "events.h"

#include <sys/eventfd.h>
#include <unistd.h>

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
    if (queue_.size() >= kCapacity) {
      queue_.pop_front();
      dropped_++;
    }
    queue_.push_back(event);
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
