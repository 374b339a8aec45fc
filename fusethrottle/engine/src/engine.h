// One mount's engine: the session, its inode table and the options it serves with.
#pragma once

#include <fuse_lowlevel.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "call.h"
#include "ceilings.h"
#include "events.h"
#include "fleet_gate.h"
#include "flusher.h"
#include "fusethrottle_engine.h"
#include "inode.h"
#include "kernel_pages.h"
#include "meter.h"
#include "passthrough.h"
#include "relief.h"
#include "session_io.h"
#include "window.h"

namespace ft {

struct Options {
  std::string source;
  std::string mountpoint;
  std::string fuse_options;  // -o list for the kernel (fsname, allow_other, ...)
  bool writeback_cache = true;
  double entry_timeout = 1.0;
  double attr_timeout = 1.0;
  unsigned max_threads = 16;
  bool switch_credentials = false;
  bool xattrs = true;
  bool killpriv_v2 = false;
  bool target_decides = false;  // permissions=target (fusethrottle_engine.h)
  bool uncached = false;        // writes leave no page in the target's cache (target_io)
  WindowParams window;
  unsigned sync_threads = 4;
  MeterProfile meter;
  uint8_t classes[FT_OP_COUNT] = {};  // FT_METER_* by request kind
  double metered_limit = 0;
  double ops_limit = 0;
  bool throttle_reads = false;
  bool fleet = false;  // budget=: requests spend the fleet's share first (fleet_gate.h)
};

class Engine {
 public:
  explicit Engine(Options options)
      : options_(std::move(options)),
        window_(options_.window),
        pages_(inodes_),
        flusher_(window_, events_, pages_),
        meter_(options_.meter, options_.classes),
        ceilings_(options_.metered_limit, options_.ops_limit, options_.throttle_reads, now_seconds()),
        fleet_(options_.fleet, now_seconds(), [this] { events_.poke(); }) {
    // A forgotten file the window synced leaves the table (see InodeTable::forget).
    window_.when_settled([this](const std::shared_ptr<Inode>& inode) { inodes_.settled(inode); });
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  // Open the source and mount; 0 or -errno, *error* says why.
  int mount(std::string& error);
  // Serve requests until unmounted or stopped; 0 or -errno.
  int serve();
  // Make serve() return: the mount is taken away (lazily), the loop ends once the kernel
  // lets go of it. Safe from any thread.
  void stop();

  const Options& options() const { return options_; }
  InodeTable& inodes() { return inodes_; }
  Window& window() { return window_; }
  EventRing& events() { return events_; }
  Flusher& flusher() { return flusher_; }
  KernelPages& kernel_pages() { return pages_; }
  bool writeback_cache() const { return writeback_cache_.load(); }
  void set_writeback_cache(bool on) { writeback_cache_.store(on); }
  size_t known_files() { return inodes_.size(); }
  SessionIo& session_io() { return io_; }
  Meter& meter() { return meter_; }
  Ceilings& ceilings() { return ceilings_; }
  FleetGate& fleet() { return fleet_; }
  const Relief& relief() const { return relief_; }
  Relief& relief() { return relief_; }
  Passthrough& passthrough() { return passthrough_; }
  // A request of *op* moving *nbytes* waits here until the fleet's share and then the local
  // ceilings let it go (a write waits for the tighter of the two).
  void pay(ft_engine_op op, uint64_t nbytes) {
    if ((!ceilings_.active() && !fleet_.on()) || !meter_.may_wait(op)) return;
    OpClass cls = meter_.class_of(op);
    if (!ceilings_.applies_to(cls)) return;
    Charge charge = price(meter_.profile(), cls, nbytes);
    if (fleet_.on()) {
      // A caller killed while its request waits for the share was answered EINTR (call.h).
      Call& call = this_call();
      fleet_.spend(charge, [&call] { return call.unanswered.load() == nullptr; });
    }
    ceilings_.pay(cls, charge);
  }
  // Files and directories open through the mount (handles.h: Tally).
  std::atomic<uint64_t>& handles() { return open_handles_; }
  uint64_t open_handles() const { return open_handles_.load(std::memory_order_relaxed); }

  // Every request is counted by kind as it arrives (ops.cc: counted).
  void count(ft_engine_op op) { operations_[op].fetch_add(1, std::memory_order_relaxed); }
  uint64_t served(ft_engine_op op) const {
    return operations_[op].load(std::memory_order_relaxed);
  }

  // From here on nothing new is taken: every request but the kernel's write-back and the
  // closing of files is answered ENOTCONN, and every attribute the kernel holds is expired,
  // so a writer still writing into the writeback cache is refused (the kernel asks for the
  // attributes first) instead of acknowledged for pages nobody would write back.
  void close_the_cache();
  bool closing() const { return closing_.load(std::memory_order_acquire); }

 private:
  Options options_;
  InodeTable inodes_;
  Window window_;
  EventRing events_;
  KernelPages pages_;  // stopped first of all (~Engine), while the session is still there
  Flusher flusher_;  // after what it uses: its threads end first
  Meter meter_;
  Ceilings ceilings_;
  FleetGate fleet_;
  Passthrough passthrough_;
  struct SessionDeleter {
    void operator()(fuse_session* se) const { fuse_session_destroy(se); }
  };
  std::unique_ptr<fuse_session, SessionDeleter> session_;
  SessionIo io_;
  Relief relief_{inodes_, window_};  // after the session: its thread ends first
  std::array<std::atomic<uint64_t>, FT_OP_COUNT> operations_{};
  // The mount's open handles, files and directories alike (handles.h: Tally), for status and
  // metrics only: an aggregate nobody decides a file's fate by, not a third per-file open count
  // (a file's is FileLedger::opens, the window's). Not derived from that count: directories
  // have none, and a sum over every file would take the table's lock for each status read.
  std::atomic<uint64_t> open_handles_{0};
  bool mounted_ = false;
  std::atomic<bool> writeback_cache_{false};
  std::atomic<bool> closing_{false};
};

// The low-level operations (ops.cc).
const fuse_lowlevel_ops& operations(bool xattrs, bool target_decides);

}  // namespace ft
