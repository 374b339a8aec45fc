// Threads named for what they do, so `top -H`, perf and the benches can tell the engine's
// work from the control plane's (a new thread inherits its creator's name: libfuse's request
// threads take the name of the one that starts the loop).
#pragma once

#include <pthread.h>

#include <array>

namespace ft {

// Names the calling thread for as long as the object lives, then gives the old name back (the
// loop runs on a thread the control plane lent). At most 15 characters, the kernel's limit.
class ThreadName {
 public:
  explicit ThreadName(const char* name) {
    if (::pthread_getname_np(::pthread_self(), old_.data(), old_.size()) != 0) old_[0] = '\0';
    ::pthread_setname_np(::pthread_self(), name);
  }
  ~ThreadName() {
    if (old_[0] != '\0') ::pthread_setname_np(::pthread_self(), old_.data());
  }
  ThreadName(const ThreadName&) = delete;
  ThreadName& operator=(const ThreadName&) = delete;

 private:
  std::array<char, 16> old_{};
};

// For a thread the engine made itself: named once, for good.
inline void name_this_thread(const char* name) { ::pthread_setname_np(::pthread_self(), name); }

}  // namespace ft
