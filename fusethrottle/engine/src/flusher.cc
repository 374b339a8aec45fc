#include "flusher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "caller.h"
#include "inode.h"
#include "thread_name.h"

namespace ft {

namespace {

// Reopen a file through its O_PATH descriptor as its last writer (a squashing target refuses
// the daemon's root, as NFS's own write-back would not be); this thread's ids come back
// before anything else runs on it.
Fd reopen_as_writer(int path_fd, uint64_t writer, int* error) {
  Fd fd = open_as(path_fd, writer, O_RDONLY | O_CLOEXEC, error);
  if (!fd && *error == EACCES) fd = open_as(path_fd, writer, O_WRONLY | O_CLOEXEC, error);
  return fd;
}


// Write [lo, hi) back *piece* bytes at a time, two pieces in the target's queue: the next is
// started before the previous is waited for, so the target never idles between them and no
// page waits behind more than two (reclaim that meets a page under write-back waits for it).
// 0, or the errno of the first call that failed (write_back_range: the one report of it).
int write_back_in_pieces(int fd, int64_t lo, int64_t hi, int64_t piece) {
  constexpr unsigned kStart = SYNC_FILE_RANGE_WRITE;
  int error = 0;
  auto call = [&](int64_t off, int64_t len, unsigned flags) {
    if (int failed = write_back_range(fd, off, len, flags); failed != 0 && error == 0) error = failed;
  };
  int64_t previous = -1;
  for (int64_t off = lo; off < hi; off += piece) {
    call(off, std::min(piece, hi - off), kStart);
    if (previous >= 0) call(previous, piece, kWriteBackAndWait);
    previous = off;
  }
  if (previous >= 0) call(previous, std::min(piece, hi - previous), kWriteBackAndWait);
  return error;
}

// Whether the file has no name left, as the target's client last knew (a plain fstat of a
// file just written or renamed is a GETATTR on NFS: one per file an rsync writes). Wrong only
// where another host linked a name this one removed: that file's sync is skipped, and its
// data still reaches the target when its descriptor closes.
bool no_name_left(int fd) {
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_NLINK, &sx) != 0) return false;
  return (sx.stx_mask & STATX_NLINK) != 0 && sx.stx_nlink == 0;
}

}  // namespace

int write_back_range(int fd, int64_t off, int64_t len, unsigned flags) {
  if (::sync_file_range(fd, off, len, flags) == 0) return 0;
  return errno != 0 ? errno : EIO;
}

int sync_job(SyncJob& job) {
  // A file with no name left needs no sync: nothing can read it after. Not a sync either: its
  // bytes are let go, never counted as synced nor timed as the target's commit rate.
  if (no_name_left(job.inode->fd())) return Window::kNotSynced;
  Fd fd = std::move(job.held);
  if (!fd) {
    int error = 0;
    fd = reopen_as_writer(job.inode->fd(), job.inode->writer(), &error);
    if (!fd) return error;
  }
  bool ranged = job.lo >= 0 && job.hi > job.lo;
  if (ranged && job.piece > 0) {
    const auto piece = static_cast<int64_t>(job.piece);
    if (int error = write_back_in_pieces(fd.get(), job.lo, job.hi, piece); error != 0) return error;
    // And what was written past the range while that ran: else the fdatasync puts all of it
    // under write-back at once (and ext4's commit waits for it, with every journal handle of
    // the target behind it: a readdir's atime update hung on a stalled target). Again while
    // the writer keeps adding more than a piece during a pass (the engine's writer is fast:
    // one pass left 12-25 MiB to the fdatasync in test_memory's pieces test); the window
    // bounds what it can add, the passes bound the rest. The size the client holds, not a
    // GETATTR (a plain fstat on NFS writes back every dirty page first).
    constexpr int kTailPasses = 8;
    int64_t done = job.hi;
    for (int pass = 0; pass < kTailPasses; pass++) {
      struct statx sx {};
      if (::statx(fd.get(), "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_SIZE, &sx) != 0) break;
      const auto size = static_cast<int64_t>(sx.stx_size);
      if (size <= done) break;
      if (int error = write_back_in_pieces(fd.get(), done, size, piece); error != 0) return error;
      if (size - done < piece) break;  // what came meanwhile is less than a piece
      done = size;
    }
  }
  if (::fdatasync(fd.get()) != 0) return errno != 0 ? errno : EIO;
  // The backup never reads it again: synced data does not crowd the page cache.
  if (ranged && job.drop) ::posix_fadvise(fd.get(), job.lo, job.hi - job.lo, POSIX_FADV_DONTNEED);
  return 0;
}

void Flusher::start(unsigned sync_threads) {
  decider_ = std::thread([this] {
    name_this_thread("ft-sync-decide");
    decide();
  });
  for (unsigned i = 0; i < std::max(1u, sync_threads); i++)
    workers_.emplace_back([this] {
      name_this_thread("ft-sync");
      work();
    });
}

void Flusher::decide() {
  for (;;) {
    std::vector<SyncJob> jobs = window_.wait_due(stopping_);
    if (jobs.empty()) return;  // stopping
    {
      std::lock_guard<std::mutex> guard(queue_lock_);
      for (auto& job : jobs) queue_.push_back(std::move(job));
    }
    // A worker per job, at most (a group is one worker's).
    for (size_t i = 0; i < jobs.size() && i < workers_.size(); i++) queue_cv_.notify_one();
  }
}

void Flusher::work() {
  constexpr size_t kGroupMax = 256;
  for (;;) {
    std::vector<SyncJob> jobs;
    {
      std::unique_lock<std::mutex> guard(queue_lock_);
      queue_cv_.wait(guard, [this] { return !queue_.empty() || draining_; });
      if (queue_.empty()) return;
      jobs.push_back(std::move(queue_.front()));
      queue_.pop_front();
      if (jobs.front().groupable()) {
        for (auto it = queue_.begin(); it != queue_.end() && jobs.size() < kGroupMax;) {
          if (it->groupable()) {
            jobs.push_back(std::move(*it));
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    run(jobs);
  }
}

void Flusher::run(std::vector<SyncJob>& jobs) {
  ft_engine_event event{};
  event.kind = FT_EVENT_SYNC;
  event.reason = static_cast<uint32_t>(jobs.front().reason);
  event.node = reinterpret_cast<uint64_t>(jobs.front().inode.get());
  in_flight_ += jobs.size();
  double start = now_seconds();
  size_t ran = 0;
  for (auto& job : jobs) {
    if (window_.removing(*job.inode)) {  // its last name is being removed: no sync
      in_flight_--;
      window_.dropped(job);
      continue;
    }
    int error = sync_job(job);
    in_flight_--;
    if (error == Window::kNotSynced) {  // nothing reached the target: no sample of it
      window_.dropped(job);
      continue;
    }
    if (ran++ == 0) event.node = reinterpret_cast<uint64_t>(job.inode.get());
    fsyncs_++;
    // The mount's own copy too (drop_synced), of a file synced on its own: a group of small
    // released files is not (that would be one notification to the kernel per small file).
    bool ranged = job.lo >= 0 && job.hi > job.lo;
    if (error == 0 && job.drop && ranged && jobs.size() == 1 && job.reason != SyncReason::kEnd &&
        job.reason != SyncReason::kForget) {
      pages_.drop(job.inode, job.lo, job.hi);
    }
    event.bytes += job.bytes;
    if (error != 0) {
      errors_++;
      if (event.error == 0) {
        event.error = error;  // the group's sample is its first failure
        event.node = reinterpret_cast<uint64_t>(job.inode.get());
      }
      if (error != ESTALE) events_.lost(reinterpret_cast<uint64_t>(job.inode.get()), job.inode->fd(), error);
    }
    window_.end_sync(job, error);
  }
  if (ran == 0) return;
  double end = now_seconds();
  event.seconds = end - start;
  event.at = end;
  events_.push(event);
}

void Flusher::stop_threads() {
  if (decider_.joinable()) {
    {
      std::lock_guard<std::mutex> guard(window_.lock());
      stopping_ = true;
    }
    window_.wake_flusher();
    decider_.join();
  }
  {
    std::lock_guard<std::mutex> guard(queue_lock_);
    draining_ = true;
  }
  queue_cv_.notify_all();
  for (auto& worker : workers_) worker.join();
  workers_.clear();
}

size_t Flusher::finish() {
  stop_threads();
  for (int pass = 0; pass < 3; pass++) {
    std::vector<SyncJob> jobs = window_.take_all_dirty();
    if (jobs.empty()) break;
    for (auto& job : jobs) {
      std::vector<SyncJob> one;
      one.push_back(std::move(job));
      run(one);
    }
  }
  // And those whose failed sync's error never reached their writer: a retry that succeeded
  // after it does not bring back the pages the target dropped.
  return window_.owing().size();
}

}  // namespace ft
