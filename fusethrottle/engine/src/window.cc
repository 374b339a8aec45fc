#include "window.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "deadline.h"
#include "inode.h"

namespace ft {

namespace {
constexpr double kNever = std::numeric_limits<double>::infinity();
// Released handles' descriptors kept for their files' syncs at most; beyond, a sync reopens.
constexpr size_t kHeldMax = 64;
constexpr uint64_t kPieceMin = 128ull << 10;
constexpr uint64_t kPieceUnknownRate = 1ull << 20;
constexpr double kPieceSeconds = 0.1;

std::chrono::steady_clock::time_point at(double seconds) { return steady_at(seconds); }
}  // namespace

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t sync_trigger(uint64_t batch, uint64_t window) {
  return std::max<uint64_t>(1, std::min(batch, window / 2));
}

double pacing_rate(double commit_rate, uint64_t unsynced, uint64_t window) {
  // Above half the window, writes are spaced at the commit rate falling linearly to a tenth of
  // it at the edge: the window settles near half full and every write waits a little, not a
  // lot (a stop-and-go at the edge holds a writer for a whole fsync).
  if (commit_rate <= 0 || window == 0 || unsynced * 2 < window) return 0;
  double room = std::max(0.0, 1.0 - static_cast<double>(unsynced) / static_cast<double>(window));
  return commit_rate * std::max(0.1, 2.0 * room);
}

uint64_t writeback_piece(double commit_rate, uint64_t trigger) {
  double want = commit_rate > 0 ? commit_rate * kPieceSeconds : static_cast<double>(kPieceUnknownRate);
  uint64_t piece = std::max(kPieceMin, std::min(static_cast<uint64_t>(want), trigger));
  return std::max(kPieceMin, piece - piece % 4096);
}

// --- the gate ---------------------------------------------------------------------------------

bool Window::fits(uint64_t n) const {
  // An empty mount always admits, so a write larger than the window still progresses.
  return unsynced() == 0 || unsynced() + n <= p_.window;
}

double Window::ready_at(uint64_t n, double now) const {
  if (!fits(n)) return -1;
  if (pacing_rate(p_.commit_rate, unsynced(), p_.window) == 0) return now;
  return std::max(now, next_paced_);
}

void Window::reserve(uint64_t n, double now) {
  double pace = pacing_rate(p_.commit_rate, unsynced(), p_.window);
  reserved_ += n;
  unsynced_high_ = std::max(unsynced_high_, unsynced());
  next_paced_ = pace == 0 ? now : std::max(now, next_paced_) + static_cast<double>(n) / pace;
}

bool Window::admit(uint64_t n, const std::function<bool()>& abandoned) {
  std::unique_lock<std::mutex> guard(lock_);
  double start = now_seconds();
  if (!p_.enforce || (line_.empty() && ready_at(n, start) == start)) {
    reserve(n, start);
    return true;
  }
  uint64_t ticket = next_ticket_++;
  line_.push_back(ticket);
  wake_flusher_by(start);  // writers wait: keep the target busy
  double give_up = start + p_.admission_timeout;
  bool full = false;
  bool timed_out = false;
  bool left = false;
  for (;;) {
    double now = now_seconds();
    full = full || !fits(n);
    double ready = line_.front() == ticket ? ready_at(n, now) : -1;
    if (ready >= 0 && ready <= now) break;
    if (now >= give_up) {
      timed_out = true;  // admitted anyway, and counted: a dead target means slow writes
      break;
    }
    if (abandoned && abandoned()) {
      left = true;
      break;
    }
    double until = ready >= 0 ? std::min(ready, give_up) : give_up;
    if (abandoned) until = std::min(until, now + kAbandonedCheck);
    gate_.wait_until(guard, at(until));
  }
  line_.erase(std::find(line_.begin(), line_.end(), ticket));
  gate_.notify_all();  // whoever is first now looks again
  if (left) return false;
  double now = now_seconds();
  reserve(n, now);
  if (timed_out) timeouts_++;
  if (full || timed_out) {
    throttled_++;
  } else {
    paced_++;
  }
  wait_seconds_ += now - start;
  // A wait equal to a bound belongs to that bound's bucket (Prometheus' "le").
  const auto& bounds = p_.wait_bounds;
  waits_[std::lower_bound(bounds.begin(), bounds.end(), now - start) - bounds.begin()]++;
  return true;
}

void Window::landed(const std::shared_ptr<Inode>& inode, uint64_t reserved, int64_t written,
                    int64_t off) {
  std::lock_guard<std::mutex> guard(lock_);
  reserved_ -= std::min(reserved_, reserved);
  if (written > 0) {
    FileLedger& f = inode->ledger;
    if (f.dirty == 0) f.dirty_since = now_seconds();
    f.dirty += static_cast<uint64_t>(written);
    f.released = false;
    in_files_ += static_cast<uint64_t>(written);
    written_ += static_cast<uint64_t>(written);
    f.lo = f.lo < 0 ? off : std::min(f.lo, off);
    f.hi = std::max(f.hi, off + written);
    files_.emplace(inode.get(), inode);
    if (f.dirty >= sync_trigger(p_.batch, p_.window)) wake_flusher_by(f.dirty_since);
  }
  gate_.notify_all();  // what was reserved and not written frees room
}

int Window::take_error(Inode& inode) {
  Settled gone(*this);
  std::lock_guard<std::mutex> guard(lock_);
  int error = std::exchange(inode.ledger.error, 0);
  if (error != 0) {
    inode.ledger.errors = 0;
    collect(inode, gone);
  }
  return error;
}

void Window::discard(Inode& inode) {
  Settled gone(*this);
  std::lock_guard<std::mutex> guard(lock_);
  FileLedger& f = inode.ledger;
  in_files_ -= f.dirty;
  f.dirty = 0;
  f.lo = -1;
  f.hi = 0;
  collect(inode, gone);
  gate_.notify_all();
}

void Window::opening(const std::shared_ptr<Inode>& inode) {
  std::lock_guard<std::mutex> guard(lock_);
  inode->ledger.opens++;
}

void Window::not_opened(const std::shared_ptr<Inode>& inode) {
  std::lock_guard<std::mutex> guard(lock_);
  FileLedger& f = inode->ledger;
  if (f.opens > 0) f.opens--;
  // A handle released while this open was counted left the file's release sync to the last
  // one out: this failed open is it.
  if (f.opens > 0 || f.dirty == 0 || f.released) return;
  f.released = true;
  f.released_at = now_seconds();
  if (p_.inject) wake_flusher_by(f.released_at + kGroupGather);
}

uint64_t Window::looked_up(Inode& inode, const struct stat& st, uint64_t since) {
  std::lock_guard<std::mutex> guard(lock_);
  return inode.view.looked_up(st, since, inode.ledger.opens > 0);
}

void Window::closing(Inode& inode, bool now) {
  std::lock_guard<std::mutex> guard(lock_);
  inode.ledger.closing += now ? 1 : -1;
}

namespace {
bool all_closing(const FileLedger& f) { return f.opens > 0 && f.closing >= f.opens; }
}  // namespace

KernelView::AtOpen Window::at_open(Inode& inode, const struct stat& st, uint64_t since,
                                   std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> guard(lock_);
  FileLedger& f = inode.ledger;
  auto others = [&f] { return f.opens - 1; };  // this open is counted (opening())
  KernelView::AtOpen at = inode.view.opened(st, since, others());
  if (!at.changed || at.alone) return at;
  // Every other handle closed by its process: their RELEASEs may be on their way.
  released_.wait_for(guard, wait, [&f, &others] { return !(others() > 0 && f.closing >= others()); });
  return inode.view.opened(st, since, others());
}

void Window::released(const std::shared_ptr<Inode>& inode, Fd fd, bool was_closing) {
  std::unique_lock<std::mutex> guard(lock_);
  FileLedger& f = inode->ledger;
  if (f.opens > 0) f.opens--;
  if (was_closing) {
    f.closing--;
    released_.notify_all();
  }
  if (f.opens > 0 || f.dirty == 0) return;  // fd closes as this returns
  f.released = true;
  f.released_at = now_seconds();
  if (!f.held && held_ < kHeldMax) {
    f.held = std::move(fd);
    held_++;
  }
  if (p_.inject) wake_flusher_by(f.released_at + kGroupGather);
}

void Window::wake_flusher_by(double when) {
  if (flusher_wakes_at_ > when) flusher_.notify_one();
}

bool Window::forgotten(const std::shared_ptr<Inode>& inode) {
  std::lock_guard<std::mutex> guard(lock_);
  if (!inode->ledger.owes()) return false;
  files_.emplace(inode.get(), inode);
  wake_flusher_by(now_seconds());
  return true;
}

bool Window::busy(const Inode& inode) {
  std::lock_guard<std::mutex> guard(lock_);
  return inode.ledger.opens > 0 || inode.ledger.owes();
}

bool Window::let_go(Inode& inode, std::chrono::milliseconds wait) {
  Settled gone(*this);
  std::unique_lock<std::mutex> guard(lock_);
  FileLedger& f = inode.ledger;
  f.removing++;
  released_.wait_for(guard, kReleaseWait, [&f] { return !all_closing(f); });
  bool idle = sync_ended_.wait_for(
      guard, wait, [&f] { return f.opens > 0 || (!f.queued && f.syncing == 0); });
  f.removing--;
  if (!idle || f.opens > 0) return false;
  in_files_ -= f.dirty;
  f.dirty = 0;
  f.lo = -1;
  f.hi = 0;
  f.error = 0;
  f.errors = 0;
  f.released = false;
  collect(inode, gone);
  gate_.notify_all();
  return true;
}

bool Window::removing(const Inode& inode) {
  std::lock_guard<std::mutex> guard(lock_);
  return inode.ledger.removing > 0;
}

Window::Settled::~Settled() {
  fds.clear();  // before a removal goes ahead (see let_go)
  if (window.settled_) {
    for (auto& inode : forgotten) window.settled_(inode);
  }
}

void Window::collect(Inode& inode, Settled& out) {
  FileLedger& f = inode.ledger;
  if (f.owes()) return;
  if (f.held) {
    out.fds.push_back(std::move(f.held));
    held_--;
  }
  auto it = files_.find(&inode);
  if (it != files_.end()) {
    (inode.forgotten() ? out.forgotten : out.inodes).push_back(std::move(it->second));
    files_.erase(it);
  }
}

// --- syncs ------------------------------------------------------------------------------------

uint64_t Window::begin_app_sync(Inode& inode) {
  std::lock_guard<std::mutex> guard(lock_);
  FileLedger& f = inode.ledger;
  uint64_t bytes = f.dirty;
  f.syncing += bytes;
  f.dirty = 0;
  return bytes;
}

void Window::end_app_sync(Inode& inode, uint64_t bytes, int error) {
  Settled gone(*this);
  std::lock_guard<std::mutex> guard(lock_);
  FileLedger& f = inode.ledger;
  uint64_t covered = std::min(bytes, f.syncing);
  f.syncing -= covered;
  in_files_ -= covered;  // durable, or the error went to the application itself
  if (error == 0) synced_ += covered;
  collect(inode, gone);
  gate_.notify_all();
  sync_ended_.notify_all();
}

SyncJob Window::begin(const std::shared_ptr<Inode>& inode, SyncReason reason) {
  FileLedger& f = inode->ledger;
  SyncJob job;
  job.inode = inode;
  job.reason = reason;
  job.bytes = f.dirty;
  job.since = f.dirty_since;
  job.lo = f.lo;
  job.hi = f.hi;
  job.piece = p_.pieces ? writeback_piece(p_.commit_rate, sync_trigger(p_.batch, p_.window)) : 0;
  job.drop = p_.drop_synced;
  if (f.held) {
    job.held = std::move(f.held);
    held_--;
  }
  f.syncing += f.dirty;
  f.dirty = 0;
  f.lo = -1;
  f.hi = 0;
  f.released = false;
  f.queued = true;
  return job;
}

void Window::end_sync(SyncJob& job, int error) {
  job.held.reset();  // before a removal waiting for this sync goes ahead (let_go)
  Settled gone(*this);
  std::lock_guard<std::mutex> guard(lock_);
  FileLedger& f = job.inode->ledger;
  f.queued = false;
  uint64_t covered = std::min(job.bytes, f.syncing);
  f.syncing -= covered;
  double now = now_seconds();
  if (error == 0 || error == ESTALE || error == kNotSynced) {
    // ESTALE: the file is gone from the target (another client deleted it): its data can
    // never be synced, and retrying would hold it forever. kNotSynced: it is about to go.
    in_files_ -= covered;
    if (error == 0) synced_ += covered;
    f.errors = 0;
    f.retry_after = 0;
  } else {
    failed_syncs_++;
    f.errors++;
    f.error = error;
    if (covered > 0 && (f.dirty == 0 || job.since < f.dirty_since)) f.dirty_since = job.since;
    f.dirty += covered;
    if (job.lo >= 0) {
      f.lo = f.lo < 0 ? job.lo : std::min(f.lo, job.lo);
      f.hi = std::max(f.hi, job.hi);
    }
    f.retry_after = now + std::min(30.0, 0.5 * std::pow(2.0, std::min(f.errors, 6)));
  }
  collect(*job.inode, gone);
  gate_.notify_all();
  sync_ended_.notify_all();
  wake_flusher_by(now);  // more may be due now (pressure, the next batch)
}

std::vector<SyncJob> Window::due(double now) {
  std::vector<Inode*> ready;
  uint64_t in_flight = 0;
  // Once the first close has gathered kGroupGather, every released file goes with it.
  bool gathered = false;
  for (auto& [key, inode] : files_) {
    FileLedger& f = inode->ledger;
    in_flight += f.syncing;
    if (f.dirty > 0 && !f.queued && f.removing == 0 && now >= f.retry_after) {
      ready.push_back(inode.get());
      gathered = gathered || (f.released && now - f.released_at >= kGroupGather);
    }
  }
  std::sort(ready.begin(), ready.end(), [](Inode* a, Inode* b) {
    if (a->ledger.dirty != b->ledger.dirty) return a->ledger.dirty > b->ledger.dirty;
    return a->ledger.dirty_since < b->ledger.dirty_since;
  });
  uint64_t trigger = sync_trigger(p_.batch, p_.window);
  std::vector<SyncJob> chosen;
  for (Inode* inode : ready) {
    FileLedger& f = inode->ledger;
    SyncReason reason;
    if (inode->forgotten()) {
      reason = SyncReason::kForget;
    } else if (!p_.inject) {
      continue;
    } else if (f.dirty >= trigger) {
      reason = SyncReason::kBatch;
    } else if (f.released) {
      if (!gathered) continue;  // let the next closes join in
      reason = SyncReason::kRelease;
    } else if (now - f.dirty_since >= p_.max_age) {
      reason = SyncReason::kAge;
    } else {
      continue;
    }
    chosen.push_back(begin(files_.at(inode), reason));
  }
  // Writers queued, or the window half used: keep the target busy with the largest file.
  bool pressure = !line_.empty() || unsynced() * 2 >= p_.window;
  if (p_.inject && pressure && chosen.empty() && !ready.empty() &&
      (in_flight < unsynced() / 2 || in_flight == 0)) {
    chosen.push_back(begin(files_.at(ready.front()), SyncReason::kWindow));
  }
  return chosen;
}

double Window::next_deadline() const {
  if (!p_.inject) return kNever;
  double soonest = kNever;
  for (auto& [key, inode] : files_) {
    const FileLedger& f = inode->ledger;
    // Files being synced are left out: their end wakes the flusher anyway (counting them
    // made a passed deadline come back at once and spin for as long as the fsync took).
    if (f.dirty == 0 || f.queued) continue;
    double due_at = f.released ? f.released_at + kGroupGather : f.dirty_since + p_.max_age;
    soonest = std::min(soonest, std::max(due_at, f.retry_after));
  }
  return soonest;
}

std::vector<SyncJob> Window::wait_due(const bool& stopping) {
  std::unique_lock<std::mutex> guard(lock_);
  for (;;) {
    if (stopping) return {};
    std::vector<SyncJob> jobs = due(now_seconds());
    if (!jobs.empty()) return jobs;
    double deadline = next_deadline();
    flusher_wakes_at_ = deadline;
    if (deadline == kNever) {
      flusher_.wait(guard);
    } else {
      flusher_.wait_until(guard, at(deadline));
    }
    flusher_wakes_at_ = 0;
  }
}

std::vector<SyncJob> Window::take_due(double now) {
  std::lock_guard<std::mutex> guard(lock_);
  return due(now);
}

void Window::wake_flusher() {
  std::lock_guard<std::mutex> guard(lock_);
  flusher_.notify_all();
}

std::vector<SyncJob> Window::take_all_dirty() {
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<SyncJob> jobs;
  std::vector<std::shared_ptr<Inode>> dirty;
  for (auto& [key, inode] : files_) {
    if (inode->ledger.dirty > 0 && !inode->ledger.queued) dirty.push_back(inode);
  }
  for (auto& inode : dirty) jobs.push_back(begin(inode, SyncReason::kEnd));
  return jobs;
}

std::vector<std::pair<std::shared_ptr<Inode>, int>> Window::owing() {
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<std::pair<std::shared_ptr<Inode>, int>> out;
  for (auto& [key, inode] : files_) {
    const FileLedger& f = inode->ledger;
    if (f.dirty > 0 || f.syncing > 0 || f.error != 0) out.emplace_back(inode, f.error);
  }
  return out;
}

// --- the control plane ------------------------------------------------------------------------

void Window::set_window(uint64_t window, double commit_rate) {
  std::lock_guard<std::mutex> guard(lock_);
  bool grew = window > p_.window;
  p_.window = window;
  p_.commit_rate = commit_rate;
  if (grew) gate_.notify_all();
  wake_flusher_by(now_seconds());
}

void Window::set_params(uint64_t batch, double max_age, bool enforce, bool inject) {
  std::lock_guard<std::mutex> guard(lock_);
  p_.batch = std::max<uint64_t>(batch, 1);
  p_.max_age = max_age;
  p_.enforce = enforce;
  p_.inject = inject;
  gate_.notify_all();
  wake_flusher_by(now_seconds());
}

WindowStats Window::stats() {
  std::lock_guard<std::mutex> guard(lock_);
  WindowStats s{};
  s.window = p_.window;
  s.unsynced = unsynced();
  s.reserved = reserved_;
  s.unsynced_high = unsynced_high_;
  double now = now_seconds();
  for (auto& [key, inode] : files_) {
    const FileLedger& f = inode->ledger;
    s.syncing += f.syncing;
    if (f.dirty + f.syncing > 0) {
      s.dirty_files++;
      if (f.dirty > 0) s.oldest_age = std::max(s.oldest_age, now - f.dirty_since);
    }
  }
  s.written = written_;
  s.synced = synced_;
  s.failed_syncs = failed_syncs_;
  s.waiting = line_.size();
  s.throttled = throttled_;
  s.paced = paced_;
  s.timeouts = timeouts_;
  s.wait_seconds = wait_seconds_;
  s.waits = waits_;
  s.commit_rate = p_.commit_rate;
  return s;
}

}  // namespace ft
