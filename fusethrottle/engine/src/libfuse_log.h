// libfuse's own messages (fuse_log: an option it refuses, a failed mount, a thread of its loop
// that could not be set up) are queued here for the control plane, which writes them through
// its logger in the log's format, instead of libfuse's default: plain lines on stderr.
// Process-wide, as libfuse's log function is. Whatever libfuse prints with perror() (in 3.14:
// errors reading or writing /dev/fuse) or before ft_engine_capture_libfuse_log() still goes to
// stderr as it is.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "fd.h"

namespace ft {

class LibfuseLog {
 public:
  static constexpr size_t kCapacity = 256;  // messages queued at most; the oldest go first
  static constexpr size_t kLongest = 1024;  // bytes of one message at most
  static LibfuseLog& instance();
  // Route libfuse's log here (once; later calls only answer): the descriptor that turns
  // readable when messages are queued, or minus the errno of eventfd().
  int capture();
  void push(int level, std::string message);
  // The oldest message into *out* (of *size*, NUL-terminated, cut short if longer): its
  // libfuse level (FUSE_LOG_*), or -1 when none is queued.
  int pop(char* out, size_t size);
  uint64_t dropped();

 private:
  // A leaf: nothing else is taken while it is held, and nothing under it calls libfuse.
  std::mutex lock_;
  std::deque<std::pair<int, std::string>> queue_;
  uint64_t dropped_ = 0;
  Fd signal_;
  bool captured_ = false;
};

}  // namespace ft
