#include "libfuse_log.h"

#include <fuse_log.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "fusethrottle_engine.h"

namespace ft {

namespace {

void from_libfuse(enum fuse_log_level level, const char* format, va_list args) {
  char text[LibfuseLog::kLongest];
  int n = std::vsnprintf(text, sizeof(text), format, args);
  if (n < 0) return;
  std::string message(text);
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r'))
    message.pop_back();
  if (message.empty()) return;
  LibfuseLog::instance().push(static_cast<int>(level), std::move(message));
}

}  // namespace

LibfuseLog& LibfuseLog::instance() {
  static LibfuseLog log;
  return log;
}

int LibfuseLog::capture() {
  std::lock_guard<std::mutex> guard(lock_);
  if (!captured_) {
    signal_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!signal_) return -errno;
    fuse_set_log_func(from_libfuse);
    captured_ = true;
  }
  return signal_.get();
}

void LibfuseLog::push(int level, std::string message) {
  int fd = -1;
  {
    std::lock_guard<std::mutex> guard(lock_);
    if (queue_.size() >= kCapacity) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.emplace_back(level, std::move(message));
    fd = signal_.get();
  }
  if (fd >= 0) {
    uint64_t one = 1;
    (void)!::write(fd, &one, sizeof(one));
  }
}

int LibfuseLog::pop(char* out, size_t size) {
  std::lock_guard<std::mutex> guard(lock_);
  if (queue_.empty()) return -1;
  auto [level, message] = std::move(queue_.front());
  queue_.pop_front();
  if (out != nullptr && size > 0) std::snprintf(out, size, "%s", message.c_str());
  return level;
}

uint64_t LibfuseLog::dropped() {
  std::lock_guard<std::mutex> guard(lock_);
  return dropped_;
}

}  // namespace ft

extern "C" {

int ft_engine_capture_libfuse_log(void) { return ft::LibfuseLog::instance().capture(); }

int ft_engine_read_libfuse_log(char* out, size_t size) {
  return ft::LibfuseLog::instance().pop(out, size);
}

uint64_t ft_engine_libfuse_log_dropped(void) { return ft::LibfuseLog::instance().dropped(); }
}
