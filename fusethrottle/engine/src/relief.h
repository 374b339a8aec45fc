// Keeping the engine's descriptors within the process's limit by asking the kernel to drop
// names.
//
// Every file the kernel knows holds an O_PATH descriptor here (inode.h), and the kernel keeps
// every name it looked up until memory pressure makes it let go, which on a host with free
// memory is never. A backup of a million files would need a million descriptors, far past a
// container's usual limit: lookups past it fail with EMFILE, and the backup with them. So past
// three quarters of the limit a thread of its own asks the kernel to drop the oldest names it
// learned (FUSE_NOTIFY_INVAL_ENTRY, one per name), and the kernel answers with a FORGET for
// each file nothing else holds, which closes its descriptor, until four fifths of that bound
// remain. A tree walk learns a directory before its files, so the oldest names are mostly
// directories, and dropping one drops the names under it too. Files open or owing a sync keep
// their names; the kernel looks any dropped name up again when it is next used. The kernel may
// wait inside the notification for a request in the same directory, hence not a request's
// thread.
#pragma once

#include <fuse_lowlevel.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>

namespace ft {

class InodeTable;
class Window;

// How many known files the table may hold: *high* starts the relief, *low* ends it (a
// quarter of the descriptor limit left for open files, directories being listed, sockets).
struct ReliefBounds {
  size_t high;
  size_t low;
};
ReliefBounds relief_bounds(size_t descriptor_limit);

class Relief {
 public:
  Relief(InodeTable& table, Window& window) : table_(table), window_(window) {}
  Relief(const Relief&) = delete;
  Relief& operator=(const Relief&) = delete;
  ~Relief();

  // Start watching the table of the mount *session* serves, within *bounds*.
  void start(fuse_session* session, ReliefBounds bounds);
  // A request ran out of descriptors (EMFILE) before the table reached its bound (files held
  // for their syncs, open handles, a loaded host whose FORGETs lag): names are dropped now,
  // a fifth of the table, and the caller waits at most *bound* for the kernel's FORGETs to
  // bring it down before it tries again. Never from the relief's own thread.
  void make_room(std::chrono::milliseconds bound);
  // Known files at which names are dropped (0: no limit to keep), names asked so far.
  size_t high() const { return bounds_.high; }
  uint64_t asked() const { return asked_.load(std::memory_order_relaxed); }

 private:
  void run();
  void relieve(size_t down_to);

  InodeTable& table_;
  Window& window_;
  fuse_session* session_ = nullptr;
  ReliefBounds bounds_{};
  std::mutex lock_;
  std::condition_variable wake_;
  bool full_ = false;
  bool pressed_ = false;  // make_room asked: relieve below the bound too
  bool stopping_ = false;
  std::atomic<uint64_t> asked_{0};
  std::thread thread_;
};

}  // namespace ft
