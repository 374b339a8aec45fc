// The files the kernel knows by node id: each holds an O_PATH descriptor of its file on the
// target, found again by (device, inode number) when the kernel looks up another name of it.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "fd.h"
#include "window.h"

namespace ft {

struct InodeKey {
  dev_t dev;
  ino_t ino;
  bool operator==(const InodeKey& o) const { return dev == o.dev && ino == o.ino; }
};

struct InodeKeyHash {
  size_t operator()(const InodeKey& k) const {
    return std::hash<uint64_t>()(static_cast<uint64_t>(k.ino) * 1000003u ^ k.dev);
  }
};

// One file the kernel holds a reference to. Its descriptor lives as long as the kernel's
// lookups of it do, and after that as long as the window still owes it a sync (both share
// it; the node id is its address).
class Inode : public std::enable_shared_from_this<Inode> {
 public:
  Inode(Fd path, InodeKey key, mode_t type) : path_(std::move(path)), key_(key), type_(type) {}
  int fd() const { return path_.get(); }
  InodeKey key() const { return key_; }
  bool is_symlink() const { return S_ISLNK(type_); }
  bool is_dir() const { return S_ISDIR(type_); }
  bool is_regular() const { return S_ISREG(type_); }
  // Let go of before its last name was removed (removal.h): its descriptor's number points at
  // nothing of the target any more, so calls through it fail instead of reaching another file.
  bool detached() const { return detached_.load(std::memory_order_acquire); }
  // Its attributes when it was let go of, with no link left (valid once detached()).
  const struct stat& removed() const { return removed_; }

  // The mtime the kernel's writeback cache last handed back with a file handle (ns), see
  // op_setattr: the same time sent again later without one is still the kernel's own.
  void set_kernel_mtime(int64_t ns) { kernel_mtime_.store(ns, std::memory_order_relaxed); }
  int64_t kernel_mtime() const { return kernel_mtime_.load(std::memory_order_relaxed); }

  // Who last opened the file to write: its syncs run as them (a squashing target refuses the
  // daemon's root), as NFS's write-back does.
  void set_writer(uid_t uid, gid_t gid) {
    writer_.store((static_cast<uint64_t>(uid) << 32) | gid, std::memory_order_relaxed);
  }
  uint64_t writer() const { return writer_.load(std::memory_order_relaxed); }

  FileLedger ledger;  // its un-synced data: guarded by the window's lock

 private:
  friend class InodeTable;
  Fd path_;
  InodeKey key_;
  mode_t type_;
  uint64_t lookups_ = 0;  // guarded by the table's lock
  std::atomic<uint64_t> writer_{0};
  std::atomic<int64_t> kernel_mtime_{-1};
  std::atomic<bool> detached_{false};
  struct stat removed_ {};
};

class InodeTable {
 public:
  // The root: the source directory, never forgotten.
  int open_root(const char* source);
  Inode& root() { return *root_; }

  // The inode of *node* (FUSE_ROOT_ID is the root).
  Inode& get(fuse_ino_t node) {
    return node == FUSE_ROOT_ID ? *root_ : *reinterpret_cast<Inode*>(node);
  }
  std::shared_ptr<Inode> share(fuse_ino_t node) { return get(node).shared_from_this(); }
  fuse_ino_t node_of(const Inode& inode) const {
    return &inode == root_.get() ? FUSE_ROOT_ID : reinterpret_cast<fuse_ino_t>(&inode);
  }

  // Count one more lookup of the file *path* (stat *st*) and return its node; the descriptor
  // is kept if the file is new to the table, closed otherwise.
  fuse_ino_t remember(Fd path, const struct stat& st);
  // The kernel dropped *n* lookups of *node*: at none, the table lets it go and hands it
  // back (the window keeps it while it owes a sync; its descriptor closes with the last).
  std::shared_ptr<Inode> forget(fuse_ino_t node, uint64_t n);

  // The file known by *key*, if the kernel holds it.
  std::shared_ptr<Inode> find(InodeKey key);
  // Let go of *inode*'s descriptor before its last name is removed: the number is pointed at
  // a placeholder (so it is not reused while a request still holds it) and the inode leaves
  // the lookup by key (a new lookup of the file makes a new one); the kernel's node id stays
  // valid until it forgets it; *last*: its attributes before the removal. False if the table
  // no longer knows it by its key.
  bool detach(Inode& inode, const struct stat& last);
  // The removal failed: *inode* holds its file again through *fresh*.
  void reattach(Inode& inode, Fd fresh);

  // The node ids the kernel holds (the root aside), for invalidating their attributes.
  std::vector<fuse_ino_t> nodes();

  size_t size();

 private:
  std::mutex lock_;
  std::unordered_map<InodeKey, std::shared_ptr<Inode>, InodeKeyHash> known_;
  std::unordered_map<const Inode*, std::shared_ptr<Inode>> detached_;  // still held by the kernel
  std::shared_ptr<Inode> root_;
};

}  // namespace ft
