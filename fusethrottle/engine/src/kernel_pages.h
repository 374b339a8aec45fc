// Dropping what the target has committed from the mount's own page cache.
//
// Every byte a backup writes through the mount sits in two page caches: the mount's (where the
// application's write() put it) and the target's. The flusher drops the target's copy once it
// is synced (posix_fadvise); the mount's copy is charged to the application's memory cgroup
// and stays, clean, until reclaim finds it: a backup of 10 GiB leaves up to 10 GiB of pages
// nobody reads again, pushing a database's data out of the same cgroup. Only the kernel can
// drop them: FUSE_NOTIFY_INVAL_INODE names a node and a byte range. The kernel writes back a
// page in the range that is dirty again first, through this engine's request threads, and a
// notification may wait for them: so a thread of its own sends them, never a request's or a
// sync's.
#pragma once

#include <fuse_lowlevel.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace ft {

class Inode;
class InodeTable;

class KernelPages {
 public:
  // How long stop() waits for a drop in progress by default: past it the thread is left.
  static constexpr std::chrono::milliseconds kStopWait{1000};

  explicit KernelPages(InodeTable& table) : table_(table), state_(std::make_shared<State>()) {}
  KernelPages(const KernelPages&) = delete;
  KernelPages& operator=(const KernelPages&) = delete;
  ~KernelPages() { stop(kStopWait); }

  void start(fuse_session* session);
  // End the thread (before the session goes); later drops are ignored. A drop the kernel
  // holds (it writes a dirty page of the range back first, through a request thread the
  // target may hold) cannot be cut short: the thread is waited for at most *bound*, then left
  // to end by itself (it touches nothing of the engine's after that drop). True if it ended.
  bool stop(std::chrono::milliseconds bound = kStopWait);
  // A thread was left inside a drop (stop() returned false): the session must outlive it.
  bool left() const { return left_; }
  // Ask for [lo, hi) of *inode*'s pages to be dropped (not the page the application may still
  // be filling: its next write would read it back first). Ranges of one file queued meanwhile
  // are merged. Holding the inode keeps its node id from naming another file meanwhile.
  void drop(std::shared_ptr<Inode> inode, int64_t lo, int64_t hi);
  // Ranges the kernel was asked to drop and did (it had not forgotten the file).
  uint64_t dropped() const { return state_->dropped.load(std::memory_order_relaxed); }

 private:
  struct Range {
    std::shared_ptr<Inode> inode;
    int64_t lo, hi;
  };
  // Shared with the thread, which may outlive this object (see stop).
  struct State {
    std::mutex lock;
    std::condition_variable wake;
    std::unordered_map<const Inode*, Range> pending;
    bool stopping = false;
    bool ended = false;  // the thread returned
    std::atomic<uint64_t> dropped{0};
  };
  static void run(const std::shared_ptr<State>& state, InodeTable& table, fuse_session* session);

  InodeTable& table_;
  std::shared_ptr<State> state_;
  fuse_session* session_ = nullptr;
  std::thread thread_;
  bool left_ = false;
};

}  // namespace ft
