#include "inode.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace ft {

int InodeTable::open_root(const char* source) {
  Fd fd(::open(source, O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return -errno;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return -errno;
  root_ = std::make_shared<Inode>(std::move(fd), InodeKey{st.st_dev, st.st_ino}, st.st_mode);
  return 0;
}

fuse_ino_t InodeTable::remember(Fd path, const struct stat& st) {
  InodeKey key{st.st_dev, st.st_ino};
  if (root_ && key == root_->key()) return FUSE_ROOT_ID;  // the root is counted by nobody
  std::lock_guard<std::mutex> guard(lock_);
  auto& slot = known_[key];
  if (!slot) slot = std::make_shared<Inode>(std::move(path), key, st.st_mode & S_IFMT);
  slot->lookups_++;
  return reinterpret_cast<fuse_ino_t>(slot.get());
}

std::shared_ptr<Inode> InodeTable::forget(fuse_ino_t node, uint64_t n) {
  if (node == FUSE_ROOT_ID) return nullptr;
  std::lock_guard<std::mutex> guard(lock_);
  auto* inode = reinterpret_cast<Inode*>(node);
  inode->lookups_ -= n < inode->lookups_ ? n : inode->lookups_;
  if (inode->lookups_ != 0) return nullptr;
  if (auto was = detached_.find(inode); was != detached_.end()) {
    std::shared_ptr<Inode> gone = std::move(was->second);
    detached_.erase(was);
    return gone;
  }
  auto it = known_.find(inode->key());
  if (it == known_.end() || it->second.get() != inode) return nullptr;
  std::shared_ptr<Inode> gone = std::move(it->second);
  known_.erase(it);
  return gone;
}

std::shared_ptr<Inode> InodeTable::find(InodeKey key) {
  std::lock_guard<std::mutex> guard(lock_);
  auto it = known_.find(key);
  return it == known_.end() ? nullptr : it->second;
}

bool InodeTable::detach(Inode& inode, const struct stat& last) {
  // An unbound socket: nothing on the target, and a reopen through /proc fails (ENXIO).
  Fd placeholder(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!placeholder) return false;
  std::lock_guard<std::mutex> guard(lock_);
  auto it = known_.find(inode.key());
  if (it == known_.end() || it->second.get() != &inode) return false;
  if (::dup3(placeholder.get(), inode.fd(), O_CLOEXEC) < 0) return false;
  inode.removed_ = last;
  inode.removed_.st_nlink = 0;
  inode.detached_.store(true, std::memory_order_release);
  detached_.emplace(&inode, std::move(it->second));
  known_.erase(it);
  return true;
}

void InodeTable::reattach(Inode& inode, Fd fresh) {
  std::lock_guard<std::mutex> guard(lock_);
  if (::dup3(fresh.get(), inode.fd(), O_CLOEXEC) < 0) return;
  inode.detached_.store(false, std::memory_order_release);
  auto was = detached_.find(&inode);
  if (was == detached_.end()) return;
  auto& slot = known_[inode.key()];
  if (slot) return;  // looked up anew meanwhile: this one stays out of the lookup by key
  slot = std::move(was->second);
  detached_.erase(was);
}

std::vector<fuse_ino_t> InodeTable::nodes() {
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<fuse_ino_t> out;
  out.reserve(known_.size() + detached_.size());
  for (auto& [key, inode] : known_) out.push_back(reinterpret_cast<fuse_ino_t>(inode.get()));
  for (auto& [at, inode] : detached_) out.push_back(reinterpret_cast<fuse_ino_t>(inode.get()));
  return out;
}

size_t InodeTable::size() {
  std::lock_guard<std::mutex> guard(lock_);
  return known_.size() + detached_.size();
}

}  // namespace ft
