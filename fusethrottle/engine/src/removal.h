// Letting go of a file before its last name is removed (unlink, rename over it).
//
// On NFS a file unlinked or renamed over while anything of the client still references it is
// not removed but renamed to .nfsXXXX ("silly rename") until the last reference goes; on any
// target its space stays allocated until then. The engine references every file the kernel
// knows through an O_PATH descriptor, and a closed file with data to sync through its released
// handle's descriptor. So when the name is the file's last link and nothing has the file open,
// both are let go of just before the removal: the window drops the file's un-synced data (it
// is about to go) and closes the held descriptor, the table points the O_PATH descriptor's
// number at a placeholder. A file still open is removed as NFS would remove it directly.
#pragma once

#include <chrono>
#include <memory>

#include "inode.h"

#include "window.h"

namespace ft {

class Engine;

class LetGo {
 public:
  // How long a removal waits for a running sync of the file (its descriptor keeps the file);
  // past it the file is removed as an open one.
  static constexpr std::chrono::milliseconds kSyncWait{2000};

  // Before removing *name* from the directory *dir*.
  LetGo(Engine& engine, int dir, const char* name);
  // The same with the table and the window named (tests/model_test.cc drives it without a
  // mount), waiting at most *wait* for a running sync.
  LetGo(InodeTable& inodes, Window& window, int dir, const char* name,
        std::chrono::milliseconds wait = kSyncWait);
  LetGo(const LetGo&) = delete;
  LetGo& operator=(const LetGo&) = delete;
  // After it, *error* its result: a failed removal holds the file again by its name.
  void removed(int error);

 private:
  InodeTable& inodes_;
  int dir_;
  const char* name_;
  std::shared_ptr<Inode> inode_;  // let go of (else null)
};

}  // namespace ft
