// The write window: how many bytes each file and the whole mount hold un-synced, the gate
// where writes wait for room, and the choice of which files to fsync next, with the clock
// passed in to the pure parts (tests/window_test.cc). The window's size is the control
// plane's (fusethrottle/window/controller.py).
//
// A file's bytes: admitted by the gate (the mount's `reserved`) -> written to the target (the
// file's `dirty`) -> handed to an fsync (`syncing`) -> durable (gone), or back to dirty with
// the error kept for the application. unsynced = reserved + every file's dirty + syncing: what
// the window bounds.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fd.h"
#include "kernel_view.h"

namespace ft {

class Inode;

// Seconds on the monotonic clock (the control plane's events carry the same clock).
double now_seconds();

// Why a file is synced: the event's reason code for the control plane.
// kApplication: the application's own fsync (its time is shown, it is no sample).
enum class SyncReason : uint32_t {
  kBatch = 1, kRelease = 2, kAge = 3, kWindow = 4, kForget = 5, kEnd = 6, kApplication = 7
};

// Dirty bytes at which a file is synced: batch, or half the window if that is smaller.
uint64_t sync_trigger(uint64_t batch, uint64_t window);
// Bytes per second to admit above half the window (0: no pacing below it).
double pacing_rate(double commit_rate, uint64_t unsynced, uint64_t window);
// Bytes written back at a time in an injected sync: about 0.1 s of the target's commit rate.
uint64_t writeback_piece(double commit_rate, uint64_t trigger);
// Released files gather this long before their syncs start, and those at most kGroupBytes
// dirty are synced as a group: one event, one sample for the controller, one thread's turn
// (a tar or rsync of a tree closes thousands of small files a second).
constexpr double kGroupGather = 0.02;
constexpr uint64_t kGroupBytes = 1ull << 20;
// How long a request that would treat a file as open waits for handles whose process closed
// them (FLUSH answered) to be released. A close sends its RELEASE in the background: on a
// loaded host another request thread may serve the process's next request on the file (an
// open, its removal) first, although the process has it open no more.
constexpr std::chrono::milliseconds kReleaseWait{100};

// One file's un-synced data; lives in its Inode, guarded by the window's lock.
struct FileLedger {
  uint64_t dirty = 0;
  uint64_t syncing = 0;
  double dirty_since = 0;  // when the oldest dirty byte was written (dirty > 0)
  int error = 0;           // a failed injected sync's errno, for the application's next call
  int errors = 0;          // failures in a row (the retry backoff)
  double retry_after = 0;
  bool released = false;   // its last handle closed with dirty data
  double released_at = 0;
  bool queued = false;     // an fsync of it is queued or running (one at a time)
  int removing = 0;        // removals of its last name waiting for its sync (Window::let_go)
  // Opens through the mount, from before the target's open (Window::opening) to the release
  // or the open's failure (Window::not_opened): the file's one open count. The kernel's view
  // reads it here (Window::looked_up, at_open), under this lock.
  int opens = 0;
  int closing = 0;         // of them, closed by their process: FLUSH came, RELEASE may be on its way
  int64_t lo = -1;         // the range written since the last injected sync
  int64_t hi = 0;
  Fd held;                 // a released handle's descriptor, for its release sync
  bool owes() const { return dirty > 0 || syncing > 0 || error != 0 || queued; }
};

struct WindowParams {
  uint64_t window = 256ull << 20;  // bytes the gate admits un-synced (the control plane moves it)
  double commit_rate = 0;          // the target's measured bytes/s (0: not known yet)
  uint64_t batch = 64ull << 20;
  double max_age = 30;
  double admission_timeout = 60;
  bool enforce = true;  // the gate holds writes back (mode=off: it does not)
  bool inject = true;   // injected fsyncs (mode=off: only the end's and forgotten files')
  bool pieces = true;
  bool drop_synced = true;
  std::vector<double> wait_bounds;  // the histogram of waits at the gate (seconds, ascending)
};

// What one fsync covers.
struct SyncJob {
  std::shared_ptr<Inode> inode;
  SyncReason reason = SyncReason::kBatch;
  uint64_t bytes = 0;
  double since = 0;
  int64_t lo = -1;  // written back in pieces and dropped after (injected syncs)
  int64_t hi = 0;
  uint64_t piece = 0;
  bool drop = false;
  Fd held;
  // A small released file's: synced in a group with the others queued alongside it.
  bool groupable() const { return reason == SyncReason::kRelease && bytes <= kGroupBytes; }
};

struct WindowStats {
  uint64_t window, unsynced, reserved, syncing, unsynced_high, dirty_files;
  double oldest_age;
  uint64_t written, synced, failed_syncs;
  uint64_t waiting, throttled, paced, timeouts;
  double wait_seconds;
  std::vector<uint64_t> waits;  // writes that waited, by wait_bounds (last: above them all)
  double commit_rate;
};

class Window {
 public:
  explicit Window(WindowParams params) : p_(params) {}

  // --- the write path ---
  // Wait until *n* bytes fit (first come, first served; paced above half the window), at most
  // admission_timeout, and reserve them. A waiter for whom *abandoned* turns true (its caller
  // was answered EINTR: killed) leaves the line within kAbandonedCheck, reserving nothing:
  // false. (Its thread would otherwise wait for room on a hung target, for nobody.)
  bool admit(uint64_t n, const std::function<bool()>& abandoned = {});
  static constexpr double kAbandonedCheck = 0.1;
  // A write that reserved *reserved* ended: *written* bytes (at *off*) reached the target.
  void landed(const std::shared_ptr<Inode>& inode, uint64_t reserved, int64_t written, int64_t off);
  // What admit() reserved for one write, until the write lands (take() hands it to landed()).
  // A write that never gets there (its handler threw in between) gives it back here: the
  // window must not shrink for good by bytes nobody will write.
  class Reservation {
   public:
    Reservation(Window& window, uint64_t bytes) : window_(window), bytes_(bytes) {}
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() {
      if (bytes_ != 0) window_.landed(nullptr, bytes_, 0, 0);
    }
    uint64_t take() { return std::exchange(bytes_, 0); }

   private:
    Window& window_;
    uint64_t bytes_;
  };
  // The file's pending sync error, handed out once (0: none).
  int take_error(Inode& inode);
  // The file's data needs no sync any more (truncated to nothing).
  void discard(Inode& inode);
  // An open of the file begins: counted from before the target's open, so that a lookup
  // meanwhile does not hand the kernel a new generation of the inode this open is for
  // (Window::looked_up). Every opening ends in the handle's release (released()) or, for an
  // open that failed, in not_opened() (Opening does it).
  void opening(const std::shared_ptr<Inode>& inode);
  void not_opened(const std::shared_ptr<Inode>& inode);
  // An open counted by opening() until it is kept (its handle made: the release ends it) or,
  // if it never is, undone as the open fails.
  class Opening {
   public:
    Opening(Window& window, std::shared_ptr<Inode> inode) : window_(window), inode_(std::move(inode)) {
      window_.opening(inode_);
    }
    ~Opening() { undo(); }
    Opening(const Opening&) = delete;
    Opening& operator=(const Opening&) = delete;
    void kept() { inode_.reset(); }
    // The open failed: undone now, before the failure is answered (the kernel's next request,
    // the lookup an ESTALE asks for, must not find this open counted).
    void undo() {
      if (inode_) window_.not_opened(std::exchange(inode_, nullptr));
    }

   private:
    Window& window_;
    std::shared_ptr<Inode> inode_;
  };
  // The kernel's view of a file (regular, writeback cache) decides with the file's open count,
  // read under this lock held across its decision (its leaf lock taken inside): the
  // generation a lookup's entry carries (KernelView::looked_up) ...
  uint64_t looked_up(Inode& inode, const struct stat& st, uint64_t since);
  // ... and whether an open (counted by opening()) found the file changed by another writer
  // and is alone (KernelView::opened). If it is not alone and every other handle was closed
  // by its process (FLUSH answered), their releases are waited for, at most *wait*.
  KernelView::AtOpen at_open(Inode& inode, const struct stat& st, uint64_t since,
                             std::chrono::milliseconds wait);
  // The handle's process closed it (*now*: FLUSH came), or used it again (false).
  void closing(Inode& inode, bool now);
  // The handle was released; *fd* is its descriptor, kept for the release sync if the file is
  // dirty; *was_closing*: its process had closed it.
  void released(const std::shared_ptr<Inode>& inode, Fd fd, bool was_closing = false);
  // The kernel forgot the file: true if it owes anything, and the window keeps (and syncs)
  // it; the table keeps it by its key meanwhile (a new lookup finds it again, see
  // InodeTable::forget), until *settled* is called with it. False: it may go now. Whether it
  // is still forgotten is the table's to say (Inode::forgotten), never a copy kept here.
  bool forgotten(const std::shared_ptr<Inode>& inode);
  // Called (outside the window's lock) with each forgotten file once it owes nothing.
  void when_settled(std::function<void(const std::shared_ptr<Inode>&)> settled) {
    settled_ = std::move(settled);
  }
  // Its last name is about to be removed: its data needs no sync, and its released handle's
  // descriptor is closed (see removal.h). A sync of it handed to the flusher and not started
  // is not run (see removing()); one running is waited for, at most *wait*, after handles
  // closed but not yet released (at most kReleaseWait). False (nothing changed) if it is
  // open, or still being synced after *wait*.
  bool let_go(Inode& inode, std::chrono::milliseconds wait);
  // Whether *inode* is open or owes a sync: its name is better kept in the kernel (relief.h).
  bool busy(const Inode& inode);

  // --- the application's own fsync ---
  uint64_t begin_app_sync(Inode& inode);
  void end_app_sync(Inode& inode, uint64_t bytes, int error);

  // --- the flusher ---
  // Wait for due syncs (or *stopping*) and hand them out, their bytes now syncing.
  std::vector<SyncJob> wait_due(const bool& stopping);
  // The syncs due at *now*, handed out (what wait_due returns; the unit tests' clock).
  std::vector<SyncJob> take_due(double now);
  // Whether a removal waits for *inode*'s sync: the flusher ends a job it has not started
  // with dropped() instead.
  bool removing(const Inode& inode);
  void dropped(SyncJob& job) { end_sync(job, kNotSynced); }
  static constexpr int kNotSynced = -1;  // (never an errno)
  void wake_flusher();
  // An injected sync ended (error 0: durable).
  void end_sync(SyncJob& job, int error);
  // For the end: every file with dirty bytes, each handed to a sync now (backoff ignored).
  std::vector<SyncJob> take_all_dirty();
  // The files that still owe the target data (un-synced, being synced, or a failed sync's
  // error nobody was told of), each with that error (0: none yet).
  std::vector<std::pair<std::shared_ptr<Inode>, int>> owing();
  // The flusher's stop flag is read under this lock.
  std::mutex& lock() { return lock_; }

  // --- the control plane ---
  void set_window(uint64_t window, double commit_rate);
  // `fusethrottle set`: the batch, max_age and mode from now on (a write waiting at the gate
  // of a mount turned to mode=off goes at once).
  void set_params(uint64_t batch, double max_age, bool enforce, bool inject);
  WindowStats stats();
  const WindowParams& params() const { return p_; }

 private:
  uint64_t unsynced() const { return reserved_ + in_files_; }
  bool fits(uint64_t n) const;
  double ready_at(uint64_t n, double now) const;  // <0: no room
  void reserve(uint64_t n, double now);
  SyncJob begin(const std::shared_ptr<Inode>& inode, SyncReason reason);
  std::vector<SyncJob> due(double now);
  double next_deadline() const;
  // Wake the flusher if it would not look by *when* on its own.
  void wake_flusher_by(double when);
  // Out of the table once it owes nothing; what it held is closed after the lock (into *out*).
  // What a call lets go of, once the window's lock is released (declared before the lock's
  // guard): the descriptors closed, the forgotten files handed to settled_.
  struct Settled {
    explicit Settled(Window& w) : window(w) {}
    ~Settled();
    Settled(const Settled&) = delete;
    Settled& operator=(const Settled&) = delete;
    Window& window;
    std::vector<std::shared_ptr<Inode>> inodes;
    std::vector<std::shared_ptr<Inode>> forgotten;
    std::vector<Fd> fds;
  };
  // A file that owes nothing more leaves the window (its held descriptor into *out*).
  void collect(Inode& inode, Settled& out);
  std::function<void(const std::shared_ptr<Inode>&)> settled_;

  WindowParams p_;
  // The window's lock: after the table's (InodeTable::lock_ may be held when it is taken,
  // never the other way round). Held, it takes no other lock: what a call lets go of (the
  // descriptors it closes, the forgotten files the table settles) goes after it is released
  // (Settled); a file's place is read as an atomic (Inode::forgotten). The flusher's stop
  // flag is read under it too (lock()). A file's open count is under it (FileLedger::opens);
  // the kernel's view of a file (KernelView::lock_, a leaf) is the one lock taken while it
  // is held. Lock order: InodeTable::lock_, then this one, then KernelView::lock_.
  std::mutex lock_;
  std::condition_variable gate_;
  std::condition_variable flusher_;
  std::condition_variable sync_ended_;  // a sync ended (let_go waits for it)
  std::condition_variable released_;    // a closing handle was released (at_open, let_go)
  std::unordered_map<const Inode*, std::shared_ptr<Inode>> files_;  // every file that owes
  std::deque<uint64_t> line_;  // waiting writes' tickets, first come first served
  uint64_t next_ticket_ = 0;
  double next_paced_ = 0;
  // When the flusher means to look next (0: it is looking now, and will see any change): a
  // change due later than that needs no wake-up (a close per file would cost a thread switch
  // and a pass over every dirty file).
  double flusher_wakes_at_ = 0;
  uint64_t reserved_ = 0;
  uint64_t in_files_ = 0;  // every file's dirty + syncing
  uint64_t unsynced_high_ = 0;
  size_t held_ = 0;
  uint64_t written_ = 0, synced_ = 0, failed_syncs_ = 0;
  uint64_t throttled_ = 0, paced_ = 0, timeouts_ = 0;
  double wait_seconds_ = 0;
  std::vector<uint64_t> waits_ = std::vector<uint64_t>(p_.wait_bounds.size() + 1);
};

}  // namespace ft
