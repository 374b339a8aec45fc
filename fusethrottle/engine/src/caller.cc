#include "caller.h"

#include "call.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace ft {
namespace {

std::atomic<bool> switching{false};

// Supplementary groups are read from /proc for a pid: a process's groups almost never change,
// so they are kept a second per thread rather than read on every request, for the last
// kGroupsKept callers the thread served: the kernel hands requests to threads in turn, so
// with 8 writers at once a thread that kept one caller's read /proc on nearly every request
// (a sixth of the daemon's samples in `files8`).
constexpr auto kGroupsTtl = std::chrono::seconds(1);
constexpr size_t kMaxGroups = 65536;
constexpr size_t kGroupsKept = 16;

struct CallerGroups {
  pid_t pid = 0;
  std::chrono::steady_clock::time_point read{};
  std::vector<gid_t> groups;
};

struct ThreadCaller {
  bool known = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::array<CallerGroups, kGroupsKept> kept{};
  std::vector<gid_t> applied;
  bool groups_applied = false;
};

thread_local ThreadCaller current;

// The supplementary groups of thread *tid*, from /proc (what fuse_req_getgroups reads, without
// the request, which an interrupt may have answered and freed).
std::vector<gid_t> read_groups(pid_t tid) {
  std::vector<gid_t> list;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task/%d/status", static_cast<int>(tid),
                static_cast<int>(tid));
  std::FILE* status = std::fopen(path, "re");
  if (status == nullptr) return list;
  char* line = nullptr;
  size_t size = 0;
  while (::getline(&line, &size, status) > 0) {
    if (std::strncmp(line, "Groups:", 7) != 0) continue;
    char* at = line + 7;
    for (;;) {
      char* end = nullptr;
      unsigned long gid = std::strtoul(at, &end, 10);
      if (end == at || list.size() >= kMaxGroups) break;
      list.push_back(static_cast<gid_t>(gid));
      at = end;
    }
    break;
  }
  std::free(line);
  std::fclose(status);
  return list;
}

// setfsuid and setfsgid answer the id the thread had, never an error: whether the kernel took
// the new one is asked again (-1 changes nothing).
bool set_fsuid(uid_t uid) {
  ::syscall(SYS_setfsuid, uid);
  return static_cast<uid_t>(::syscall(SYS_setfsuid, -1)) == uid;
}

bool set_fsgid(gid_t gid) {
  ::syscall(SYS_setfsgid, gid);
  return static_cast<gid_t>(::syscall(SYS_setfsgid, -1)) == gid;
}

}  // namespace

void set_switch_credentials(bool on) { switching.store(on); }

int become_caller() {
  if (!switching.load(std::memory_order_relaxed)) return 0;
  const Call& ctx = this_call();
  ThreadCaller& me = current;
  auto now = std::chrono::steady_clock::now();
  pid_t pid = ctx.pid.load(std::memory_order_relaxed);
  // This caller's entry, or else the one read longest ago.
  CallerGroups* entry = &me.kept[0];
  for (CallerGroups& it : me.kept) {
    if (it.pid == pid) {
      entry = &it;
      break;
    }
    if (it.read < entry->read) entry = &it;
  }
  if (entry->pid != pid || now - entry->read > kGroupsTtl) {
    entry->groups = pid > 0 ? read_groups(pid) : std::vector<gid_t>{};
    entry->pid = pid;
    entry->read = now;
  }
  const std::vector<gid_t>& groups = entry->groups;
  if (!me.groups_applied) {
    // What the thread has now (the daemon's, or left by a failed switch): a caller with the
    // same groups needs no setgroups, which a user namespace may deny.
    int n = static_cast<int>(::syscall(SYS_getgroups, 0, nullptr));
    me.applied.resize(n > 0 ? static_cast<size_t>(n) : 0);
    if (n >= 0 && ::syscall(SYS_getgroups, n, me.applied.data()) == n) me.groups_applied = true;
  }
  // The raw system calls: glibc's wrappers would change every thread of the process. A switch
  // that fails leaves the thread's state unknown (known, groups_applied false): the next
  // request sets everything again.
  if (!me.groups_applied || groups != me.applied) {
    if (::syscall(SYS_setgroups, groups.size(), groups.data()) != 0) {
      int error = errno;
      me.groups_applied = false;
      return error == EINVAL ? EPERM : error;
    }
    me.applied = groups;
    me.groups_applied = true;
  }
  if (!me.known || me.gid != ctx.gid) {
    if (!set_fsgid(ctx.gid)) {
      me.known = false;
      return EPERM;
    }
    me.gid = ctx.gid;
  }
  if (!me.known || me.uid != ctx.uid) {
    if (!set_fsuid(ctx.uid)) {
      me.known = false;
      set_fsuid(0);  // (it is the daemon's still: stop_being_caller left it so)
      return EPERM;
    }
    me.uid = ctx.uid;
  }
  me.known = true;
  return 0;
}

bool as_caller() { return current.known && current.uid != 0; }

void stop_being_caller() {
  ThreadCaller& me = current;
  if (!me.known || me.uid == 0) return;
  syscall(SYS_setfsuid, 0);
  me.uid = 0;
}

Fd open_as(int path_fd, uint64_t writer, int flags, int* error) {
  std::string path = proc_path(path_fd);
  auto before_uid = static_cast<uid_t>(::syscall(SYS_setfsuid, -1));
  auto before_gid = static_cast<gid_t>(::syscall(SYS_setfsgid, -1));
  bool as_writer = ::geteuid() == 0 && writer != 0;
  // Either id refused: nothing is opened, as the daemon or as half the writer.
  bool switched = !as_writer || (set_fsgid(static_cast<gid_t>(writer & 0xffffffffu)) &&
                                 set_fsuid(static_cast<uid_t>(writer >> 32)));
  Fd fd;
  if (switched) {
    fd = Fd(::open(path.c_str(), flags));
    *error = fd ? 0 : errno;
  } else {
    *error = EPERM;
  }
  if (as_writer) {
    ::syscall(SYS_setfsuid, before_uid);
    ::syscall(SYS_setfsgid, before_gid);
  }
  return fd;
}

}  // namespace ft
