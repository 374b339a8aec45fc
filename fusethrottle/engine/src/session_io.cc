#include "session_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace ft {
namespace {

constexpr uint32_t kHandleKillprivV2 = 1u << 28;  // FUSE_HANDLE_KILLPRIV_V2, protocol 7.33
constexpr size_t kOutHeader = 16;                 // struct fuse_out_header: len, error, unique
constexpr size_t kFlagsAt = 12;                   // fuse_init_out: major, minor, max_readahead, flags
constexpr uint32_t kMajor = 7;

ssize_t io_writev(int fd, struct iovec* iov, int count, void* userdata) {
  SessionIo& io = session_io_of(userdata);
  // Nothing but INIT is answered before INIT: only the first reply is looked at.
  if (!io.replied.load(std::memory_order_relaxed)) {
    io.replied.store(true, std::memory_order_relaxed);
    if (io.ask_killpriv_v2 && add_killpriv_v2(iov, count)) io.killpriv_v2.store(true);
  }
  return ::writev(fd, iov, count);
}

ssize_t io_read(int fd, void* buf, size_t size, void*) { return ::read(fd, buf, size); }

ssize_t io_splice(int in, off_t* in_off, int out, off_t* out_off, size_t len, unsigned flags,
                  void*) {
  return ::splice(in, in_off, out, out_off, len, flags);
}

}  // namespace

bool add_killpriv_v2(struct iovec* iov, int count) {
  if (count != 2 || iov[0].iov_len != kOutHeader) return false;
  // fuse_init_out is 24 bytes before protocol 7.23 and 64 since.
  if (iov[1].iov_len != 24 && iov[1].iov_len != 64) return false;
  uint32_t length = 0;
  int32_t error = 0;
  uint32_t major = 0;
  std::memcpy(&length, iov[0].iov_base, sizeof length);
  std::memcpy(&error, static_cast<char*>(iov[0].iov_base) + 4, sizeof error);
  std::memcpy(&major, iov[1].iov_base, sizeof major);
  if (error != 0 || length != kOutHeader + iov[1].iov_len || major != kMajor) return false;
  uint32_t flags = 0;
  char* at = static_cast<char*>(iov[1].iov_base) + kFlagsAt;
  std::memcpy(&flags, at, sizeof flags);
  flags |= kHandleKillprivV2;
  std::memcpy(at, &flags, sizeof flags);
  return true;
}

int use_session_io(fuse_session* se, int fd) {
  // splice both ways too, as libfuse does without custom io (writes land by splice).
  static const fuse_custom_io io = {io_writev, io_read, io_splice, io_splice};
  return fuse_session_custom_io(se, &io, fd);
}

}  // namespace ft
