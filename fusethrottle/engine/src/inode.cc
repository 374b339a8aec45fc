#include "inode.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <mutex>
#include <string>

namespace ft {

const char* place_name(Place place) {
  switch (place) {
    case Place::kNew: return "new";
    case Place::kKnown: return "known";
    case Place::kOwing: return "owing";
    case Place::kDetached: return "detached";
    case Place::kRetired: return "retired";
    case Place::kGone: return "gone";
  }
  return "?";
}

bool legal(Place from, Place to) {
  switch (from) {
    case Place::kNew: return to == Place::kKnown;
    // Looked up: forgotten (owing, or gone), let go of before a removal, or its key taken.
    case Place::kKnown:
      return to == Place::kOwing || to == Place::kGone || to == Place::kDetached ||
             to == Place::kRetired;
    // Owing with no lookup: looked up again, settled, or let go of before a removal.
    case Place::kOwing: return to == Place::kKnown || to == Place::kGone || to == Place::kDetached;
    // The removal failed (found by its key again, or its key taken meanwhile), or forgotten.
    case Place::kDetached:
      return to == Place::kKnown || to == Place::kRetired || to == Place::kGone;
    case Place::kRetired: return to == Place::kGone;
    case Place::kGone: return false;
  }
  return false;
}

void InodeTable::move(Inode& inode, Place to) {
  Place from = inode.place_.load(std::memory_order_relaxed);
  if (!legal(from, to)) {
    illegal_moves_.fetch_add(1, std::memory_order_relaxed);
    std::fprintf(stderr, "fusethrottle engine: illegal move of node %p: %s -> %s\n",
                 static_cast<void*>(&inode), place_name(from), place_name(to));
#ifdef FT_CHECK_MOVES
    std::abort();
#endif
  }
  inode.place_.store(to, std::memory_order_release);
  if (to == Place::kGone) shrunk_.notify_all();  // out of the table: it holds one file less
}

namespace {
// The device of the last file system that has no handles to give (the NFS client: EOPNOTSUPP),
// 0 for none: its objects are not asked again, a system call per lookup saved.
std::atomic<uint64_t> no_handles_dev{0};
}  // namespace

std::string handle_of(int fd, dev_t dev) {
  if (dev != 0 && no_handles_dev.load(std::memory_order_relaxed) == dev) return {};
  struct {
    file_handle head;
    unsigned char bytes[MAX_HANDLE_SZ];
  } found{};
  found.head.handle_bytes = MAX_HANDLE_SZ;
  int mount_id = 0;
  if (::name_to_handle_at(fd, "", &found.head, &mount_id, AT_EMPTY_PATH) != 0) {
    if (errno == EOPNOTSUPP && dev != 0) no_handles_dev.store(dev, std::memory_order_relaxed);
    return {};
  }
  std::string handle(reinterpret_cast<const char*>(&found.head.handle_type), sizeof(int));
  handle.append(reinterpret_cast<const char*>(found.head.f_handle), found.head.handle_bytes);
  return handle;
}

int InodeTable::open_root(const char* source) {
  Fd fd(::open(source, O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return -errno;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return -errno;
  std::string handle = handle_of(fd.get(), st.st_dev);
  root_ = std::make_shared<Inode>(std::move(fd), InodeKey{st.st_dev, st.st_ino}, st.st_mode,
                                  std::move(handle));
  return 0;
}

fuse_ino_t InodeTable::remember(Fd path, const struct stat& st, std::string handle) {
  InodeKey key{st.st_dev, st.st_ino};
  if (root_ && key == root_->key()) return FUSE_ROOT_ID;  // the root is counted by nobody
  std::unique_lock<std::mutex> guard(lock_);
  auto& slot = known_[key];
  if (slot && !slot->same_object(st.st_mode, handle)) {
    // Its key names another object now. One the kernel still holds is kept for its node id
    // until forgotten; one only the window keeps (owing) leaves the table with it.
    Inode* old = slot.get();
    if (old->lookups_ != 0) {
      move(*old, Place::kRetired);
      detached_.emplace(old, std::move(slot));
    } else {
      move(*old, Place::kGone);
      slot.reset();
    }
  }
  bool past = false;
  if (!slot) {
    slot = std::make_shared<Inode>(std::move(path), key, st.st_mode & S_IFMT, std::move(handle));
    slot->born_ = ++born_;
    past = known_.size() > high_;
  }
  if (slot->place() != Place::kKnown) move(*slot, Place::kKnown);  // new, or owing and found again
  slot->lookups_++;
  auto node = reinterpret_cast<fuse_ino_t>(slot.get());
  guard.unlock();
  if (past) full_();
  return node;
}

void InodeTable::named(fuse_ino_t node, fuse_ino_t parent, const char* name) {
  if (node == FUSE_ROOT_ID) return;
  std::lock_guard<std::mutex> guard(lock_);
  auto* inode = reinterpret_cast<Inode*>(node);
  inode->parent_ = parent;
  inode->name_ = name;
}

void InodeTable::when_past(size_t high, std::function<void()> full) {
  std::lock_guard<std::mutex> guard(lock_);
  full_ = std::move(full);
  high_ = high;
}

std::vector<InodeTable::Name> InodeTable::oldest_names(size_t count,
                                                       std::chrono::steady_clock::duration again) {
  std::vector<Name> out;
  if (count == 0) return out;
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<Inode*> candidates;
  candidates.reserve(known_.size());
  for (auto& [key, inode] : known_) {
    if (inode->parent_ != 0 && inode->lookups_ != 0 && inode->asked_until_ <= now) {
      candidates.push_back(inode.get());
    }
  }
  count = std::min(count, candidates.size());
  auto older = [](const Inode* a, const Inode* b) { return a->born_ < b->born_; };
  std::partial_sort(candidates.begin(), candidates.begin() + static_cast<ptrdiff_t>(count),
                    candidates.end(), older);
  out.reserve(count);
  for (size_t i = 0; i < count; i++) {
    Inode* inode = candidates[i];
    inode->asked_until_ = now + again;
    out.push_back(Name{inode->shared_from_this(), inode->parent_, inode->name_});
  }
  return out;
}

std::shared_ptr<Inode> InodeTable::forget(
    fuse_ino_t node, uint64_t n, const std::function<bool(const std::shared_ptr<Inode>&)>& owed) {
  if (node == FUSE_ROOT_ID) return nullptr;
  std::lock_guard<std::mutex> guard(lock_);
  auto* inode = reinterpret_cast<Inode*>(node);
  inode->lookups_ -= n < inode->lookups_ ? n : inode->lookups_;
  if (inode->lookups_ != 0) return nullptr;
  if (auto was = detached_.find(inode); was != detached_.end()) {
    // No name finds it again: the window alone keeps it while it owes.
    std::shared_ptr<Inode> gone = std::move(was->second);
    detached_.erase(was);
    move(*gone, Place::kGone);
    owed(gone);
    return gone;
  }
  auto it = known_.find(inode->key());
  if (it == known_.end() || it->second.get() != inode) return nullptr;
  // Owing before the window is asked (it syncs a forgotten file at once, see Inode::forgotten);
  // known with no lookup until settled(), or gone now if it owes nothing.
  move(*inode, Place::kOwing);
  if (owed(it->second)) return nullptr;
  std::shared_ptr<Inode> gone = std::move(it->second);
  known_.erase(it);
  move(*gone, Place::kGone);
  return gone;
}

std::shared_ptr<Inode> InodeTable::settled(const std::shared_ptr<Inode>& inode) {
  std::lock_guard<std::mutex> guard(lock_);
  if (inode->lookups_ != 0) return nullptr;  // looked up again: the kernel holds it
  auto it = known_.find(inode->key());
  if (it == known_.end() || it->second != inode) return nullptr;
  std::shared_ptr<Inode> gone = std::move(it->second);
  known_.erase(it);
  move(*gone, Place::kGone);
  return gone;
}

std::shared_ptr<Inode> InodeTable::find(InodeKey key) {
  std::lock_guard<std::mutex> guard(lock_);
  auto it = known_.find(key);
  return it == known_.end() ? nullptr : it->second;
}

bool Inode::shut() {
  return (use_.fetch_or(kLetGo, std::memory_order_acq_rel) & kLetGo) == 0;
}

namespace {
// Removals waiting for the calls through a file's descriptor to end (Inode::drained), woken by
// the last call out of a file being let go of. One pair for every file: such waits are rare
// and short, and each waiter looks at its own file's count. A leaf lock: nothing is taken
// while it is held.
std::mutex drain_lock;
std::condition_variable drain_ended;
}  // namespace

void Inode::last_out() {
  // Taken and let go before the notify: a removal between its look at the count and its wait
  // holds the lock, so the wake-up comes after it waits, never before.
  { std::lock_guard<std::mutex> guard(drain_lock); }
  drain_ended.notify_all();
}

bool Inode::drained(std::chrono::milliseconds bound) {
  auto idle = [this] { return (use_.load(std::memory_order_acquire) & ~kLetGo) == 0; };
  if (idle()) return true;
  std::unique_lock<std::mutex> guard(drain_lock);
  return drain_ended.wait_for(guard, bound, idle);
}

bool InodeTable::detach(Inode& inode, const struct stat& last) {
  {
    std::lock_guard<std::mutex> guard(lock_);
    auto it = known_.find(inode.key());
    if (it == known_.end() || it->second.get() != &inode || inode.detached()) return false;
    inode.removed_ = last;  // read only once let go of
    inode.removed_.st_nlink = 0;
    if (!inode.shut()) return false;
  }
  // Outside the table's lock: a call under way may need it.
  if (!inode.drained(kDrainBound)) {
    inode.reopen();
    return false;
  }
  std::lock_guard<std::mutex> guard(lock_);
  if (::dup3(placeholder_.get(), inode.fd(), O_CLOEXEC) < 0) {
    inode.reopen();
    return false;
  }
  // Forgotten meanwhile, it is out of the table already: its descriptor closes with the last
  // holder, the placeholder's now.
  auto it = known_.find(inode.key());
  if (it != known_.end() && it->second.get() == &inode) {
    // Kept for the kernel's node id until it forgets it; one it forgot already goes now.
    if (inode.lookups_ != 0) {
      move(inode, Place::kDetached);
      detached_.emplace(&inode, std::move(it->second));
    } else {
      move(inode, Place::kGone);
    }
    known_.erase(it);
  }
  return true;
}

void InodeTable::reattach(Inode& inode, Fd fresh) {
  std::lock_guard<std::mutex> guard(lock_);
  if (::dup3(fresh.get(), inode.fd(), O_CLOEXEC) < 0) return;
  inode.use_.store(0, std::memory_order_release);
  auto was = detached_.find(&inode);
  if (was == detached_.end()) return;
  auto& slot = known_[inode.key()];
  if (slot) {  // looked up anew meanwhile: this one stays out of the lookup by key
    move(inode, Place::kRetired);
    return;
  }
  slot = std::move(was->second);
  detached_.erase(was);
  move(inode, Place::kKnown);
}

std::vector<fuse_ino_t> InodeTable::nodes() {
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<fuse_ino_t> out;
  out.reserve(known_.size() + detached_.size());
  for (auto& [key, inode] : known_) {
    if (inode->lookups_ != 0) out.push_back(reinterpret_cast<fuse_ino_t>(inode.get()));
  }
  for (auto& [at, inode] : detached_) out.push_back(reinterpret_cast<fuse_ino_t>(inode.get()));
  return out;
}

size_t InodeTable::size() {
  std::lock_guard<std::mutex> guard(lock_);
  return known_.size() + detached_.size();
}

bool InodeTable::wait_for_size(size_t count, std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> guard(lock_);
  return shrunk_.wait_for(guard, bound,
                          [&] { return known_.size() + detached_.size() <= count; });
}

}  // namespace ft
