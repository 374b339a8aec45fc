#include "kernel_pages.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fd.h"
#include "inode.h"
#include "thread_name.h"

namespace ft {

namespace {
const int64_t kPage = ::sysconf(_SC_PAGESIZE);

// Test only (tests/test_engine_hardening_stop.py): with FUSETHROTTLE_TEST_HOLD_PAGE_DROP
// naming a FIFO, the thread's first drop waits before it is sent until the FIFO was opened for
// writing and closed again (a blocking open and read: no polling), so that a test can dirty a
// page of the range on a hung target first and have the kernel hold the drop behind it.
void test_hold_page_drop() {
  static const char* fifo = std::getenv("FUSETHROTTLE_TEST_HOLD_PAGE_DROP");
  static bool done = false;  // (the page-drop thread's alone)
  if (fifo == nullptr || *fifo == '\0' || done) return;
  done = true;
  std::fprintf(stderr, "fusethrottle engine: test: a page drop waits for %s\n", fifo);
  Fd held(::open(fifo, O_RDONLY | O_CLOEXEC));
  char byte;
  while (held && ::read(held.get(), &byte, 1) > 0) {
  }
  std::fprintf(stderr, "fusethrottle engine: test: the page drop goes on\n");
}
}  // namespace

void KernelPages::start(fuse_session* session) {
  session_ = session;
  thread_ = std::thread([state = state_, &table = table_, session] {
    name_this_thread("ft-drop-pages");
    run(state, table, session);
    std::lock_guard<std::mutex> guard(state->lock);
    state->ended = true;
    state->wake.notify_all();
  });
}

bool KernelPages::stop(std::chrono::milliseconds bound) {
  State& s = *state_;
  std::unique_lock<std::mutex> guard(s.lock);
  s.stopping = true;
  s.pending.clear();
  s.wake.notify_all();
  if (!thread_.joinable()) return !left_;
  if (!s.wake.wait_for(guard, bound, [&s] { return s.ended; })) {
    thread_.detach();  // it holds the state; the engine keeps the session (Engine::left)
    left_ = true;
    return false;
  }
  guard.unlock();
  thread_.join();
  return true;
}

void KernelPages::drop(std::shared_ptr<Inode> inode, int64_t lo, int64_t hi) {
  hi -= hi % kPage;
  if (hi <= lo) return;
  State& s = *state_;
  {
    std::lock_guard<std::mutex> guard(s.lock);
    if (s.stopping || session_ == nullptr) return;
    auto [at, added] = s.pending.try_emplace(inode.get(), Range{inode, lo, hi});
    if (!added) {
      at->second.lo = std::min(at->second.lo, lo);
      at->second.hi = std::max(at->second.hi, hi);
    }
  }
  s.wake.notify_all();
}

void KernelPages::run(const std::shared_ptr<State>& state, InodeTable& table, fuse_session* session) {
  State& s = *state;
  std::unique_lock<std::mutex> guard(s.lock);
  for (;;) {
    s.wake.wait(guard, [&s] { return s.stopping || !s.pending.empty(); });
    if (s.stopping) return;
    std::vector<Range> batch;
    for (auto& [key, range] : s.pending) batch.push_back(std::move(range));
    s.pending.clear();
    for (const Range& r : batch) {
      // Looked at before each drop: once stopped, the table and the session may be gone.
      if (s.stopping) return;
      fuse_ino_t node = table.node_of(*r.inode);
      guard.unlock();
      test_hold_page_drop();
      // -ENOENT: the kernel forgot the file, and its pages with it.
      if (fuse_lowlevel_notify_inval_inode(session, node, r.lo, r.hi - r.lo) == 0)
        s.dropped.fetch_add(1, std::memory_order_relaxed);
      guard.lock();
    }
  }
}

}  // namespace ft
