#include "kernel_view.h"

namespace ft {

std::atomic<uint64_t> KernelView::clock_{0};

namespace {
int64_t mtime_of(const struct stat& st) {
  return st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
}
}  // namespace

bool KernelView::changed(const struct stat& st) const {
  if (size_ < 0) return false;
  if (st.st_size != size_) return true;
  return mtime_ >= 0 && mtime_of(st) != mtime_;
}

void KernelView::show(const struct stat& st) {
  size_ = st.st_size;
  mtime_ = mtime_of(st);
}

uint64_t KernelView::looked_up(const struct stat& st, uint64_t since, bool open) {
  std::lock_guard<std::mutex> guard(lock_);
  if (written_since(since)) return generation_;  // our own change is newer than this stat
  if (changed(st)) {
    if (open) return generation_;  // the kernel keeps its own until the last close
    generation_++;
  }
  show(st);
  return generation_;
}

uint64_t KernelView::made(const struct stat& st, uint64_t since) {
  std::lock_guard<std::mutex> guard(lock_);
  if (!written_since(since)) show(st);
  return generation_;
}

uint64_t KernelView::generation() const {
  std::lock_guard<std::mutex> guard(lock_);
  return generation_;
}

KernelView::AtOpen KernelView::opened(const struct stat& st, uint64_t since, int others) {
  std::lock_guard<std::mutex> guard(lock_);
  return {!written_since(since) && changed(st), others <= 0};
}

void KernelView::truncated() {
  std::lock_guard<std::mutex> guard(lock_);
  size_ = 0;
  mtime_ = -1;
}

KernelView::Change::Change(KernelView& view) : view_(view), since_(now()) {
  std::lock_guard<std::mutex> guard(view_.lock_);
  view_.in_flight_++;
}

KernelView::Change::~Change() {
  std::lock_guard<std::mutex> guard(view_.lock_);
  view_.in_flight_--;
  view_.last_change_ = clock_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

void KernelView::wrote_to(int64_t end) {
  std::lock_guard<std::mutex> guard(lock_);
  if (size_ >= 0 && end > size_) size_ = end;
  mtime_ = -1;
}

void KernelView::set(const struct stat& st, bool sized, const Change& mine) {
  std::lock_guard<std::mutex> guard(lock_);
  if (sized) size_ = st.st_size;  // a truncate's size is one the kernel takes
  // The mtime read is the file's unless another change of ours came meanwhile.
  bool others = in_flight_ > 1 || last_change_ > mine.since_;
  mtime_ = others ? -1 : mtime_of(st);
}

void KernelView::forget_facts() {
  std::lock_guard<std::mutex> guard(lock_);
  size_ = -1;
  mtime_ = -1;
}

bool KernelView::mtime_unknown() const {
  std::lock_guard<std::mutex> guard(lock_);
  return size_ >= 0 && mtime_ < 0;
}

void KernelView::learn_mtime(int64_t mtime_ns, uint64_t since) {
  std::lock_guard<std::mutex> guard(lock_);
  if (mtime_ < 0 && !written_since(since)) mtime_ = mtime_ns;
}

}  // namespace ft
