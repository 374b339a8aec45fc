// Every FUSE request, passed through to the target as its caller. Each handler answers its
// request exactly once; a failing target call becomes the caller's errno.
#include <dirent.h>
#include <fcntl.h>
#include <linux/limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <thread>
#include <tuple>
#include <vector>

#include "call.h"
#include "caller.h"
#include "conn_flags.h"
#include "engine.h"
#include "handles.h"
#include "removal.h"

namespace ft {
namespace {

// Read before the handler ran (call.h): never through *req*, which an interrupt may have freed.
Engine& engine_of(fuse_req_t) { return *this_call().engine; }
Inode& inode_of(fuse_req_t req, fuse_ino_t node) { return engine_of(req).inodes().get(node); }

// A request for a file let go of before its name was removed (removal.h): answered as for a
// removed file, never through the placeholder its descriptor's number points at. *use* holds
// the file from the check to the end of the call.
bool let_go_of(fuse_req_t req, const Using& use) {
  if (use) return false;
  answer(fuse_reply_err, req, ENOENT);
  return true;
}

// The errno of a failed call, never 0 (a reply of 0 to a request that failed is a lie).
int failed() { return errno != 0 ? errno : EIO; }


int stat_inode(Inode& inode, struct stat* st) {
  Using use(inode.shared_from_this());
  if (!use) return ENOENT;  // let go of: its name was removed
  return ::fstatat(inode.fd(), "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 ? 0 : failed();
}

// How an entry came about: a lookup of what is there (which may find another writer's change,
// see kernel_view.h), or the mount's own making of it.
enum class Found { kLookedUp, kMade };

// With the writeback cache the kernel keeps its own size of a regular file (kernel_view.h).
KernelView* view_of(const Engine& engine, Inode& inode) {
  return engine.writeback_cache() && inode.is_regular() ? &inode.view : nullptr;
}

// *name* in the directory *dir* as the target's client has it now: its O_PATH descriptor,
// stat and file handle; 0 or the errno.
int find_name(int dir, const char* name, Fd* fd, struct stat* st, std::string* handle) {
  fd->reset(::openat(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!*fd) return failed();
  if (::fstatat(fd->get(), "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return failed();
  *handle = handle_of(fd->get(), st->st_dev);
  return 0;
}

// The lookup found the object the target called stale (inode.h: set_stale), or the target
// called what it found stale. An O_PATH open takes the target client's cached name as it is:
// on NFS the client keeps serving a name another host removed and made anew, with the old,
// stale handle, until the directory's attributes time out (acdirmin: 30 s). An open has NFS
// check the name with the server first (close-to-open); with O_DIRECTORY it does so for any
// type and opens nothing but a directory (no device or fifo is opened), so one is tried, and
// closed, before looking again; its refusal is no matter.
int look_again(int dir, const char* name, Inode* stale, Fd* fd, struct stat* st,
               std::string* handle) {
  Fd probe(::openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  probe.reset();
  int err = find_name(dir, name, fd, st, handle);
  if (err == 0 && stale != nullptr && stale->same_object(st->st_mode, *handle))
    stale->set_stale(false);  // the same object after all
  return err;
}

// Out of descriptors (EMFILE) before the relief's bound was reached (files held for their
// syncs, open handles, FORGETs lagging on a loaded host): the relief drops names now and the
// call is tried again, a few times, each after at most half a second (relief.h: make_room).
// A backup of a tree larger than the limit must not see EMFILE for it.
constexpr int kRoomTries = 3;
constexpr std::chrono::milliseconds kRoomWait{500};

template <typename Open>
Fd open_with_room(Engine& engine, const Open& open) {
  Fd fd(open());
  for (int i = 0; !fd && errno == EMFILE && i < kRoomTries; i++) {
    engine.relief().make_room(kRoomWait);
    fd.reset(open());
  }
  return fd;
}

// Look *name* up in *parent* and count the lookup the reply hands the kernel.
int look_up(Engine& engine, fuse_ino_t parent, const char* name, fuse_entry_param* entry,
            Found found = Found::kLookedUp) {
  *entry = fuse_entry_param{};
  uint64_t since = KernelView::now();
  int dir = engine.inodes().get(parent).fd();
  Fd fd;
  std::string handle;
  int err = find_name(dir, name, &fd, &entry->attr, &handle);
  for (int i = 0; err == EMFILE && i < kRoomTries; i++) {
    engine.relief().make_room(kRoomWait);
    err = find_name(dir, name, &fd, &entry->attr, &handle);
  }
  if (err == ESTALE) {
    err = look_again(dir, name, nullptr, &fd, &entry->attr, &handle);
  } else if (err == 0) {
    auto known = engine.inodes().find(InodeKey{entry->attr.st_dev, entry->attr.st_ino});
    if (known && known->stale() && known->may_be(entry->attr.st_mode, handle))
      err = look_again(dir, name, known.get(), &fd, &entry->attr, &handle);
  }
  if (err) return err;
  entry->attr_timeout = engine.options().attr_timeout;
  entry->entry_timeout = engine.options().entry_timeout;
  entry->ino = engine.inodes().remember(std::move(fd), entry->attr, std::move(handle));
  engine.inodes().named(entry->ino, parent, name);
  Inode& inode = engine.inodes().get(entry->ino);
  if (KernelView* view = view_of(engine, inode)) {
    // A lookup's decision reads the file's open count, the window's (Window::looked_up).
    entry->generation = found == Found::kLookedUp
                            ? engine.window().looked_up(inode, entry->attr, since)
                            : view->made(entry->attr, since);
  }
  return 0;
}

void forget_one(Engine& engine, fuse_ino_t node, uint64_t n);

// Every answer that hands the kernel an entry (LOOKUP, MKNOD, MKDIR, SYMLINK, LINK: *reply*
// fuse_reply_entry; CREATE: fuse_reply_create) goes through here. look_up counted the lookup
// the entry hands over; an answer that did not reach the kernel (the interrupt answered the
// caller EINTR first, or the kernel gave the request up) handed it nothing, so no FORGET will
// ever come for it: the count is undone, or the file's inode and descriptor stayed until the
// unmount. False then.
template <typename Reply, typename... Args>
bool answer_entry(Reply reply, fuse_req_t req, const fuse_entry_param& entry, Args... args) {
  Engine& engine = engine_of(req);
  if (answer(reply, req, &entry, args...) == 0) return true;
  forget_one(engine, entry.ino, 1);
  return false;
}

void reply_entry_of(fuse_req_t req, fuse_ino_t parent, const char* name,
                    Found found = Found::kLookedUp) {
  fuse_entry_param entry;
  int err = look_up(engine_of(req), parent, name, &entry, found);
  if (err) {
    answer(fuse_reply_err, req, err);
  } else {
    answer_entry(fuse_reply_entry, req, entry);
  }
}

// The flags a file is opened with on the target. With the writeback cache the kernel reads
// pages of a file opened write-only (to fill a partial page) and appends itself.
int target_flags(const Engine& engine, int flags) {
  flags &= ~O_NOFOLLOW;
  flags |= O_CLOEXEC;
  if (engine.writeback_cache()) {
    if ((flags & O_ACCMODE) == O_WRONLY) flags = (flags & ~O_ACCMODE) | O_RDWR;
    flags &= ~O_APPEND;
  }
  return flags;
}

// Open on the target; where read access was only added for the cache and is refused, as
// asked, and then *bypass*: that handle's writes skip the mount's page cache (filling a
// partial page would need the read the caller may not do).
Fd open_as_asked(Engine& engine, int flags, const std::function<int(int)>& open_with,
                 bool* bypass) {
  int wanted = target_flags(engine, flags);
  Fd fd = open_with_room(engine, [&] { return open_with(wanted); });
  *bypass = false;
  if (!fd && errno == EACCES && (flags & O_ACCMODE) == O_WRONLY &&
      (wanted & O_ACCMODE) == O_RDWR) {
    fd.reset(open_with((wanted & ~O_ACCMODE) | O_WRONLY));
    *bypass = static_cast<bool>(fd);
  }
  return fd;
}

// O_DIRECT needs a buffer aligned to the device's block; a page is enough for any. Kept per
// thread: a new one per request would fault its pages in again.
constexpr size_t kAlign = 4096;
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
struct AlignedBuffer {
  std::unique_ptr<void, FreeDeleter> data;
  size_t size = 0;
};
thread_local AlignedBuffer aligned;

char* aligned_buffer(size_t size) {
  if (aligned.size < size) {
    void* p = nullptr;
    size_t rounded = (size + kAlign - 1) / kAlign * kAlign;
    if (::posix_memalign(&p, kAlign, rounded) != 0) return nullptr;
    aligned.data.reset(p);
    aligned.size = rounded;
  }
  return static_cast<char*>(aligned.data.get());
}

void note_writer(Inode& inode, int flags) {
  if ((flags & O_ACCMODE) == O_RDONLY) return;
  inode.set_writer(this_call().uid, this_call().gid);
}

void set_open_reply(fuse_file_info* fi, int flags, bool bypass) {
  fi->direct_io = bypass || (flags & O_DIRECT) != 0;
  fi->keep_cache = 0;
}

// --- the session ------------------------------------------------------------------------

void op_init(void* userdata, fuse_conn_info* conn) {
  auto& engine = *static_cast<Engine*>(userdata);
  bool cache = engine.options().writeback_cache && conn_want(conn, FUSE_CAP_WRITEBACK_CACHE);
  if (!cache) conn_drop(conn, FUSE_CAP_WRITEBACK_CACHE);
  engine.set_writeback_cache(cache);
  engine.passthrough().init(conn, cache);
  // READDIRPLUS when the kernel sees it pay (a listing followed by lookups), READDIR else.
  conn_want(conn, FUSE_CAP_READDIRPLUS);
  conn_want(conn, FUSE_CAP_READDIRPLUS_AUTO);
  // The kernel clears set-user-ID bits on write itself (a request as root would keep them).
  conn_drop(conn, FUSE_CAP_HANDLE_KILLPRIV);
  conn_want(conn, FUSE_CAP_PARALLEL_DIROPS);
  conn_want(conn, FUSE_CAP_SPLICE_WRITE);
}

// --- names ----------------------------------------------------------------------------------

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  reply_entry_of(req, parent, name);
}

// The kernel forgot *node* n times: at none the table lets it go, and the window keeps it
// for as long as it owes a sync (nothing else could find the file to sync it).
void forget_one(Engine& engine, fuse_ino_t node, uint64_t n) {
  engine.inodes().forget(node, n, [&engine](const std::shared_ptr<Inode>& inode) {
    return engine.window().forgotten(inode);
  });
}

void op_forget(fuse_req_t req, fuse_ino_t node, uint64_t nlookup) {
  forget_one(engine_of(req), node, nlookup);
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; i++) forget_one(engine_of(req), forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (::mkdirat(inode_of(req, parent).fd(), name, mode) != 0) return (void)answer(fuse_reply_err, req, failed());
  reply_entry_of(req, parent, name, Found::kMade);
}

void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  if (::mknodat(inode_of(req, parent).fd(), name, mode, rdev) != 0)
    return (void)answer(fuse_reply_err, req, failed());
  reply_entry_of(req, parent, name, Found::kMade);
}

void op_symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  if (::symlinkat(link, inode_of(req, parent).fd(), name) != 0)
    return (void)answer(fuse_reply_err, req, failed());
  reply_entry_of(req, parent, name, Found::kMade);
}

void op_link(fuse_req_t req, fuse_ino_t node, fuse_ino_t newparent, const char* newname) {
  Using use(engine_of(req).inodes().share(node));
  if (let_go_of(req, use)) return;
  // Through /proc: linkat(AT_EMPTY_PATH) would need CAP_DAC_READ_SEARCH of the caller.
  std::string from = proc_path(inode_of(req, node).fd());
  if (::linkat(AT_FDCWD, from.c_str(), inode_of(req, newparent).fd(), newname, AT_SYMLINK_FOLLOW) != 0)
    return (void)answer(fuse_reply_err, req, failed());
  reply_entry_of(req, newparent, newname, Found::kMade);
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  int dir = inode_of(req, parent).fd();
  LetGo held(engine_of(req), dir, name);
  int err = ::unlinkat(dir, name, 0) == 0 ? 0 : failed();
  held.removed(err);
  answer(fuse_reply_err, req, err);
}

bool dot_or_dotdot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// How long an rmdir waits for files removed while open to go (see op_rmdir).
constexpr std::chrono::milliseconds kRemovedWhileOpenWait{2000};

// Whether the directory *name* in *parent* holds nothing but files NFS renamed to
// .nfsXXXX because they were removed while open (and that go at their last close): none at
// all, too (the last of them went meanwhile).
bool only_removed_while_open(int parent, const char* name) {
  Fd fd(::openat(parent, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return false;
  std::unique_ptr<DIR, DirCloser> dir(::fdopendir(fd.get()));
  if (!dir) return false;
  fd.release();  // the DIR owns it now
  while (struct dirent* entry = ::readdir(dir.get())) {
    if (!dot_or_dotdot(entry->d_name) && std::strncmp(entry->d_name, ".nfs", 4) != 0) return false;
  }
  return true;
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  int dir = inode_of(req, parent).fd();
  int err = ::unlinkat(dir, name, AT_REMOVEDIR) == 0 ? 0 : failed();
  // A file the caller removed while it had it open is a .nfsXXXX on NFS until the last close,
  // which the NFS client follows with the file's removal, without waiting for it. The
  // caller's own close came before this rmdir, but the kernel sends the daemon its release
  // without waiting for it either, so the engine's close (and the removal after it) can come
  // a moment later than on NFS directly: a directory emptied of all but those is retried for
  // that moment (stress-ng's hdd stressor saw ENOTEMPTY).
  auto pause = std::chrono::milliseconds(2);
  for (auto waited = pause * 0; err == ENOTEMPTY && waited < kRemovedWhileOpenWait;
       waited += pause, pause = std::min(pause * 2, std::chrono::milliseconds(100))) {
    if (!only_removed_while_open(dir, name)) break;
    std::this_thread::sleep_for(pause);
    err = ::unlinkat(dir, name, AT_REMOVEDIR) == 0 ? 0 : failed();
  }
  answer(fuse_reply_err, req, err);
}

void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
               const char* newname, unsigned int flags) {
  int from = inode_of(req, parent).fd();
  int to = inode_of(req, newparent).fd();
  if (flags & (RENAME_EXCHANGE | RENAME_NOREPLACE)) {  // nothing is replaced
    int rc = ::renameat2(from, name, to, newname, flags);
    return (void)answer(fuse_reply_err, req, rc == 0 ? 0 : failed());
  }
  LetGo held(engine_of(req), to, newname);  // the file renamed over, if any
  int err = ::renameat2(from, name, to, newname, flags) == 0 ? 0 : failed();
  held.removed(err);
  answer(fuse_reply_err, req, err);
}

// --- attributes -------------------------------------------------------------------------------

void op_getattr(fuse_req_t req, fuse_ino_t node, fuse_file_info* fi) {
  struct stat st {};
  int err = fi != nullptr ? (::fstat(borrow<OpenFile>(fi).fd.get(), &st) == 0 ? 0 : failed())
                          : stat_inode(inode_of(req, node), &st);
  if (err) return (void)answer(fuse_reply_err, req, err);
  answer(fuse_reply_attr, req, &st, engine_of(req).options().attr_timeout);
}

int set_attributes(const Inode& inode, const struct stat& attr, int to_set, const fuse_file_info* fi) {
  int fd = fi != nullptr ? borrow<OpenFile>(fi).fd.get() : -1;
  std::string path = proc_path(inode.fd());
  if (to_set & FUSE_SET_ATTR_MODE) {
    if (inode.is_symlink()) return EOPNOTSUPP;
    int rc = fd >= 0 ? ::fchmod(fd, attr.st_mode) : ::chmod(path.c_str(), attr.st_mode);
    if (rc != 0) return failed();
  }
  if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
    uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr.st_uid : static_cast<uid_t>(-1);
    gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr.st_gid : static_cast<gid_t>(-1);
    int rc = fd >= 0 ? ::fchown(fd, uid, gid)
                     : ::fchownat(inode.fd(), "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
    if (rc != 0) return failed();
  }
  if (to_set & FUSE_SET_ATTR_SIZE) {
    int rc = fd >= 0 ? ::ftruncate(fd, attr.st_size) : ::truncate(path.c_str(), attr.st_size);
    if (rc != 0) return failed();
  }
  if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
    struct timespec times[2];
    times[0].tv_nsec = UTIME_OMIT;
    times[1].tv_nsec = UTIME_OMIT;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
      times[0].tv_nsec = UTIME_NOW;
    } else if (to_set & FUSE_SET_ATTR_ATIME) {
      times[0] = attr.st_atim;
    }
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
      times[1].tv_nsec = UTIME_NOW;
    } else if (to_set & FUSE_SET_ATTR_MTIME) {
      times[1] = attr.st_mtim;
    }
    int rc = fd >= 0 ? ::futimens(fd, times) : ::utimensat(AT_FDCWD, path.c_str(), times, 0);
    if (rc != 0) return failed();
  }
  return 0;
}

int64_t nanoseconds(const struct timespec& t) { return t.tv_sec * 1000000000LL + t.tv_nsec; }

// With the writeback cache the kernel stamps a file's mtime and ctime itself and hands them
// back in a times-only SETATTR on close, fsync, rename, link and unlink. The target stamped
// its own mtime when the writes reached it, as for an application writing to it directly, and
// keeps ctime itself: such a request is answered from the target's attributes without
// changing them (on NFS no SETATTR per file written, and a writer who does not own the file
// is not refused setting times only an owner may set). Recognised as: a regular file, times
// only, no atime and no "now", and either no mtime (ctime alone), or a file handle (only the
// kernel's own write-back of times carries one; utimes and futimens never do), or the mtime
// the file has, or the kernel's own one seen earlier (handed back with a handle, or set on
// the target through the mount). Any other time reaches the target.
constexpr int kBeyondTimes =
    FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID | FUSE_SET_ATTR_SIZE;
constexpr int kNotTheKernels =
    kBeyondTimes | FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW;

bool may_be_kernels_times(const Engine& engine, const Inode& inode, int to_set) {
  return engine.writeback_cache() && inode.is_regular() && (to_set & kNotTheKernels) == 0;
}

// *target*: the file's attributes on the target (nullptr: not looked at, then an mtime must be
// the kernel's own one seen earlier).
bool kernels_own_times(Inode& inode, const struct stat& attr, int to_set, const fuse_file_info* fi,
                       const struct stat* target) {
  if (!(to_set & FUSE_SET_ATTR_MTIME)) return true;
  int64_t mtime = nanoseconds(attr.st_mtim);
  if (fi != nullptr) {
    inode.set_kernel_mtime(mtime);
    return true;
  }
  return mtime == inode.kernel_mtime() || (target != nullptr && mtime == nanoseconds(target->st_mtim));
}

// The reply to the kernel's own times of a regular file it caches: the kernel keeps its own
// size and times then (fuse_get_cache_mask) and nothing of the reply matters beyond it, so it
// comes from the target client's cache (AT_STATX_DONT_SYNC). On NFS a stat of a file just
// written or renamed is a GETATTR (after a flush of the client's dirty pages), one per file an
// rsync writes. The reply gets no time to live: the kernel asks again before it shows any of
// it or checks a permission with it. 0 or the errno.
int kernels_part(int fd, struct stat* st) {
  constexpr unsigned kWanted =
      STATX_TYPE | STATX_MODE | STATX_NLINK | STATX_UID | STATX_GID | STATX_INO;
  struct statx sx {};
  constexpr int kFlags = AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC;
  if (::statx(fd, "", kFlags, kWanted, &sx) != 0) return failed();
  if ((sx.stx_mask & kWanted) != kWanted) return EOPNOTSUPP;
  *st = {};
  st->st_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  st->st_ino = sx.stx_ino;
  st->st_mode = sx.stx_mode;
  st->st_nlink = sx.stx_nlink;
  st->st_uid = sx.stx_uid;
  st->st_gid = sx.stx_gid;
  st->st_rdev = makedev(sx.stx_rdev_major, sx.stx_rdev_minor);
  st->st_size = static_cast<off_t>(sx.stx_size);
  st->st_blksize = sx.stx_blksize;
  st->st_blocks = static_cast<blkcnt_t>(sx.stx_blocks);
  st->st_atim = {sx.stx_atime.tv_sec, sx.stx_atime.tv_nsec};
  st->st_mtim = {sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec};
  st->st_ctim = {sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec};
  return 0;
}

void op_setattr(fuse_req_t req, fuse_ino_t node, struct stat* attr, int to_set, fuse_file_info* fi) {
  Inode& inode = inode_of(req, node);
  Using use(inode.shared_from_this());  // (with a handle, only the handle's descriptor is used)
  if (fi == nullptr && !use) {
    // The writeback cache hands back a removed file's times when it evicts it (once per file
    // of an rm -rf, and at syncfs): nobody can see them any more.
    if ((to_set & kBeyondTimes) == 0)
      return (void)answer(fuse_reply_attr, req, &inode.removed(), engine_of(req).options().attr_timeout);
    return (void)answer(fuse_reply_err, req, ENOENT);
  }
  if (may_be_kernels_times(engine_of(req), inode, to_set)) {
    int fd = fi != nullptr ? borrow<OpenFile>(fi).fd.get() : inode.fd();
    struct stat kept {};
    if (kernels_own_times(inode, *attr, to_set, fi, nullptr) && kernels_part(fd, &kept) == 0)
      return (void)answer(fuse_reply_attr, req, &kept, 0.0);
    struct stat now {};
    int err = fi != nullptr ? (::fstat(fd, &now) == 0 ? 0 : failed()) : stat_inode(inode, &now);
    if (err == 0 && kernels_own_times(inode, *attr, to_set, fi, &now))
      return (void)answer(fuse_reply_attr, req, &now, engine_of(req).options().attr_timeout);
  }
  struct stat now {};
  {
    KernelView::Change change(inode.view);
    int err = set_attributes(inode, *attr, to_set, fi);
    if (err == EPERM && as_caller() && !engine_of(req).options().target_decides) {
      // A setattr reaches the engine only past the kernel's own checks (default_permissions),
      // or from the kernel itself: with the writeback cache a touch by anyone who may write
      // the file arrives as explicit times (the kernel's clock for the mtime), which the
      // target lets only the owner set. The kernel allowed it: the daemon makes it.
      stop_being_caller();
      err = set_attributes(inode, *attr, to_set, fi);
      if (int back = become_caller(); back != 0) err = back;  // (the rest only stats)
    }
    if (err) return (void)answer(fuse_reply_err, req, err);
    // The writeback cache keeps the mtime it sent and hands it back after a rename or at the
    // file's eviction: known, that hand-back needs no stat of the target (rsync's utimes of
    // each file it writes, then its rename: a GETATTR per file on NFS).
    if ((to_set & FUSE_SET_ATTR_MTIME) && !(to_set & FUSE_SET_ATTR_MTIME_NOW) &&
        engine_of(req).writeback_cache() && inode.is_regular())
      inode.set_kernel_mtime(nanoseconds(attr->st_mtim));
    // Truncated to nothing: what was written needs no sync any more.
    if ((to_set & FUSE_SET_ATTR_SIZE) && attr->st_size == 0) engine_of(req).window().discard(inode);
    err = fi != nullptr ? (::fstat(borrow<OpenFile>(fi).fd.get(), &now) == 0 ? 0 : failed())
                        : stat_inode(inode, &now);
    if (err) return (void)answer(fuse_reply_err, req, err);
    inode.view.set(now, (to_set & FUSE_SET_ATTR_SIZE) != 0, change);
  }
  answer(fuse_reply_attr, req, &now, engine_of(req).options().attr_timeout);
}

// access(2) and chdir with permissions=target (the kernel asks only then): the target's
// answer to the caller (AT_EACCESS: with the file-system ids the thread runs as).
void op_access(fuse_req_t req, fuse_ino_t node, int mask) {
  Using use(engine_of(req).inodes().share(node));
  if (let_go_of(req, use)) return;
  std::string path = proc_path(inode_of(req, node).fd());
  int rc = ::faccessat(AT_FDCWD, path.c_str(), mask, AT_EACCESS);
  answer(fuse_reply_err, req, rc == 0 ? 0 : failed());
}

void op_readlink(fuse_req_t req, fuse_ino_t node) {
  Using use(engine_of(req).inodes().share(node));
  if (let_go_of(req, use)) return;
  std::vector<char> target(PATH_MAX + 1);
  ssize_t n = ::readlinkat(inode_of(req, node).fd(), "", target.data(), target.size());
  if (n < 0) return (void)answer(fuse_reply_err, req, failed());
  if (static_cast<size_t>(n) >= target.size()) return (void)answer(fuse_reply_err, req, ENAMETOOLONG);
  target[static_cast<size_t>(n)] = '\0';
  answer(fuse_reply_readlink, req, target.data());
}

void op_statfs(fuse_req_t req, fuse_ino_t node) {
  struct statvfs st {};
  Using use(engine_of(req).inodes().share(node));  // a removed file's: the file system's of the root
  int fd = use ? inode_of(req, node).fd() : engine_of(req).inodes().root().fd();
  if (::fstatvfs(fd, &st) != 0) return (void)answer(fuse_reply_err, req, failed());
  answer(fuse_reply_statfs, req, &st);
}

// --- extended attributes: through /proc (an O_PATH descriptor takes none) ---------------------

void op_setxattr(fuse_req_t req, fuse_ino_t node, const char* name, const char* value, size_t size,
                 int flags) {
  Inode& inode = inode_of(req, node);
  Using use(inode.shared_from_this());
  if (let_go_of(req, use)) return;
  if (inode.is_symlink()) return (void)answer(fuse_reply_err, req, EOPNOTSUPP);
  int rc = ::setxattr(proc_path(inode.fd()).c_str(), name, value, size, flags);
  answer(fuse_reply_err, req, rc == 0 ? 0 : failed());
}

void op_getxattr(fuse_req_t req, fuse_ino_t node, const char* name, size_t size) {
  Inode& inode = inode_of(req, node);
  Using use(inode.shared_from_this());
  if (let_go_of(req, use)) return;
  if (inode.is_symlink()) return (void)answer(fuse_reply_err, req, ENODATA);
  std::string path = proc_path(inode.fd());
  if (size == 0) {
    ssize_t n = ::getxattr(path.c_str(), name, nullptr, 0);
    if (n < 0) return (void)answer(fuse_reply_err, req, failed());
    return (void)answer(fuse_reply_xattr, req, static_cast<size_t>(n));
  }
  std::vector<char> value(size);
  ssize_t n = ::getxattr(path.c_str(), name, value.data(), size);
  if (n < 0) return (void)answer(fuse_reply_err, req, failed());
  answer(fuse_reply_buf, req, value.data(), static_cast<size_t>(n));
}

void op_listxattr(fuse_req_t req, fuse_ino_t node, size_t size) {
  Inode& inode = inode_of(req, node);
  Using use(inode.shared_from_this());
  if (let_go_of(req, use)) return;
  if (inode.is_symlink()) {
    if (size == 0) return (void)answer(fuse_reply_xattr, req, 0);
    return (void)answer(fuse_reply_buf, req, nullptr, 0);
  }
  std::string path = proc_path(inode.fd());
  if (size == 0) {
    ssize_t n = ::listxattr(path.c_str(), nullptr, 0);
    if (n < 0) return (void)answer(fuse_reply_err, req, failed());
    return (void)answer(fuse_reply_xattr, req, static_cast<size_t>(n));
  }
  std::vector<char> names(size);
  ssize_t n = ::listxattr(path.c_str(), names.data(), size);
  if (n < 0) return (void)answer(fuse_reply_err, req, failed());
  answer(fuse_reply_buf, req, names.data(), static_cast<size_t>(n));
}

void op_removexattr(fuse_req_t req, fuse_ino_t node, const char* name) {
  Inode& inode = inode_of(req, node);
  Using use(inode.shared_from_this());
  if (let_go_of(req, use)) return;
  if (inode.is_symlink()) return (void)answer(fuse_reply_err, req, EOPNOTSUPP);
  int rc = ::removexattr(proc_path(inode.fd()).c_str(), name);
  answer(fuse_reply_err, req, rc == 0 ? 0 : failed());
}

// --- files ----------------------------------------------------------------------------------

void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Engine& engine = engine_of(req);
  int dir = inode_of(req, parent).fd();
  bool bypass = false;
  Fd fd = open_as_asked(
      engine, fi->flags | O_CREAT, [&](int flags) { return ::openat(dir, name, flags, mode); },
      &bypass);
  if (!fd) return (void)answer(fuse_reply_err, req, failed());
  fuse_entry_param entry;
  int err = look_up(engine, parent, name, &entry, Found::kMade);
  if (err) return (void)answer(fuse_reply_err, req, err);
  Passthrough::Way way;  // a created file's handle counts in the rule too (passthrough.h)
  if (int refused = engine.passthrough().open(req, entry.ino, fi->flags, fd.get(), fi, &way)) {
    forget_one(engine, entry.ino, 1);
    return (void)answer(fuse_reply_err, req, -refused);
  }
  note_writer(engine.inodes().get(entry.ino), fi->flags);
  auto inode = engine.inodes().share(entry.ino);
  // The file this open made: no lookup can have shown the kernel another one of it before.
  Window::Opening opening(engine.window(), inode);
  auto file = std::make_shared<OpenFile>(engine.handles(), engine.window(), inode);
  opening.kept();
  file->fd = std::move(fd);
  file->direct = (fi->flags & O_DIRECT) != 0;
  set_open_reply(fi, fi->flags, bypass);
  fi->fh = hand_over(std::move(file));
  engine.passthrough().opened(fi->fh, entry.ino, way);
  if (!answer_entry(fuse_reply_create, req, entry, fi)) {
    engine.passthrough().released(fi->fh);
    take_back<OpenFile>(fi);  // the caller is gone: nobody will release it
  }
}

// An open (*flags*) of a file the kernel caches found it changed on the target by another
// writer since the kernel was shown it, and nobody else has it open through the mount (a
// handle its process just closed is waited for: its RELEASE may be on its way).
bool changed_elsewhere(Window& window, Inode& inode, int fd, int flags, uint64_t since) {
  if (flags & O_TRUNC) {
    inode.view.truncated();  // the kernel knows the size it made
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  KernelView::AtOpen at = window.at_open(inode, st, since, kReleaseWait);
  return at.changed && at.alone;
}

void op_open(fuse_req_t req, fuse_ino_t node, fuse_file_info* fi) {
  Engine& engine = engine_of(req);
  Using use(engine_of(req).inodes().share(node));
  if (let_go_of(req, use)) return;
  std::string path = proc_path(inode_of(req, node).fd());
  bool viewed = view_of(engine, inode_of(req, node)) != nullptr;
  uint64_t since = KernelView::now();
  // Counted from before the target's open (a lookup meanwhile must not drop the inode this
  // open is for); every failure below undoes it as it returns.
  auto inode = engine.inodes().share(node);
  Window::Opening opening(engine.window(), inode);
  auto fail = [&](int err) {
    opening.undo();  // before the answer: the kernel's next lookup must not see it counted
    answer(fuse_reply_err, req, err);
  };
  bool bypass = false;
  Fd fd = open_as_asked(
      engine, fi->flags & ~O_CREAT, [&](int flags) { return ::open(path.c_str(), flags); },
      &bypass);
  if (!fd) return fail(failed());
  if (viewed && changed_elsewhere(engine.window(), *inode, fd.get(), fi->flags, since)) {
    // Close-to-open, as NFS itself: the file changed on the target since the kernel was shown
    // it, and the kernel keeps its own size of it. ESTALE makes it look the name up again and
    // retry the open; that lookup hands it a new generation with the target's size.
    this_call().node = 0;  // (not the target's ESTALE: nothing is stale)
    return fail(ESTALE);
  }
  Passthrough::Way way;  // the kernel reads it, or the engine (passthrough.h: the rule)
  if (int err = engine.passthrough().open(req, node, fi->flags, fd.get(), fi, &way); err != 0)
    return fail(-err);
  note_writer(*inode, fi->flags);
  auto file = std::make_shared<OpenFile>(engine.handles(), engine.window(), inode);
  opening.kept();
  file->fd = std::move(fd);
  file->direct = (fi->flags & O_DIRECT) != 0;
  set_open_reply(fi, fi->flags, bypass);
  fi->fh = hand_over(std::move(file));
  engine.passthrough().opened(fi->fh, node, way);
  if (answer(fuse_reply_open, req, fi) != 0) {  // the caller is gone
    engine.passthrough().released(fi->fh);
    take_back<OpenFile>(fi);
  }
}

void read_direct(fuse_req_t req, int fd, size_t size, off_t off) {
  char* buf = aligned_buffer(size);
  if (buf == nullptr) return (void)answer(fuse_reply_err, req, ENOMEM);
  ssize_t n = ::pread(fd, buf, size, off);
  if (n < 0) return (void)answer(fuse_reply_err, req, failed());
  moved(static_cast<uint64_t>(n));
  answer(fuse_reply_buf, req, buf, static_cast<size_t>(n));
}

// What a read of *size* at *off* moves: up to the end of the file as the target's client
// holds it (the splice that answers it does not say; no request to the server).
uint64_t read_size(int fd, size_t size, off_t off) {
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_SIZE, &sx) != 0) return size;
  if (static_cast<uint64_t>(off) >= sx.stx_size) return 0;
  return std::min<uint64_t>(size, sx.stx_size - static_cast<uint64_t>(off));
}

void op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  engine_of(req).pay(FT_OP_READ, size);
  borrow<OpenFile>(fi).used();
  if (borrow<OpenFile>(fi).direct) return read_direct(req, borrow<OpenFile>(fi).fd.get(), size, off);
  fuse_bufvec data = FUSE_BUFVEC_INIT(size);
  data.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
  data.buf[0].fd = borrow<OpenFile>(fi).fd.get();
  data.buf[0].pos = off;
  moved(read_size(data.buf[0].fd, size, off));
  answer(fuse_reply_data, req, &data, FUSE_BUF_SPLICE_MOVE);
}

// Write *in* at *off*: 0 and *n* bytes written, or the errno.
int write_direct(int fd, fuse_bufvec* in, off_t off, ssize_t* n) {
  size_t size = fuse_buf_size(in);
  char* buf = aligned_buffer(size);
  if (buf == nullptr) return ENOMEM;
  fuse_bufvec staged = FUSE_BUFVEC_INIT(size);
  staged.buf[0].mem = buf;
  ssize_t copied = fuse_buf_copy(&staged, in, static_cast<fuse_buf_copy_flags>(0));
  if (copied < 0) return static_cast<int>(-copied);
  ssize_t done = 0;
  while (done < copied) {  // the rest of a short write, as write_through
    ssize_t got = ::pwrite(fd, buf + done, static_cast<size_t>(copied - done), off + done);
    if (got <= 0) {
      *n = done;
      return got < 0 ? failed() : EIO;
    }
    done += got;
  }
  *n = done;
  return 0;
}

int write_through(int fd, fuse_bufvec* in, off_t off, ssize_t* n);

// Offsets and lengths of an O_DIRECT write to the target: the page size (what the writeback
// cache hands over, and enough for any device's logical block).
constexpr off_t kDirectAlign = 4096;

// The handle's descriptor for O_DIRECT writes, opened at its first use as the file's writer;
// -1 where there is none (EINVAL: no direct I/O on the target; EACCES, EPERM: the file is
// writable only through the descriptor its creator got, as tar's read-only members).
int uncached_descriptor(OpenFile& file, const Inode& inode) {
  std::lock_guard<std::mutex> guard(file.uncached_lock);
  if (!file.uncached_tried) {
    file.uncached_tried = true;
    int error = 0;
    file.uncached = open_as(inode.fd(), inode.writer(), O_WRONLY | O_DIRECT | O_CLOEXEC, &error);
  }
  return file.uncached.get();
}

// Write *in* at *off* leaving none of it in the target's page cache (target_io=direct, or
// auto where the daemon shares its memory cgroup: there an application's reclaim that meets
// the target's pages under write-back waits for them, seconds behind a slow target). Whole
// pages go through O_DIRECT and make no page at all; the rest (a file's last partial page, an
// unaligned write without the writeback cache, a target without direct I/O) is written
// through the cache, written back and waited for, then dropped.
int write_uncached(OpenFile& file, const Inode& inode, fuse_bufvec* in, off_t off, ssize_t* n) {
  auto size = static_cast<off_t>(fuse_buf_size(in));
  if (size > 0 && off % kDirectAlign == 0 && size % kDirectAlign == 0) {
    int direct = uncached_descriptor(file, inode);
    if (direct >= 0) return write_direct(direct, in, off, n);
  }
  int fd = file.fd.get();
  int err = write_through(fd, in, off, n);
  if (*n > 0) {  // what landed, the part before a failure too
    // Its wait is the one report of a failed write-back (write_back_range): the write's error.
    if (int failed = write_back_range(fd, off, *n, kWriteBackAndWait); failed != 0 && err == 0) err = failed;
    // Whole pages: the kernel keeps a partly covered one (clean now all the same).
    off_t first = off - off % kDirectAlign;
    off_t end = (off + *n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    ::posix_fadvise(fd, first, end - first, POSIX_FADV_DONTNEED);
  }
  return err;
}

// A target that takes only part of a write (a nearly full one) is asked for the rest until
// it says why not: the kernel takes the answer to its write-back as all or nothing, so a short
// count would acknowledge pages the target never got. *n*: what landed, error or not.
int write_through(int fd, fuse_bufvec* in, off_t off, ssize_t* n) {
  size_t size = fuse_buf_size(in);
  size_t done = 0;
  while (done < size) {
    fuse_bufvec out = FUSE_BUFVEC_INIT(size - done);
    out.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    out.buf[0].fd = fd;
    out.buf[0].pos = off + static_cast<off_t>(done);
    // It carries on from where the last copy stopped in *in*.
    ssize_t got = fuse_buf_copy(&out, in, static_cast<fuse_buf_copy_flags>(0));
    if (got <= 0) {
      *n = static_cast<ssize_t>(done);
      return got < 0 ? static_cast<int>(-got) : EIO;
    }
    done += static_cast<size_t>(got);
  }
  *n = static_cast<ssize_t>(done);
  return 0;
}

// A failed injected sync's errno, handed to the application once, through the handle's *fd*.
// The target keeps its own record of that failure for this descriptor (errseq: it was open
// before the failed sync), so the application's next fsync would hear of it a second time:
// an fdatasync here consumes that record (what it reports is the same failure, or one after
// it that this report covers, as the kernel's errseq would).
int report_pending(Window& window, Inode& inode, int fd) {
  int error = window.take_error(inode);
  if (error != 0) ::fdatasync(fd);
  return error;
}

void op_write_buf(fuse_req_t req, fuse_ino_t node, fuse_bufvec* in, off_t off, fuse_file_info* fi) {
  Engine& engine = engine_of(req);
  // A caller's own write (every write without the writeback cache; with it, those that pass
  // it by: O_DIRECT, a handle opened past the cache) is told of a failed injected sync of its
  // file. The kernel's write-back of its cache (fi->writepage: the writeback cache's pages and
  // a shared mapping's) writes pages already acknowledged: always taken (an error would drop
  // them; the stop's own write-back sends them, see Counted), the error goes to fsync and close.
  if (!fi->writepage) {
    int pending = report_pending(engine.window(), inode_of(req, node), borrow<OpenFile>(fi).fd.get());
    if (pending != 0) return (void)answer(fuse_reply_err, req, pending);
  }
  // The back-pressure: the reply waits until the bytes fit in the window.
  size_t size = fuse_buf_size(in);
  engine.pay(FT_OP_WRITE, size);
  // A caller killed while its write waits here was answered EINTR: its bytes are nobody's.
  Call& call = this_call();
  if (!engine.window().admit(size, [&call, req] { return call.unanswered.load() != req; })) {
    return (void)answer(fuse_reply_err, req, EINTR);
  }
  Window::Reservation reserved(engine.window(), size);
  OpenFile& file = borrow<OpenFile>(fi);
  file.used();
  ssize_t n = 0;
  int err;
  {
    Inode& inode = inode_of(req, node);
    KernelView& view = inode.view;
    KernelView::Change change(view);
    if (file.direct) {
      err = write_direct(file.fd.get(), in, off, &n);
    } else if (engine.options().uncached) {
      err = write_uncached(file, inode, in, off, &n);
    } else {
      err = write_through(file.fd.get(), in, off, &n);
    }
    if (!err) view.wrote_to(off + n);
  }
  // What landed owes the target a sync, the part before a failure too.
  std::shared_ptr<Inode> written_to = engine.inodes().share(node);
  engine.window().landed(written_to, reserved.take(), n, off);
  if (err) {
    engine.events().lost(node, inode_of(req, node).fd(), err);
    return (void)answer(fuse_reply_err, req, err);
  }
  moved(static_cast<uint64_t>(n));
  answer(fuse_reply_write, req, static_cast<size_t>(n));
}

void op_flush(fuse_req_t req, fuse_ino_t node, fuse_file_info* fi) {
  // Closing a duplicate makes NFS write back and report errors, as close(2) would, and keeps
  // the descriptor the kernel releases later. A failed injected sync is reported here too.
  int fd = borrow<OpenFile>(fi).fd.get();
  uint64_t since = KernelView::now();
  int dup = ::dup(fd);
  if (dup < 0) return (void)answer(fuse_reply_err, req, failed());
  int err = ::close(dup) == 0 ? 0 : failed();
  if (KernelView* view = view_of(engine_of(req), inode_of(req, node)); view && view->mtime_unknown()) {
    // Every page the kernel cached of it reached the target before this flush: learn the
    // mtime our writes left, so that a later change by another writer that keeps the size is
    // still told apart. From the target client's cache (a GETATTR per file written on NFS
    // otherwise); a stale one only renews the file in the kernel once more than needed.
    struct statx sx {};
    if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_MTIME, &sx) == 0)
      view->learn_mtime(sx.stx_mtime.tv_sec * 1000000000LL + sx.stx_mtime.tv_nsec, since);
  }
  int pending = report_pending(engine_of(req).window(), inode_of(req, node), fd);
  borrow<OpenFile>(fi).flushed();  // before the process's next request: its removal, an open
  answer(fuse_reply_err, req, err != 0 ? err : pending);
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  // The last close of a dirty file makes it due for a sync, through this descriptor: the
  // window takes it once no handler still uses it (handles.h).
  engine_of(req).passthrough().released(fi->fh);
  take_back<OpenFile>(fi);
  answer(fuse_reply_err, req, 0);
}

void op_fsync(fuse_req_t req, fuse_ino_t node, int datasync, fuse_file_info* fi) {
  Window& window = engine_of(req).window();
  Inode& inode = inode_of(req, node);
  uint64_t bytes = window.begin_app_sync(inode);
  borrow<OpenFile>(fi).used();
  int fd = borrow<OpenFile>(fi).fd.get();
  double start = now_seconds();
  int rc = datasync ? ::fdatasync(fd) : ::fsync(fd);
  int err = rc == 0 ? 0 : failed();
  window.end_app_sync(inode, bytes, err);  // either way the application knows now
  ft_engine_event event{};
  event.kind = FT_EVENT_SYNC;
  event.reason = static_cast<uint32_t>(SyncReason::kApplication);
  event.error = err;
  event.node = node;
  event.bytes = bytes;
  event.at = now_seconds();
  event.seconds = event.at - start;
  engine_of(req).events().push(event);
  if (err != 0) engine_of(req).events().lost(node, inode.fd(), err);
  int pending = window.take_error(inode);
  answer(fuse_reply_err, req, err != 0 ? err : pending);
}

void op_fallocate(fuse_req_t req, fuse_ino_t node, int mode, off_t off, off_t length,
                  fuse_file_info* fi) {
  int err;
  {
    KernelView& view = inode_of(req, node).view;
    KernelView::Change change(view);
    err = ::fallocate(borrow<OpenFile>(fi).fd.get(), mode, off, length) == 0 ? 0 : failed();
    view.forget_facts();
  }
  // It owes the file a sync but holds no page: counted as one byte.
  if (err == 0) engine_of(req).window().landed(engine_of(req).inodes().share(node), 0, 1, off);
  answer(fuse_reply_err, req, err);
}

// --- directories ------------------------------------------------------------------------------

void op_opendir(fuse_req_t req, fuse_ino_t node, fuse_file_info* fi) {
  // Through /proc: "." would need search permission on the directory, which reading its
  // entries does not (a directory of mode 0600 lists for its owner).
  std::string path = proc_path(inode_of(req, node).fd());
  Fd fd = open_with_room(engine_of(req),
                         [&] { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
  if (!fd) return (void)answer(fuse_reply_err, req, failed());
  auto dir = std::make_shared<OpenDir>(engine_of(req).handles());
  dir->dir.reset(::fdopendir(fd.get()));
  if (!dir->dir) return (void)answer(fuse_reply_err, req, failed());
  fd.release();  // the DIR owns it now
  fi->fh = hand_over(std::move(dir));
  if (answer(fuse_reply_open, req, fi) != 0) take_back<OpenDir>(fi);
}


// One entry of a READDIRPLUS: its attributes and a counted lookup (the kernel takes the entry
// as a LOOKUP's answer), or none where the name cannot be looked up as the caller (gone
// meanwhile, no search permission): the kernel then treats it as a plain entry.
size_t add_entry_plus(fuse_req_t req, fuse_ino_t parent, char* buf, size_t room,
                      const struct dirent& entry, off_t next, std::vector<fuse_ino_t>& counted) {
  size_t need = fuse_add_direntry_plus(req, nullptr, 0, entry.d_name, nullptr, next);
  if (need > room) return need;
  fuse_entry_param found{};
  if (!dot_or_dotdot(entry.d_name) && look_up(engine_of(req), parent, entry.d_name, &found) == 0) {
    counted.push_back(found.ino);
  } else {
    found = fuse_entry_param{};
    found.attr.st_ino = entry.d_ino;
    found.attr.st_mode = static_cast<mode_t>(DTTOIF(entry.d_type));
  }
  return fuse_add_direntry_plus(req, buf, room, entry.d_name, &found, next);
}

// READDIR and READDIRPLUS: entries from where the stream stands, as many as fit in *size*.
void serve_dir(fuse_req_t req, fuse_ino_t node, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  OpenDir& dir = borrow<OpenDir>(fi);
  if (off != dir.offset) {
    ::seekdir(dir.dir.get(), off);
    dir.pending = nullptr;
    dir.offset = off;
  }
  std::vector<fuse_ino_t> counted;  // lookups handed out with the entries
  std::vector<char> buf(size);
  size_t used = 0;
  for (;;) {
    struct dirent* entry = dir.pending;
    if (entry == nullptr) {
      errno = 0;
      entry = ::readdir(dir.dir.get());
      if (entry == nullptr) {
        if (errno != 0 && used == 0) return (void)answer(fuse_reply_err, req, errno);
        break;
      }
    }
    off_t next = ::telldir(dir.dir.get());
    size_t need;
    if (plus) {
      need = add_entry_plus(req, node, buf.data() + used, size - used, *entry, next, counted);
    } else {
      struct stat st {};
      st.st_ino = entry->d_ino;
      st.st_mode = static_cast<mode_t>(DTTOIF(entry->d_type));
      need = fuse_add_direntry(req, buf.data() + used, size - used, entry->d_name, &st, next);
    }
    if (need > size - used) {
      dir.pending = entry;  // the next call starts with it
      break;
    }
    used += need;
    dir.pending = nullptr;
    dir.offset = next;
  }
  if (answer(fuse_reply_buf, req, buf.data(), used) != 0) {
    // Nobody took the entries (the caller was interrupted): nor their lookups.
    for (fuse_ino_t found : counted) forget_one(engine_of(req), found, 1);
  }
}

void op_readdir(fuse_req_t req, fuse_ino_t node, size_t size, off_t off, fuse_file_info* fi) {
  serve_dir(req, node, size, off, fi, false);
}

// The kernel asks for it (READDIRPLUS_AUTO) when a listing is followed by a stat of each
// entry, as in ls -l and rsync: one request where a LOOKUP per entry would follow.
void op_readdirplus(fuse_req_t req, fuse_ino_t node, size_t size, off_t off, fuse_file_info* fi) {
  serve_dir(req, node, size, off, fi, true);
}

void op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  take_back<OpenDir>(fi);
  answer(fuse_reply_err, req, 0);
}

void op_fsyncdir(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) {
  int fd = ::dirfd(borrow<OpenDir>(fi).dir.get());
  int rc = datasync ? ::fdatasync(fd) : ::fsync(fd);
  answer(fuse_reply_err, req, rc == 0 ? 0 : failed());
}

// What a request works on, held while its handler runs (Call::held): its handle (an open
// file's or directory's; none yet for the opens) and its nodes.
// (The handlers' argument is a fuse_file_info*, not const: an overload for const would lose
// to the template.)
template <typename T>
void hold_handle(Call&, const T&) {}
inline void hold_handle(Call& call, fuse_file_info* fi) {
  if (fi != nullptr) call.held[0] = hold(fi);
}
inline void hold_node(Call& call, size_t at, fuse_ino_t node) {
  if (node != 0) call.held[at] = call.engine->inodes().share(node);
}

// The kernel's write-back of its cache (a WRITE with fi->writepage): no caller waits for it,
// so it is never interrupted, and the kernel holds its file and inode until it is answered.
template <typename T>
bool written_back(const T&) {
  return false;
}
inline bool written_back(fuse_file_info* fi) { return fi != nullptr && fi->writepage; }

// The first node id among a request's arguments (see Call::node).
inline void first_node(fuse_ino_t& node, fuse_ino_t arg) {
  if (node == 0) node = arg;
}
template <typename T>
void first_node(fuse_ino_t&, const T&) {}

// A handler threw (out of memory, most likely): the request is answered (ENOMEM, or EIO for
// anything else) rather than left to std::terminate, which would end the daemon with every
// caller and every acknowledged write with it; one line says what happened.
template <ft_engine_op Op>
void answer_thrown(fuse_req_t req, const char* what, int error) {
  std::fprintf(stderr, "fusethrottle engine: request kind %d failed inside the engine: %s\n",
               static_cast<int>(Op), what);
  if constexpr (Op == FT_OP_FORGET) {
    if (this_call().claim(req)) fuse_reply_none(req);
  } else {
    answer(fuse_reply_err, req, error);
  }
}

// Every request is counted by kind before its handler runs, and its thread is the daemon's
// again after it: the one place all of them pass.
template <ft_engine_op Op, auto Handler>
struct Counted;
template <ft_engine_op Op, typename... Args, void (*Handler)(fuse_req_t, Args...)>
struct Counted<Op, Handler> {
  // No caller waits for forget and release (nor for the kernel's write-back, see
  // written_back).
  static constexpr bool kInterruptible =
      Op != FT_OP_FORGET && Op != FT_OP_RELEASE && Op != FT_OP_RELEASEDIR;
  // Once the mount is closing (Engine::close_the_cache) nothing new is taken, decided here
  // for every request: each is answered ENOTCONN, from the engine alone (no call to the
  // target, which may hang), but the closing of what is open or known (flush, fsync, release,
  // forget), which callers and the kernel must still get through, and the kernel's write-back
  // of its cache (written_back), which the stop's own write-back sends.
  static constexpr bool kClosing = Op == FT_OP_FORGET || Op == FT_OP_FLUSH || Op == FT_OP_FSYNC ||
                                   Op == FT_OP_RELEASE || Op == FT_OP_RELEASEDIR ||
                                   Op == FT_OP_FSYNCDIR;
  // The opens' file_info carries no handle yet: their handlers make it.
  static constexpr bool kOnHandle =
      Op != FT_OP_OPEN && Op != FT_OP_CREATE && Op != FT_OP_OPENDIR;
  // What works on a handle already open, or on nothing of the caller's, runs as the daemon.
  static constexpr bool kAsCaller = Op != FT_OP_FORGET && Op != FT_OP_READ && Op != FT_OP_FLUSH &&
                                    Op != FT_OP_RELEASE && Op != FT_OP_FSYNC && Op != FT_OP_READDIR &&
                                    Op != FT_OP_RELEASEDIR && Op != FT_OP_FSYNCDIR;

  static void serve(fuse_req_t req, Args... args) {
    Call& call = this_call();
    call.engine = static_cast<Engine*>(fuse_req_userdata(req));
    const fuse_ctx* ctx = fuse_req_ctx(req);
    call.uid = ctx->uid;
    call.gid = ctx->gid;
    call.pid.store(ctx->pid);
    call.unanswered.store(req);
    call.node = 0;
    call.bytes = 0;
    call.error = 0;
    if constexpr (Op != FT_OP_FORGET) (first_node(call.node, args), ...);
    call.engine->count(Op);
    bool kernels_write_back = false;
    if constexpr (Op == FT_OP_WRITE) kernels_write_back = (written_back(args) || ...);
    if (!kClosing && !kernels_write_back && call.engine->closing()) {
      answer(fuse_reply_err, req, ENOTCONN);
      call.engine->meter().record(Op, 0, call.error);
      return;
    }
    if (kInterruptible && !kernels_write_back) {
      if constexpr (kOnHandle) (hold_handle(call, args), ...);
      hold_node(call, 1, call.node);
      // The other directory of a rename or link (its new parent).
      if constexpr (Op == FT_OP_RENAME) hold_node(call, 2, std::get<2>(std::tie(args...)));
      if constexpr (Op == FT_OP_LINK) hold_node(call, 2, std::get<1>(std::tie(args...)));
      test_delay_interrupt_registration(Op, req);
      // Called at once, on this thread, if the interrupt came first: it only marks the call
      // then, and the request is answered here, once libfuse let go of it (call.h).
      call.interrupted_early = false;
      fuse_req_interrupt_func(req, on_interrupt, &call);
      if (call.interrupted_early) interrupted(call, req);
      if (call.unanswered.load() != req) return call.let_go_of_held();
    }
    // Reads and writes pay for their size in their handlers.
    if constexpr (Op != FT_OP_READ && Op != FT_OP_WRITE) call.engine->pay(Op, 0);
    // A caller's request runs with its ids and groups or not at all: a switch that failed
    // answers it before its handler runs (caller.h). A caller's own write reaches the target
    // as that caller, so the target removes set-ID bits and the file capability as it would
    // for them (see session_io.h); the kernel's write-back of its cache has no caller.
    int refused_switch = 0;
    if constexpr (kAsCaller) {
      if (!kernels_write_back) refused_switch = become_caller();
    }
    try {
      if (refused_switch != 0) {
        answer(fuse_reply_err, req, refused_switch);
      } else {
        Handler(req, args...);
      }
    } catch (const std::bad_alloc& e) {
      answer_thrown<Op>(req, e.what(), ENOMEM);
    } catch (const std::exception& e) {
      answer_thrown<Op>(req, e.what(), EIO);
    }
    // Metered once it was sent to the target, failed or not: the one hook of the meter.
    call.engine->meter().record(Op, call.bytes, call.error);
    stop_being_caller();
    // An interrupted request's handler, done now: the last holder of a released handle lets
    // the window have its descriptor (handles.h).
    if (kInterruptible && !kernels_write_back) call.let_go_of_held();
  }
};

fuse_lowlevel_ops make_operations(bool xattrs, bool target_decides) {
  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.lookup = Counted<FT_OP_LOOKUP, op_lookup>::serve;
  ops.forget = Counted<FT_OP_FORGET, op_forget>::serve;
  ops.forget_multi = Counted<FT_OP_FORGET, op_forget_multi>::serve;
  ops.getattr = Counted<FT_OP_GETATTR, op_getattr>::serve;
  ops.setattr = Counted<FT_OP_SETATTR, op_setattr>::serve;
  ops.readlink = Counted<FT_OP_READLINK, op_readlink>::serve;
  ops.mknod = Counted<FT_OP_MKNOD, op_mknod>::serve;
  ops.mkdir = Counted<FT_OP_MKDIR, op_mkdir>::serve;
  ops.unlink = Counted<FT_OP_UNLINK, op_unlink>::serve;
  ops.rmdir = Counted<FT_OP_RMDIR, op_rmdir>::serve;
  ops.symlink = Counted<FT_OP_SYMLINK, op_symlink>::serve;
  ops.rename = Counted<FT_OP_RENAME, op_rename>::serve;
  ops.link = Counted<FT_OP_LINK, op_link>::serve;
  ops.open = Counted<FT_OP_OPEN, op_open>::serve;
  ops.read = Counted<FT_OP_READ, op_read>::serve;
  ops.write_buf = Counted<FT_OP_WRITE, op_write_buf>::serve;
  ops.flush = Counted<FT_OP_FLUSH, op_flush>::serve;
  ops.release = Counted<FT_OP_RELEASE, op_release>::serve;
  ops.fsync = Counted<FT_OP_FSYNC, op_fsync>::serve;
  ops.opendir = Counted<FT_OP_OPENDIR, op_opendir>::serve;
  ops.readdir = Counted<FT_OP_READDIR, op_readdir>::serve;
  ops.readdirplus = Counted<FT_OP_READDIRPLUS, op_readdirplus>::serve;
  ops.releasedir = Counted<FT_OP_RELEASEDIR, op_releasedir>::serve;
  ops.fsyncdir = Counted<FT_OP_FSYNCDIR, op_fsyncdir>::serve;
  ops.statfs = Counted<FT_OP_STATFS, op_statfs>::serve;
  if (xattrs) {
    // Without them the kernel is answered ENOSYS once and asks no more (no getxattr of
    // security.capability before every write()), as a target without xattrs would want.
    ops.setxattr = Counted<FT_OP_SETXATTR, op_setxattr>::serve;
    ops.getxattr = Counted<FT_OP_GETXATTR, op_getxattr>::serve;
    ops.listxattr = Counted<FT_OP_LISTXATTR, op_listxattr>::serve;
    ops.removexattr = Counted<FT_OP_REMOVEXATTR, op_removexattr>::serve;
  }
  ops.create = Counted<FT_OP_CREATE, op_create>::serve;
  ops.fallocate = Counted<FT_OP_FALLOCATE, op_fallocate>::serve;
  // With default_permissions the kernel answers access(2) itself and never asks.
  if (target_decides) ops.access = Counted<FT_OP_ACCESS, op_access>::serve;
  // No lseek: with the writeback cache, data not yet written back would read as a hole
  // (ENXIO). The kernel answers SEEK_DATA/SEEK_HOLE itself. No
  // copy_file_range either: the kernel copies through read and write, each one metered.
  return ops;
}

}  // namespace

const fuse_lowlevel_ops& operations(bool xattrs, bool target_decides) {
  static const fuse_lowlevel_ops table[2][2] = {
      {make_operations(false, false), make_operations(false, true)},
      {make_operations(true, false), make_operations(true, true)},
  };
  return table[xattrs ? 1 : 0][target_decides ? 1 : 0];
}

}  // namespace ft
