#include "inode.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace ft {

int InodeTable::open_root(const char* source) {
  Fd fd(::open(source, O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return -errno;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return -errno;
  root_ = std::make_unique<Inode>(std::move(fd), InodeKey{st.st_dev, st.st_ino}, st.st_mode);
  return 0;
}

fuse_ino_t InodeTable::remember(Fd path, const struct stat& st) {
  InodeKey key{st.st_dev, st.st_ino};
  if (root_ && key == root_->key()) return FUSE_ROOT_ID;  // the root is counted by nobody
  std::lock_guard<std::mutex> guard(lock_);
  auto& slot = known_[key];
  if (!slot) slot = std::make_unique<Inode>(std::move(path), key, st.st_mode & S_IFMT);
  slot->lookups_++;
  return reinterpret_cast<fuse_ino_t>(slot.get());
}

int sync_file(int path_fd, uint64_t writer) {
  struct stat st {};
  if (::fstat(path_fd, &st) == 0 && st.st_nlink == 0) return 0;
  std::string path = proc_path(path_fd);
  // The reopen as the writer; this thread's own ids come back before anything else runs on it.
  auto before_uid = static_cast<uid_t>(::syscall(SYS_setfsuid, -1));
  auto before_gid = static_cast<gid_t>(::syscall(SYS_setfsgid, -1));
  bool as_writer = ::geteuid() == 0 && writer != 0;
  if (as_writer) {
    ::syscall(SYS_setfsgid, static_cast<gid_t>(writer & 0xffffffffu));
    ::syscall(SYS_setfsuid, static_cast<uid_t>(writer >> 32));
  }
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd && errno == EACCES) fd.reset(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  int err = fd ? 0 : errno;
  if (as_writer) {
    ::syscall(SYS_setfsuid, before_uid);
    ::syscall(SYS_setfsgid, before_gid);
  }
  if (err != 0) return err;
  return ::fsync(fd.get()) == 0 ? 0 : errno;
}

void InodeTable::forget(fuse_ino_t node, uint64_t n) {
  if (node == FUSE_ROOT_ID) return;
  std::unique_ptr<Inode> gone;  // closed outside the lock
  {
    std::lock_guard<std::mutex> guard(lock_);
    auto* inode = reinterpret_cast<Inode*>(node);
    inode->lookups_ -= n < inode->lookups_ ? n : inode->lookups_;
    if (inode->lookups_ == 0) {
      auto it = known_.find(inode->key());
      if (it != known_.end() && it->second.get() == inode) {
        gone = std::move(it->second);
        known_.erase(it);
      }
    }
  }
  if (gone && gone->unsynced() && sync_file(gone->fd(), gone->writer()) != 0) lost_syncs_++;
}

std::vector<fuse_ino_t> InodeTable::nodes() {
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<fuse_ino_t> out;
  out.reserve(known_.size());
  for (auto& [key, inode] : known_) out.push_back(reinterpret_cast<fuse_ino_t>(inode.get()));
  return out;
}

size_t InodeTable::sync_all() {
  // Each file's descriptor is duplicated under the lock and synced outside it: a forget
  // meanwhile closes only the table's own.
  struct Owed {
    Inode* inode;
    Fd fd;
    uint64_t writer;
  };
  std::vector<Owed> written;
  {
    std::lock_guard<std::mutex> guard(lock_);
    for (auto& [key, inode] : known_) {
      if (inode->take_unsynced()) {
        written.push_back(Owed{inode.get(), Fd(::dup(inode->fd())), inode->writer()});
      }
    }
  }
  size_t failures = 0;
  for (auto& [inode, fd, writer] : written) {
    int err = fd ? sync_file(fd.get(), writer) : errno;
    if (err != 0) {
      failures++;
      std::lock_guard<std::mutex> guard(lock_);
      auto it = known_.find(inode->key());
      if (it != known_.end() && it->second.get() == inode) inode->mark_written();  // still owed
    }
  }
  return failures;
}

size_t InodeTable::size() {
  std::lock_guard<std::mutex> guard(lock_);
  return known_.size();
}

}  // namespace ft
