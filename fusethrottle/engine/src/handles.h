// What an open file or directory of the mount holds on the target.
#pragma once

#include <dirent.h>
#include <fuse_lowlevel.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "fd.h"

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

struct OpenFile {
  explicit OpenFile(std::atomic<uint64_t>& handles) : tally(handles) {}
  Fd fd;
  bool direct = false;  // opened with O_DIRECT: its data goes through an aligned buffer
  Tally tally;
  // Writes leave no page in the target's page cache (target_io, ops.cc: write_uncached): a
  // second descriptor for O_DIRECT writes, opened at the first whole run of pages, tried once
  // (none where the target has no direct I/O or refuses the reopen).
  std::mutex uncached_lock;
  bool uncached_tried = false;
  Fd uncached;
};

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

struct OpenDir {
  explicit OpenDir(std::atomic<uint64_t>& handles) : tally(handles) {}
  Tally tally;
  std::unique_ptr<DIR, DirCloser> dir;
  off_t offset = 0;            // where the stream stands (telldir)
  struct dirent* pending = nullptr;  // read but not yet handed to the kernel
};

// A handle's owner is the kernel between open and release: fi->fh carries it.
template <typename T>
uint64_t hand_over(std::unique_ptr<T> handle) {
  return reinterpret_cast<uint64_t>(handle.release());
}
template <typename T>
T& borrow(const fuse_file_info* fi) {
  return *reinterpret_cast<T*>(fi->fh);
}
template <typename T>
std::unique_ptr<T> take_back(const fuse_file_info* fi) {
  return std::unique_ptr<T>(reinterpret_cast<T*>(fi->fh));
}

}  // namespace ft
