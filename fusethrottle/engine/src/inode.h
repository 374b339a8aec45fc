// The files the kernel knows by node id: each holds an O_PATH descriptor of its file on the
// target, found again by (device, inode number) when the kernel looks up another name of it.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fd.h"
#include "kernel_view.h"
#include "window.h"

namespace ft {

struct InodeKey {
  dev_t dev;
  ino_t ino;
  bool operator==(const InodeKey& o) const { return dev == o.dev && ino == o.ino; }
};

// The target's file handle of an object on device *dev* (name_to_handle_at: type and bytes;
// empty where the file system has none). A file system gives a removed object's inode number
// to a new one: the handle tells the two apart without asking the target. The NFS client
// gives no handles (EOPNOTSUPP, as on 6.12): there another host's new object under a number
// this host still holds is told apart only by its type, and else by the server's ESTALE for
// the old one (Inode::same_object).
std::string handle_of(int fd, dev_t dev);

// Where a file stands in the table: the one state of its life the table keeps (guarded by the
// table's lock), moved only by InodeTable (inode.cc), each move checked against `legal`.
// What else a file's life holds overlaps with any of these and is owned where it is decided:
// open (an OpenFile), owing a sync (its FileLedger, the window's), stale (a flag the target's
// answers set), calls under way (Using).
enum class Place : uint8_t {
  kNew,       // made, not yet in the table
  kKnown,     // in the lookup by key, the kernel holds lookups of it
  kOwing,     // in the lookup by key with no lookup left: the window keeps it while it owes
  kDetached,  // let go of before its last name was removed; the kernel still holds it
  kRetired,   // its key names another object now; the kernel still holds it
  kGone,      // out of the table: its holders (the window, requests) let go in their time
};
const char* place_name(Place place);
// Whether a file may move from *from* to *to* (pure; the unit tests walk every pair).
bool legal(Place from, Place to);

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
  Inode(Fd path, InodeKey key, mode_t type, std::string handle)
      : path_(std::move(path)), key_(key), type_(type), handle_(std::move(handle)) {}
  int fd() const { return path_.get(); }
  InodeKey key() const { return key_; }
  bool is_symlink() const { return S_ISLNK(type_); }
  bool is_dir() const { return S_ISDIR(type_); }
  bool is_regular() const { return S_ISREG(type_); }
  // Let go of before its last name was removed (removal.h): its descriptor's number points at
  // nothing of the target any more, so calls through it fail instead of reaching another file.
  bool detached() const { return (use_.load(std::memory_order_acquire) & kLetGo) != 0; }
  // A call through its descriptor starts (false: it was let go of, the call must not go
  // through the placeholder) and ends; a removal lets go of it only while none is under way.
  bool enter() {
    uint32_t now = use_.load(std::memory_order_acquire);
    do {
      if (now & kLetGo) return false;
    } while (!use_.compare_exchange_weak(now, now + 1, std::memory_order_acq_rel));
    return true;
  }
  void leave() {
    if (use_.fetch_sub(1, std::memory_order_acq_rel) == kLetGo + 1) last_out();
  }
  // A removal lets go of it: no call enters from now on (false: another removal did first),
  // and those under way are waited for, at most *bound* (false: one still is, and calls are
  // let in again). A call under way is one system call on the target (a stat, an attribute,
  // an xattr), often one the kernel sent by itself (the writeback cache's mtime after a
  // close): a removal that went ahead meanwhile left the file allocated until it ended, and
  // on NFS renamed it to .nfsXXXX. The wait sleeps until the last call leaves (it wakes the
  // removal), not in polls: a timed condition variable, since std::atomic::wait has no bound
  // and a call on a hung target may never end.
  bool shut();
  bool drained(std::chrono::milliseconds bound);
  void reopen() { use_.fetch_and(~kLetGo, std::memory_order_acq_rel); }
  // Its attributes when it was let go of, with no link left (valid once detached()).
  const struct stat& removed() const { return removed_; }
  // Whether *type* and *handle*, just looked up under its key, are this object (see handle_of).
  // Where the target has no handles (NFS), one the target called stale is not: the server's
  // ESTALE says its object is gone, so what the key names now is another; else only a change
  // of type shows.
  bool same_object(mode_t type, const std::string& handle) const {
    return may_be(type, handle) && (by_handle(handle) || !stale());
  }
  // Whether they may be this object, as far as the handle and type tell (the stale aside).
  bool may_be(mode_t type, const std::string& handle) const {
    return by_handle(handle) ? handle == handle_ : (type & S_IFMT) == type_;
  }
  // Whether both sides have a handle to compare.
  bool by_handle(const std::string& handle) const { return !handle.empty() && !handle_.empty(); }

  // The target answered ESTALE to a call through it (another host removed or replaced the
  // object): a lookup that finds it again under a name has the target's client look the name
  // up anew (see ops.cc: look_again).
  void set_stale(bool stale) { stale_.store(stale, std::memory_order_relaxed); }
  bool stale() const { return stale_.load(std::memory_order_relaxed); }

  // The mtime the kernel's writeback cache holds as far as the engine saw (ns): the last one
  // it handed back with a file handle, or the last one set through it on the target (utimes),
  // see op_setattr: the same time sent again later without a handle is the kernel's own.
  void set_kernel_mtime(int64_t ns) { kernel_mtime_.store(ns, std::memory_order_relaxed); }
  int64_t kernel_mtime() const { return kernel_mtime_.load(std::memory_order_relaxed); }

  // Who last opened the file to write: its syncs run as them (a squashing target refuses the
  // daemon's root), as NFS's write-back does.
  void set_writer(uid_t uid, gid_t gid) {
    writer_.store((static_cast<uint64_t>(uid) << 32) | gid, std::memory_order_relaxed);
  }
  uint64_t writer() const { return writer_.load(std::memory_order_relaxed); }

  // Where it stands in the table (see Place): moved under the table's lock, read anywhere.
  Place place() const { return place_.load(std::memory_order_acquire); }
  // The kernel holds no lookup of it (owing, or out of the table): only the window can still
  // sync it. The table's place is the one record of it: a lookup that finds the file again
  // makes it the kernel's again for the window too. The window reads it under its own lock;
  // a forget moves the file before it asks the window (InodeTable::forget), so the flusher
  // the window wakes sees the move.
  bool forgotten() const {
    Place now = place();
    return now == Place::kOwing || now == Place::kGone;
  }

  // Its un-synced data and its one open count (FileLedger::opens): the window's lock.
  FileLedger ledger;
  // What the kernel was shown of it (regular files, writeback cache): its own leaf lock; the
  // open count it decides with is the ledger's, read through the window (Window::looked_up).
  KernelView view;

 private:
  friend class InodeTable;
  Fd path_;
  InodeKey key_;
  mode_t type_;
  std::string handle_;
  uint64_t lookups_ = 0;  // guarded by the table's lock
  std::atomic<Place> place_{Place::kNew};  // written under the table's lock
  // The name the kernel last learned it by (for relief.h), its age and when the kernel was
  // last asked to drop it: guarded by the table's lock.
  fuse_ino_t parent_ = 0;
  std::string name_;
  uint64_t born_ = 0;
  std::chrono::steady_clock::time_point asked_until_{};
  std::atomic<bool> stale_{false};
  std::atomic<uint64_t> writer_{0};
  std::atomic<int64_t> kernel_mtime_{-1};
  static constexpr uint32_t kLetGo = 1u << 31;
  void last_out();  // the last call under way left a file being let go of
  std::atomic<uint32_t> use_{0};  // calls under way through the descriptor, and kLetGo
  struct stat removed_ {};
};

// One call through an inode's descriptor, from before it starts to after it ended. It holds
// the inode too: once a request is answered the kernel may forget it.
class Using {
 public:
  explicit Using(std::shared_ptr<Inode> inode)
      : inode_(std::move(inode)), entered_(inode_->enter()) {}
  ~Using() {
    if (entered_) inode_->leave();
  }
  Using(const Using&) = delete;
  Using& operator=(const Using&) = delete;
  // False: the file was let go of (its last name removed); answer as for a removed file.
  explicit operator bool() const { return entered_; }

 private:
  std::shared_ptr<Inode> inode_;
  bool entered_;
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

  // Count one more lookup of the file *path* (stat *st*, file handle *handle*) and return its
  // node; the descriptor is kept if the file is new to the table, closed otherwise. A known
  // node whose key now names another object is retired: it leaves the lookup by key (the
  // kernel's node id stays valid until it forgets it) and the new object gets a node of its
  // own.
  fuse_ino_t remember(Fd path, const struct stat& st, std::string handle);
  // The kernel dropped *n* lookups of *node*: at none, *owed* is asked whether the file
  // still owes a sync (the window keeps it then). One that owes stays known by its key with
  // no lookup, so a new lookup of the file finds the same inode, its data and descriptors,
  // not a second one beside it (a removal through the new one left the old one's descriptors
  // holding the file: its space allocated, on NFS a silly rename), until settled(). Returns
  // the inode when it leaves the table (its descriptor closes with the last holder).
  std::shared_ptr<Inode> forget(fuse_ino_t node, uint64_t n,
                                const std::function<bool(const std::shared_ptr<Inode>&)>& owed);
  // A forgotten file owes nothing more: it leaves the table unless looked up again since.
  std::shared_ptr<Inode> settled(const std::shared_ptr<Inode>& inode);

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

  // The kernel learned *node* as *name* in *parent* (a lookup's reply).
  void named(fuse_ino_t node, fuse_ino_t parent, const char* name);
  // Past *high* known files, *full* is called (from a lookup's thread, outside the lock).
  void when_past(size_t high, std::function<void()> full);
  // The names of up to *count* files, oldest first, the kernel may be asked to drop now (not
  // the root, not asked within *again*), each marked as asked.
  struct Name {
    std::shared_ptr<Inode> inode;
    fuse_ino_t parent;
    std::string name;
  };
  std::vector<Name> oldest_names(size_t count, std::chrono::steady_clock::duration again);

  size_t size();
  // Wait until the table holds at most *count* files, at most *bound*: woken by each file that
  // leaves it (a move to kGone), not by polling. False if it still holds more.
  bool wait_for_size(size_t count, std::chrono::milliseconds bound);
  // Moves a file's life was asked to make that `legal` refuses (each one also logged; a
  // checked build, FT_CHECK_MOVES, aborts instead): none, ever.
  uint64_t illegal_moves() const { return illegal_moves_.load(std::memory_order_relaxed); }

 private:
  // The one place a file's Place changes (under the table's lock).
  void move(Inode& inode, Place to);
  std::atomic<uint64_t> illegal_moves_{0};
  // The table's lock: first in the engine's order (this one, then Window::lock_, then a
  // KernelView's, a leaf). Held, it may take the window's lock
  // (forget asks Window::forgotten); nothing it calls takes it again, and no callback of its
  // own (full_, the window's settled_) runs under it. Taken with nothing else held.
  std::mutex lock_;
  std::condition_variable shrunk_;  // a file left the table (wait_for_size), under lock_
  std::unordered_map<InodeKey, std::shared_ptr<Inode>, InodeKeyHash> known_;
  // Out of the lookup by key (let go of before a removal, or retired) but still held by the
  // kernel.
  std::unordered_map<const Inode*, std::shared_ptr<Inode>> detached_;
  // How long a removal waits for calls under way through the file's descriptor (see
  // Inode::drained); past it the removal goes ahead as for an open file.
  static constexpr std::chrono::milliseconds kDrainBound{1000};
  std::shared_ptr<Inode> root_;
  // What a let-go file's descriptor number points at (detach): an unbound socket, nothing on
  // the target, and a reopen through /proc fails (ENXIO). One for every such file (a dup3 of
  // it each): a socket made and closed per removal was two system calls of every unlink.
  // (Without one, made at the start, no file is let go of: each is removed as an open one.)
  Fd placeholder_{::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)};
  uint64_t born_ = 0;
  size_t high_ = SIZE_MAX;
  std::function<void()> full_;
};

}  // namespace ft
