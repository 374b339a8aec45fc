// What the kernel was shown of a regular file, to tell a change another writer made on the
// target (another host on the same export, an operator in the source directory) from the
// mount's own.
//
// With the writeback cache the kernel keeps the size and mtime of a cached regular file itself
// and ignores the ones the daemon sends, even with attr_timeout=0: a file truncated, extended
// or rewritten on the target would show its old size and pages through the mount for as long
// as the kernel caches the inode. An entry with a new generation makes the kernel drop that
// inode at the lookup and build a new one from the target's attributes (the node id stays; the
// lookups of both count on it). Only for a file nobody has open through the mount: I/O on a
// dropped inode fails (EIO), and an open file's size and pages are the kernel's until its last
// close, as on NFS (close-to-open).
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace ft {

class KernelView {
 public:
  // Where the mount's own changes of files stand (a clock over every file): taken before a
  // stat that is compared with what the kernel was shown, since a change of ours landing after
  // it makes the stat older than the kernel's own view.
  static uint64_t now() { return clock_.load(std::memory_order_acquire); }

  // A lookup found the file with *st*, stat taken after *since*: the generation its entry
  // carries, a new one if the file changed on the target since the kernel was shown it and
  // nobody has it open (*open*: the file's open count, which is the window's, is not 0; read
  // under the window's lock held across this call: Window::looked_up).
  uint64_t looked_up(const struct stat& st, uint64_t since, bool open);
  // The entry of a file this mount just made or linked: shown as it is.
  uint64_t made(const struct stat& st, uint64_t since);
  uint64_t generation() const;

  // An open of the file found it with *st* (stat taken after *since*): whether it changed on
  // the target since the kernel was shown it, and whether this open is the only one: *others*
  // is the file's open count less this open, read under the window's lock (Window::at_open).
  // The count is not kept here: it is the window's alone (FileLedger::opens), from before the
  // target's open (Window::opening) to the release.
  struct AtOpen {
    bool changed = false;
    bool alone = false;
  };
  AtOpen opened(const struct stat& st, uint64_t since, int others);
  // Opened with O_TRUNC: the kernel knows the size it made.
  void truncated();

  // One change of ours to the file's data or size on the target, from before it starts to
  // after it ended: a stat taken meanwhile says nothing of others.
  class Change {
   public:
    explicit Change(KernelView& view);
    ~Change();
    Change(const Change&) = delete;
    Change& operator=(const Change&) = delete;

   private:
    friend class KernelView;
    KernelView& view_;
    uint64_t since_;  // the clock when it began
  };
  // A write of ours ended at *end*: the kernel's size grew with it, the mtime moved.
  void wrote_to(int64_t end);
  // A setattr of ours (*mine*, still under way) left *st*; *sized*: it set the size.
  void set(const struct stat& st, bool sized, const Change& mine);
  // Something of ours moved the size and mtime to values not known here (fallocate).
  void forget_facts();
  // Whether the mtime our writes left is still to be learnt (see learn_mtime).
  bool mtime_unknown() const;
  // The mtime the target shows once every cached page reached it (a flush), read after
  // *since*: a later change by another writer that keeps the size is still told apart.
  void learn_mtime(int64_t mtime_ns, uint64_t since);

 private:
  bool written_since(uint64_t since) const { return in_flight_ > 0 || last_change_ > since; }
  bool changed(const struct stat& st) const;
  void show(const struct stat& st);

  static std::atomic<uint64_t> clock_;
  // A leaf lock: taken with the table's or the window's held or not (lock order: the table's,
  // then the window's, then this one), it takes no other.
  mutable std::mutex lock_;
  uint64_t generation_ = 0;
  int64_t size_ = -1;   // what the kernel holds as its size; -1: not known
  int64_t mtime_ = -1;  // the target's mtime when the kernel was shown it; -1: not known
  uint64_t last_change_ = 0;  // the clock when our last change of it ended
  int in_flight_ = 0;         // changes of ours under way
};

}  // namespace ft
