// Reads the kernel serves itself (FUSE passthrough): a file open for reading only is handed to
// the kernel, which reads the target's file without a request to the engine. Needs libfuse 3.17+
// (FUSE_CAP_PASSTHROUGH), a kernel of 6.9+, CAP_SYS_ADMIN (the kernel's rule for registering
// a backing file), and a mount without the kernel's write-back cache (the kernel takes one or
// the other). Reads need no window; every write still goes through the engine.
//
// The kernel refuses to mix the two ways on one file: while a file has a handle open for
// passthrough, an open that is not fails, and the other way round. So the rule is kept per file
// here: an open for reading goes to the kernel only if no handle of the file is open through
// the engine, and an open through the engine (any writer) is refused while the kernel reads the
// file (after waiting for handles closed but not yet released). All passthrough handles of a
// file share one backing registration (the kernel allows one backing file per file), given back
// at the last one's release.
#pragma once

#include <fuse_lowlevel.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace ft {

// Why passthrough is on or off, for the log and the stats (ft_engine_stats.passthrough).
enum class PassthroughState : int {
  kOffLibfuse = 0,    // built against a libfuse before 3.17
  kOn = 1,
  kOffKernel = 2,     // the kernel does not offer it (before 6.9, or built without it)
  kOffWriteback = 3,  // the mount uses the kernel's write-back cache
  kOffPrivilege = 4,  // the daemon lacks CAP_SYS_ADMIN
  kOffAsked = 5,      // FUSETHROTTLE_PASSTHROUGH=off in the daemon's environment
};

class Passthrough {
 public:
  // At INIT (op_init): ask for passthrough where everything allows it. Why it is on or off is
  // the stats' to say (the control plane logs it, in the log's format).
  void init(fuse_conn_info* conn, bool writeback_cache);
  // The session's descriptor, for giving backing registrations back without a request.
  void attach(int session_fd) { session_fd_ = session_fd; }
  PassthroughState state() const { return state_.load(std::memory_order_relaxed); }
  uint64_t opens() const { return opens_.load(std::memory_order_relaxed); }

  // How one open handle of a file goes: through the engine, or read by the kernel (kNone: not
  // counted, passthrough being off).
  enum class Way : uint8_t { kNone, kEngine, kKernel };
  // An open of *node* with *flags* on the target's *fd*. Sets fi->backing_id for the kernel's
  // way. -ETXTBSY: an open through the engine while the kernel reads the file.
  int open(fuse_req_t req, fuse_ino_t node, int flags, int fd, fuse_file_info* fi, Way* way);
  // The handle *fh* of that open, once the engine has one: what its release gives back.
  void opened(uint64_t fh, fuse_ino_t node, Way way);
  // An open that got no handle (its reply failed, or it was refused afterwards).
  void undo(fuse_ino_t node, Way way);
  // The handle's release (op_release), or the caller of its open was gone.
  void released(uint64_t fh);

 private:
  struct File {
    uint32_t engine = 0;  // handles open through the engine
    uint32_t kernel = 0;  // handles the kernel reads
    int backing_id = 0;   // their shared registration, while kernel > 0
  };
  void drop(fuse_ino_t node, Way way);  // with lock_ held

  std::atomic<PassthroughState> state_{PassthroughState::kOffLibfuse};
  std::atomic<uint64_t> opens_{0};
  std::atomic<uint64_t> tracked_{0};  // entries of handles_: none while passthrough is off
  int session_fd_ = -1;
  std::mutex lock_;
  std::condition_variable released_;  // a kernel handle went
  std::unordered_map<fuse_ino_t, File> files_;
  std::unordered_map<uint64_t, std::pair<fuse_ino_t, Way>> handles_;
};

// How long an open through the engine waits for the kernel's handles of the file to go (a
// reader that closed it: its release is on its way) before it is refused.
constexpr std::chrono::milliseconds kPassthroughWait{200};

}  // namespace ft
