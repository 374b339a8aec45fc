// The flusher: one thread decides which files to fsync (Window::wait_due), a few others run
// the fsyncs, so a slow target holds sync threads, never the request loop's. Every sync is
// timed and queued as an event for the control plane's controller.
#pragma once

#include <fcntl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "events.h"
#include "kernel_pages.h"
#include "window.h"

namespace ft {

class Flusher {
 public:
  Flusher(Window& window, EventRing& events, KernelPages& pages)
      : window_(window), events_(events), pages_(pages) {}
  Flusher(const Flusher&) = delete;
  Flusher& operator=(const Flusher&) = delete;
  ~Flusher() { stop_threads(); }

  void start(unsigned sync_threads);
  // For the end: finish the syncs under way, then fsync every file still dirty (three tries):
  // how many files are still un-synced after, or owe their writer a failure.
  size_t finish();

  uint64_t fsyncs() const { return fsyncs_.load(); }
  uint64_t errors() const { return errors_.load(); }
  uint64_t in_flight() const { return in_flight_.load(); }

 private:
  void decide();
  void work();
  // Sync *jobs* one after another and report them as one event (a group of small released
  // files, or one job).
  void run(std::vector<SyncJob>& jobs);
  void stop_threads();

  Window& window_;
  EventRing& events_;
  KernelPages& pages_;
  bool stopping_ = false;  // read by the deciding thread under the window's lock
  std::thread decider_;
  std::vector<std::thread> workers_;
  std::mutex queue_lock_;
  std::condition_variable queue_cv_;
  std::deque<SyncJob> queue_;
  bool draining_ = false;
  std::atomic<uint64_t> fsyncs_{0}, errors_{0}, in_flight_{0};
};

// fsync what *job* covers, as the file's writer: its written range in pieces first, dropped
// from the target's page cache after. 0 or the errno; Window::kNotSynced where nothing was
// synced (the file has no name left): not a sample of the target's commit rate.
int sync_job(SyncJob& job);

// sync_file_range(*fd*, *off*, *len*, *flags*): 0, or its errno (EIO where it gave none). A
// wait (SYNC_FILE_RANGE_WAIT_AFTER) is told of a failed write-back once for this descriptor:
// the kernel advances the descriptor's error cursor past it, as fdatasync does, so an
// fdatasync after returns 0 and this result is the one report of it. Never ignore it.
int write_back_range(int fd, int64_t off, int64_t len, unsigned flags);

// Write a range back and wait for it (started anew if a write-back was already under way).
constexpr unsigned kWriteBackAndWait =
    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;

}  // namespace ft
