// The connection's capability flags as INIT offers them, for libfuse 3.14 and 3.17+ alike.
//
// libfuse 3.17 keeps them in 64 bits (capable_ext, want_ext) and takes the 32-bit want of
// older releases only if want_ext is left alone: one of the two, so the engine sets them all
// one way, through these.
#pragma once

#include <fuse_lowlevel.h>

#include <cstdint>

namespace ft {

inline bool conn_can(const fuse_conn_info* conn, uint64_t flag) {
#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
  return (conn->capable_ext & flag) != 0;
#else
  return (conn->capable & flag) != 0;
#endif
}

// Ask for *flag* if the kernel offers it; false if it does not.
inline bool conn_want(fuse_conn_info* conn, uint64_t flag) {
  if (!conn_can(conn, flag)) return false;
#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
  conn->want_ext |= flag;
#else
  conn->want |= static_cast<uint32_t>(flag);
#endif
  return true;
}

inline void conn_drop(fuse_conn_info* conn, uint64_t flag) {
#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
  conn->want_ext &= ~flag;
#else
  conn->want &= ~static_cast<uint32_t>(flag);
#endif
}

}  // namespace ft
