#include "caller.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

namespace ft {
namespace {

std::atomic<bool> switching{false};

// Supplementary groups are read from /proc for a pid: a process's groups almost never change,
// so they are kept a second per thread rather than read on every request.
constexpr auto kGroupsTtl = std::chrono::seconds(1);
constexpr int kMaxGroups = 65536;

struct ThreadCaller {
  bool known = false;
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t groups_pid = 0;
  std::chrono::steady_clock::time_point groups_read{};
  std::vector<gid_t> groups;
  std::vector<gid_t> applied;
  bool groups_applied = false;
};

thread_local ThreadCaller current;

std::vector<gid_t> read_groups(fuse_req_t req) {
  std::vector<gid_t> list(64);
  for (;;) {
    int n = fuse_req_getgroups(req, static_cast<int>(list.size()), list.data());
    if (n < 0) return {};
    if (static_cast<size_t>(n) <= list.size()) {
      list.resize(static_cast<size_t>(n));
      return list;
    }
    if (n > kMaxGroups) return {};
    list.resize(static_cast<size_t>(n));
  }
}

}  // namespace

void set_switch_credentials(bool on) { switching.store(on); }

void become_caller(fuse_req_t req) {
  if (!switching.load(std::memory_order_relaxed)) return;
  const fuse_ctx* ctx = fuse_req_ctx(req);
  ThreadCaller& me = current;
  auto now = std::chrono::steady_clock::now();
  if (ctx->pid != me.groups_pid || now - me.groups_read > kGroupsTtl) {
    me.groups = ctx->pid > 0 ? read_groups(req) : std::vector<gid_t>{};
    me.groups_pid = ctx->pid;
    me.groups_read = now;
  }
  // The raw system calls: glibc's wrappers would change every thread of the process.
  if (!me.groups_applied || me.groups != me.applied) {
    syscall(SYS_setgroups, me.groups.size(), me.groups.data());
    me.applied = me.groups;
    me.groups_applied = true;
  }
  if (!me.known || me.gid != ctx->gid) {
    syscall(SYS_setfsgid, ctx->gid);
    me.gid = ctx->gid;
  }
  if (!me.known || me.uid != ctx->uid) {
    syscall(SYS_setfsuid, ctx->uid);
    me.uid = ctx->uid;
  }
  me.known = true;
}

void stop_being_caller() {
  ThreadCaller& me = current;
  if (!me.known || me.uid == 0) return;
  syscall(SYS_setfsuid, 0);
  me.uid = 0;
}

}  // namespace ft
