// Events for the control plane (fsync samples, failures): queued here, an eventfd tells trio
// there are some. Engine threads only push; nothing here calls into Python.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>

#include "fd.h"
#include "fusethrottle_engine.h"

namespace ft {

class EventRing {
 public:
  static constexpr size_t kCapacity = 4096;  // samples queued at most
  // 0, or minus the errno of eventfd().
  int open();
  int fd() const { return signal_.get(); }
  // Queue *event*; when the control plane lags kCapacity samples behind, the oldest sample is
  // dropped (and counted): the engine never waits for Python. A LOST is never dropped (one
  // per file while it waits: the files the target failed bound them), whatever the samples.
  void push(const ft_engine_event& event);
  size_t drain(ft_engine_event* out, size_t max);
  // Make the descriptor readable without an event: the control plane should look at the
  // statistics now (a request waits for the fleet's lease).
  void poke();
  uint64_t dropped();
  // The target failed to store data of the file *path_fd* names, with *error*: a LOST event
  // if the error says so (a bad request is not a loss).
  void lost(uint64_t node, int path_fd, int error);

 private:
  std::mutex lock_;
  std::deque<ft_engine_event> queue_;
  size_t samples_ = 0;  // the events of queue_ that are not LOST
  uint64_t dropped_ = 0;
  Fd signal_;
};

}  // namespace ft
