#include "inode.h"

#include <fcntl.h>
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
  auto it = known_.find(inode->key());
  if (it == known_.end() || it->second.get() != inode) return nullptr;
  std::shared_ptr<Inode> gone = std::move(it->second);
  known_.erase(it);
  return gone;
}

std::vector<fuse_ino_t> InodeTable::nodes() {
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<fuse_ino_t> out;
  out.reserve(known_.size());
  for (auto& [key, inode] : known_) out.push_back(reinterpret_cast<fuse_ino_t>(inode.get()));
  return out;
}

size_t InodeTable::size() {
  std::lock_guard<std::mutex> guard(lock_);
  return known_.size();
}

}  // namespace ft
