// What an open file or directory of the mount holds on the target.
#pragma once

#include <dirent.h>
#include <fuse_lowlevel.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "fd.h"
#include "inode.h"
#include "window.h"

namespace ft {

// Counts itself in *count* for its life: the mount's open handles, for status.
class Tally {
 public:
  explicit Tally(std::atomic<uint64_t>& count) : count_(count) { count_.fetch_add(1, std::memory_order_relaxed); }
  ~Tally() { count_.fetch_sub(1, std::memory_order_relaxed); }
  Tally(const Tally&) = delete;
  Tally& operator=(const Tally&) = delete;

 private:
  std::atomic<uint64_t>& count_;
};

// An open file or directory of the mount. The kernel holds it from open to release (fi->fh is
// its address); a request on it holds it too while its handler runs (call.h), so a handler
// whose caller was answered early (a killed caller's interrupt) still has its descriptor after
// the kernel released it: the descriptor is let go of when the last of them is done.
class Handle : public std::enable_shared_from_this<Handle> {
 public:
  explicit Handle(std::atomic<uint64_t>& handles) : tally_(handles) {}
  virtual ~Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

 private:
  template <typename T>
  friend uint64_t hand_over(std::shared_ptr<T> handle);
  template <typename T>
  friend std::shared_ptr<T> take_back(const fuse_file_info* fi);
  Tally tally_;
  std::shared_ptr<Handle> kernels_;  // the kernel's hold, from open to release
};

// An open file of the mount. When its last holder lets go, the file's open count (the
// window's) is one less and the window takes its descriptor (for the file's release sync).
struct OpenFile : Handle {
  // Made once the window counted the open (Window::Opening, kept from then on: this handle's
  // release ends the count).
  OpenFile(std::atomic<uint64_t>& handles, Window& window, std::shared_ptr<Inode> inode)
      : Handle(handles), window_(window), inode_(std::move(inode)) {}
  ~OpenFile() override {
    uncached.reset();  // before the window may let go of the file (removal.h)
    window_.released(inode_, std::move(fd), closing_.load(std::memory_order_acquire));
  }
  // Its process closed it (FLUSH): its RELEASE may be on its way (Window::at_open, let_go).
  void flushed() {
    if (!closing_.exchange(true, std::memory_order_acq_rel)) window_.closing(*inode_, true);
  }
  // A read or write through it after a FLUSH: a duplicate of it is still open somewhere.
  void used() {
    if (closing_.load(std::memory_order_relaxed) && closing_.exchange(false, std::memory_order_acq_rel))
      window_.closing(*inode_, false);
  }
  Fd fd;
  bool direct = false;  // opened with O_DIRECT: its data goes through an aligned buffer
  // Writes leave no page in the target's page cache (target_io, ops.cc: write_uncached): a
  // second descriptor for O_DIRECT writes, opened at the first whole run of pages, tried once
  // (none where the target has no direct I/O or refuses the reopen).
  std::mutex uncached_lock;  // a leaf lock: held only to open the descriptor once
  bool uncached_tried = false;
  Fd uncached;

 private:
  Window& window_;
  std::shared_ptr<Inode> inode_;
  std::atomic<bool> closing_{false};
};

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

struct OpenDir : Handle {
  explicit OpenDir(std::atomic<uint64_t>& handles) : Handle(handles) {}
  std::unique_ptr<DIR, DirCloser> dir;
  off_t offset = 0;            // where the stream stands (telldir)
  struct dirent* pending = nullptr;  // read but not yet handed to the kernel
};

// The kernel takes its hold of *handle*: fi->fh from now on.
template <typename T>
uint64_t hand_over(std::shared_ptr<T> handle) {
  Handle* held = handle.get();
  held->kernels_ = std::move(handle);
  return reinterpret_cast<uint64_t>(held);
}
// The handle of a request (valid while the kernel or the request's handler holds it).
template <typename T>
T& borrow(const fuse_file_info* fi) {
  return *static_cast<T*>(reinterpret_cast<Handle*>(fi->fh));
}
// A request's own hold of its handle, for as long as its handler runs.
inline std::shared_ptr<Handle> hold(const fuse_file_info* fi) {
  return reinterpret_cast<Handle*>(fi->fh)->shared_from_this();
}
// The release: the kernel's hold ends (the handle goes with the last hold).
template <typename T>
std::shared_ptr<T> take_back(const fuse_file_info* fi) {
  Handle* held = reinterpret_cast<Handle*>(fi->fh);
  return std::static_pointer_cast<T>(std::move(held->kernels_));
}

}  // namespace ft
