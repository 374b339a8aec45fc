// Calls against the target run as the process that asked for them (an NFS export that squashes
// root would refuse the daemon's own root; README "credentials"): per thread, so one request
// thread's caller is never another's.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/types.h>

#include <cstdint>

#include "fd.h"

namespace ft {

// Switches this thread's file-system ids and groups to its request's caller (call.h), when the daemon
// may (it runs as root). Cheap when the same caller asks again on the same thread. 0, or the
// errno of a switch that failed (EPERM for an id the kernel kept; setgroups' own, as EPERM in a
// user namespace that denies it, or ENOMEM): the request must then be refused, never served
// with the ids or groups the thread had before (another caller's, or the daemon's).
[[nodiscard]] int become_caller();

// After a request: the thread's file-system uid back to the daemon's (groups and gid stay, for
// the next become_caller to reuse). libfuse starts new request threads from a request thread,
// and a new thread inherits its creator's ids: as a caller it could not open /dev/fuse for
// its own queue (clone_fd), and would serve as that caller what should run as the daemon.
void stop_being_caller();

// Whether this thread runs as a caller other than the daemon now.
bool as_caller();

// Open the file *path_fd* (an O_PATH descriptor) reaches with *flags*, as *writer* (its uid
// above its gid, Inode::writer; the daemon's own ids for 0) when the daemon is root: a
// squashing target refuses the daemon's root, as NFS's own write-back would not be. This
// thread's ids come back before it returns. *error*: 0, or the errno (EPERM where the writer's
// ids could not be taken: nothing is opened then).
Fd open_as(int path_fd, uint64_t writer, int flags, int* error);

// Whether become_caller switches anything (decided once, at start).
void set_switch_credentials(bool on);

}  // namespace ft
