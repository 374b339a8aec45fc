#include "passthrough.h"

#include <fcntl.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ft {
namespace {

#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
// FUSE_DEV_IOC_BACKING_OPEN on the session's device, as fuse_passthrough_open makes it but
// without the request: libfuse's reads the session through *req*, which an interrupt that
// answered the caller meanwhile has freed (call.h). The backing id, or -1 and errno.
int backing_open(int session_fd, int fd) {
  struct {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
  } map{fd, 0, 0};
  static_assert(sizeof(map) == 16, "struct fuse_backing_map");
  return ::ioctl(session_fd, _IOW(229, 1, decltype(map)), &map);
}
#endif


}  // namespace

void Passthrough::init([[maybe_unused]] fuse_conn_info* conn, [[maybe_unused]] bool writeback_cache) {
  PassthroughState state = PassthroughState::kOffLibfuse;
#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
  const char* asked = std::getenv("FUSETHROTTLE_PASSTHROUGH");
  if (!(conn->capable_ext & FUSE_CAP_PASSTHROUGH)) {
    state = PassthroughState::kOffKernel;
  } else if (asked != nullptr && std::strcmp(asked, "off") == 0) {
    // The same engine with the kernel's reads left off: what bench.passthrough_reads sets
    // beside it to show that the write path does not change with passthrough.
    state = PassthroughState::kOffAsked;
  } else if (writeback_cache) {
    state = PassthroughState::kOffWriteback;
  } else {
    conn->want_ext |= FUSE_CAP_PASSTHROUGH;
    // The target's files are on a file system of no stacking (NFS, a local disk): depth 1.
    conn->max_backing_stack_depth = 1;
    state = PassthroughState::kOn;
  }
#endif
  state_.store(state, std::memory_order_relaxed);
}

int Passthrough::open([[maybe_unused]] fuse_req_t req, fuse_ino_t node, [[maybe_unused]] int flags,
                      [[maybe_unused]] int fd, [[maybe_unused]] fuse_file_info* fi, Way* way) {
  *way = Way::kNone;
  if (state() != PassthroughState::kOn) return 0;
  *way = Way::kEngine;
  std::unique_lock<std::mutex> guard(lock_);
#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
  if ((flags & O_ACCMODE) == O_RDONLY && files_[node].engine == 0) {
    File& f = files_[node];
    if (f.kernel == 0) {
      int id = backing_open(session_fd_, fd);
      if (id <= 0) {
        // Refused (EPERM without CAP_SYS_ADMIN): the engine reads, now and from now on.
        PassthroughState was = PassthroughState::kOn;
        state_.compare_exchange_strong(was, PassthroughState::kOffPrivilege);
        f.engine++;
        return 0;
      }
      f.backing_id = id;
    }
    f.kernel++;
    fi->backing_id = f.backing_id;
    *way = Way::kKernel;
    opens_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
#endif
  if (files_[node].kernel > 0) {
    // A reader that closed the file may not be released yet: its RELEASE is on its way.
    released_.wait_for(guard, kPassthroughWait, [&] { return files_[node].kernel == 0; });
    if (files_[node].kernel > 0) return -ETXTBSY;
  }
  files_[node].engine++;
  return 0;
}

void Passthrough::opened(uint64_t fh, fuse_ino_t node, Way way) {
  if (way == Way::kNone) return;
  std::lock_guard<std::mutex> guard(lock_);
  handles_[fh] = {node, way};
  tracked_.fetch_add(1, std::memory_order_relaxed);
}

void Passthrough::undo(fuse_ino_t node, Way way) {
  if (way == Way::kNone) return;
  std::lock_guard<std::mutex> guard(lock_);
  drop(node, way);
}

void Passthrough::released(uint64_t fh) {
  if (tracked_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> guard(lock_);
  auto it = handles_.find(fh);
  if (it == handles_.end()) return;
  auto [node, way] = it->second;
  handles_.erase(it);
  tracked_.fetch_sub(1, std::memory_order_relaxed);
  drop(node, way);
}

void Passthrough::drop(fuse_ino_t node, Way way) {
  auto it = files_.find(node);
  if (it == files_.end()) return;
  File& f = it->second;
  if (way == Way::kKernel) {
    if (f.kernel > 0 && --f.kernel == 0 && f.backing_id > 0) {
      // FUSE_DEV_IOC_BACKING_CLOSE: the kernel's open files keep their own hold on it.
      uint32_t id = static_cast<uint32_t>(f.backing_id);
      ::ioctl(session_fd_, _IOW(229, 2, uint32_t), &id);
      f.backing_id = 0;
    }
    released_.notify_all();
  } else if (f.engine > 0) {
    f.engine--;
  }
  if (f.engine == 0 && f.kernel == 0) files_.erase(it);
}

}  // namespace ft
