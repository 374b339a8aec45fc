#include "removal.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "engine.h"

namespace ft {

LetGo::LetGo(Engine& engine, int dir, const char* name)
    : LetGo(engine.inodes(), engine.window(), dir, name) {}

LetGo::LetGo(InodeTable& inodes, Window& window, int dir, const char* name,
             std::chrono::milliseconds wait)
    : inodes_(inodes), dir_(dir), name_(name) {
  struct stat st {};
  if (::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (S_ISDIR(st.st_mode) || st.st_nlink > 1) return;  // not the file's last name
  std::shared_ptr<Inode> inode = inodes.find(InodeKey{st.st_dev, st.st_ino});
  if (!inode || !window.let_go(*inode, wait)) return;
  if (inodes.detach(*inode, st)) inode_ = std::move(inode);
}

void LetGo::removed(int error) {
  if (!inode_ || error == 0) return;
  Fd fresh(::openat(dir_, name_, O_PATH | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fresh || ::fstat(fresh.get(), &st) != 0) return;  // gone after all: nothing to hold
  if (!(InodeKey{st.st_dev, st.st_ino} == inode_->key())) return;  // another file by now
  inodes_.reattach(*inode_, std::move(fresh));
}

}  // namespace ft
