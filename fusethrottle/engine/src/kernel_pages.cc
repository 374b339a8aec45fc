#include "kernel_pages.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "inode.h"
#include "thread_name.h"

namespace ft {

namespace {
const int64_t kPage = ::sysconf(_SC_PAGESIZE);
}

void KernelPages::start(fuse_session* session) {
  session_ = session;
  thread_ = std::thread([this] {
    name_this_thread("ft-drop-pages");
    run();
  });
}

void KernelPages::stop() {
  {
    std::lock_guard<std::mutex> guard(lock_);
    stopping_ = true;
    pending_.clear();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void KernelPages::drop(std::shared_ptr<Inode> inode, int64_t lo, int64_t hi) {
  hi -= hi % kPage;
  if (hi <= lo) return;
  {
    std::lock_guard<std::mutex> guard(lock_);
    if (stopping_ || session_ == nullptr) return;
    auto [at, added] = pending_.try_emplace(inode.get(), Range{inode, lo, hi});
    if (!added) {
      at->second.lo = std::min(at->second.lo, lo);
      at->second.hi = std::max(at->second.hi, hi);
    }
  }
  wake_.notify_one();
}

void KernelPages::run() {
  std::unique_lock<std::mutex> guard(lock_);
  for (;;) {
    wake_.wait(guard, [this] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    std::vector<Range> batch;
    for (auto& [key, range] : pending_) batch.push_back(std::move(range));
    pending_.clear();
    guard.unlock();
    for (const Range& r : batch) {
      // -ENOENT: the kernel forgot the file, and its pages with it.
      if (fuse_lowlevel_notify_inval_inode(session_, table_.node_of(*r.inode), r.lo, r.hi - r.lo) == 0)
        dropped_.fetch_add(1, std::memory_order_relaxed);
    }
    guard.lock();
  }
}

}  // namespace ft
