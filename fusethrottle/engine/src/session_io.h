// The session's reads and writes on /dev/fuse: the system calls libfuse would make itself,
// with one difference, the INIT reply can ask the kernel for FUSE_HANDLE_KILLPRIV_V2, for
// which libfuse 3.14 has no capability bit.
//
// Why it matters: without the flag the kernel asks the daemon for security.capability before
// every write() into its cache, a round trip per write that makes small writes several times
// slower. With it the kernel leaves removing set-ID bits and the file capability to the
// server, and asks once per file (S_NOSEC) until its attributes change. The server's part is
// done by the target: a caller's own write reaches it as that caller, who has no CAP_FSETID,
// so the target removes them as a local file system would. The flag is therefore asked only
// where writes run as their caller (or nobody but the daemon's user writes through the mount).
#pragma once

#include <fuse_lowlevel.h>

#include <atomic>
#include <sys/uio.h>

namespace ft {

struct SessionIo {
  bool ask_killpriv_v2 = false;
  // A request thread that served nothing for this long gives its buffer's pages back (0:
  // never). See io_read in session_io.cc.
  int buffer_idle_ms = 0;
  std::atomic<bool> replied{false};        // the first reply (INIT's) went out
  std::atomic<bool> killpriv_v2{false};    // and carried the flag
};

// Route *se*'s traffic on *fd* (the mounted /dev/fuse) through *io*; the session's userdata
// must give io() back (see io_of in session_io.cc). 0 or -errno.
int use_session_io(fuse_session* se, int fd);

// For the hook: the SessionIo of the session whose userdata is *userdata*.
SessionIo& session_io_of(void* userdata);

// The whole pages of a request buffer at *buf* beyond its first *keep* bytes and within its
// first *touched*: what a quiet thread gives back. {start, length}, length 0 for none.
struct PageRange {
  char* start;
  size_t length;
};
PageRange pages_to_give_back(char* buf, size_t touched, size_t keep);

// Exposed for the unit test: add the flag to *iov* if it is a successful INIT reply of
// protocol 7; true when it did.
bool add_killpriv_v2(struct iovec* iov, int count);

}  // namespace ft
