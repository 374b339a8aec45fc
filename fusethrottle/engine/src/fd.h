// A file descriptor with one owner: closed when the owner goes, never twice.
#pragma once

#include <unistd.h>

#include <string>
#include <utility>

namespace ft {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }

  int get() const { return fd_; }
  // Hand the descriptor to an owner outside this type (fdopendir's DIR).
  int release() { return std::exchange(fd_, -1); }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);  // errors of close go nowhere: the kernel ignores release's
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// The path through which an O_PATH descriptor reaches its file for calls that take no
// descriptor of that kind (chmod, truncate, xattrs, reopening).
inline std::string proc_path(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

}  // namespace ft
