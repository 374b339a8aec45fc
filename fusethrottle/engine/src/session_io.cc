#include "session_io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "fd.h"

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

// A request thread's reading of /dev/fuse, and the memory of its buffer.
//
// libfuse gives each request thread a buffer of max_write and a page (1 MiB here) for its
// life, and the threads never end (the loop keeps them all). Each 1 MiB write fills a buffer,
// so after a burst of parallel writes every thread holds a megabyte resident, for as long as
// the mount is up: a mount idle between nightly backups kept its busiest minute's memory.
// So a thread whose buffer is filled past its first 64 KiB waits for its next request with a
// timeout, and after buffer_idle_ms without one gives those pages back (MADV_DONTNEED) before
// it waits as before. Only the thread itself touches its buffer, between two reads, when the
// kernel cannot be copying a request into it.
//
// The wait with a timeout is a non-blocking read and an epoll of the thread's own descriptor
// (clone_fd) registered EPOLLEXCLUSIVE: a request wakes one waiter, as it wakes one blocked
// reader, not every thread that waits with a buffer to give back.
struct Reader {
  int fd = -1;     // the descriptor this thread read last (its clone)
  Fd poller;       // epoll of fd, made at the first timed wait
  bool nonblocking = false;
  size_t touched = 0;  // the bytes of the buffer written since it was last given back

  void follow(int now_fd) {
    if (fd == now_fd) return;
    fd = now_fd;
    poller.reset();
    nonblocking = false;
    touched = 0;
  }
  bool set_nonblocking(bool on) {
    int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) return false;
    flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
    if (::fcntl(fd, F_SETFL, flags) != 0) return false;
    nonblocking = on;
    return true;
  }
  // Wait at most *ms* for the descriptor to have a request; false on a timeout.
  bool wait_readable(int ms) {
    if (!poller) {
      poller.reset(::epoll_create1(EPOLL_CLOEXEC));
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLEXCLUSIVE;
      if (!poller || ::epoll_ctl(poller.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
        poller.reset();
        pollfd p{fd, POLLIN, 0};  // fallback: every waiter wakes, then all but one wait again
        return ::poll(&p, 1, ms) != 0;
      }
    }
    epoll_event ev{};
    return ::epoll_wait(poller.get(), &ev, 1, ms) != 0;
  }
};

// What every request touches (its header, a small write's data) stays: a thread that only
// served requests below this waits without a timeout, one syscall per request as before
// (with 4096, every small file's write put its thread on the timed wait: three syscalls per
// request while it waits, a few percent of the daemon's CPU creating small files).
constexpr size_t kKeepResident = 64 << 10;

thread_local Reader reader;

ssize_t read_request(Reader& r, void* buf, size_t size) {
  for (;;) {
    ssize_t n = ::read(r.fd, buf, size);
    // EAGAIN only while this thread waits with a timeout (its descriptor is non-blocking),
    // or if its descriptor is shared after all (no clone): wait for a request and read again.
    if (n >= 0 || errno != EAGAIN) return n;
    r.wait_readable(-1);
  }
}

ssize_t io_read(int fd, void* buf, size_t size, void* userdata) {
  Reader& r = reader;
  r.follow(fd);
  int idle_ms = session_io_of(userdata).buffer_idle_ms;
  if (idle_ms > 0 && r.touched > kKeepResident && (r.nonblocking || r.set_nonblocking(true))) {
    using Clock = std::chrono::steady_clock;
    auto deadline = Clock::now() + std::chrono::milliseconds(idle_ms);
    for (;;) {
      ssize_t n = ::read(fd, buf, size);
      if (n >= 0 || errno != EAGAIN) {
        if (n > 0) r.touched = std::max(r.touched, static_cast<size_t>(n));
        return n;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      r.wait_readable(static_cast<int>(left.count()) + 1);
    }
    // Quiet for idle_ms: give the pages back, then wait as every clean thread does.
    PageRange back = pages_to_give_back(static_cast<char*>(buf), r.touched, kKeepResident);
    if (back.length > 0) ::madvise(back.start, back.length, MADV_DONTNEED);
    r.touched = kKeepResident;
    r.set_nonblocking(false);
  }
  ssize_t n = read_request(r, buf, size);
  if (n > 0) r.touched = std::max(r.touched, static_cast<size_t>(n));
  return n;
}

ssize_t io_splice(int in, off_t* in_off, int out, off_t* out_off, size_t len, unsigned flags,
                  void*) {
  return ::splice(in, in_off, out, out_off, len, flags);
}

#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
// libfuse 3.17 gives a request thread a descriptor of its own (clone_fd) only through custom
// io's clone_fd: without it every thread would share one. The clone is 3.14's: a new /dev/fuse
// attached to the session's (FUSE_DEV_IOC_CLONE).
int io_clone_fd(int master) {
  Fd fd(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
  uint32_t session_fd = static_cast<uint32_t>(master);
  if (!fd || ::ioctl(fd.get(), _IOR(229, 0, uint32_t), &session_fd) != 0) return -1;
  return fd.release();
}
#endif

}  // namespace

PageRange pages_to_give_back(char* buf, size_t touched, size_t keep) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t from = reinterpret_cast<uintptr_t>(buf) + keep;
  uintptr_t to = reinterpret_cast<uintptr_t>(buf) + touched;
  from = (from + page - 1) & ~(page - 1);
  to &= ~(page - 1);
  if (to <= from) return {nullptr, 0};
  return {reinterpret_cast<char*>(from), to - from};
}

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
#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
  static const fuse_custom_io io = {io_writev, io_read, io_splice, io_splice, io_clone_fd};
  return fuse_session_custom_io_317(se, &io, sizeof io, fd);
#else
  static const fuse_custom_io io = {io_writev, io_read, io_splice, io_splice};
  return fuse_session_custom_io(se, &io, fd);
#endif
}

}  // namespace ft
