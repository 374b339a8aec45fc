// What an open file or directory of the mount holds on the target.
#pragma once

#include <dirent.h>
#include <fuse_lowlevel.h>

#include <memory>

#include "fd.h"

namespace ft {

struct OpenFile {
  Fd fd;
  bool direct = false;  // opened with O_DIRECT: its data goes through an aligned buffer
};

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

struct OpenDir {
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
