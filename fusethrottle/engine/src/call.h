// The request a request thread serves, and who answers it: the handler, or, for a caller
// interrupted while the handler waits on the target, the interrupt (FUSE_INTERRUPT).
//
// The kernel holds a caller whose request the daemon has read until the daemon answers it,
// through SIGKILL; on NFS directly such a caller dies (NFS waits killable). So an interrupted
// request is answered EINTR at once by the thread that reads the INTERRUPT, while the handler
// still waits on the target; the handler's own answer, when its call returns, is dropped. The
// handler must then not touch the request at all (libfuse frees it with the answer): every
// answer goes through answer(), and what a handler needs of its request (the engine, the
// caller) is read here before it starts, and what it works on is held (see Call::held): once
// a request is answered the kernel may release the handle and forget the nodes its handler
// still uses. Forget and release have no caller waiting and are never interrupted.
#pragma once

#include <fuse_lowlevel.h>

#include <atomic>
#include <memory>
#include <type_traits>
#include <utility>

namespace ft {

class Engine;

struct Call {
  Engine* engine = nullptr;
  uid_t uid = 0;
  gid_t gid = 0;
  std::atomic<pid_t> pid{0};  // the caller's thread (read by the interrupt too)
  // The node the request is about (its first node id: the parent for a name), 0 for none.
  fuse_ino_t node = 0;
  // What the meter charges it for (meter.h): the data it moved, the error it was answered.
  uint64_t bytes = 0;
  int error = 0;
  // The request until someone claimed its answer (then null). Only the interrupt, on another
  // thread, touches it besides its own thread: the request cannot be freed, nor its address
  // reused, while its interrupt callback runs (libfuse holds it).
  std::atomic<fuse_req_t> unanswered{nullptr};
  // The request's handle and nodes, held while its handler runs (an interrupted request's
  // handler outlives the kernel's hold of them). Let go of just before the handler's answer,
  // while the kernel still holds them: the answer lets the caller go on (a close, then an
  // unlink), and a hold left to the end of the handler kept the file open a moment longer.
  std::shared_ptr<void> held[3];
  void let_go_of_held() {
    for (auto& it : held) it.reset();
  }
  // True for the one caller who may answer *req*.
  bool claim(fuse_req_t req) { return unanswered.compare_exchange_strong(req, nullptr); }
};

// This thread's call (one request at a time per thread; kept for the thread's life, so a late
// interrupt of an earlier request finds it, sees another request and does nothing).
Call& this_call();

// The handler answers this thread's request with *error*: an ESTALE from the target marks the
// request's node stale (inode.h), before the answer lets the kernel forget it.
void note_error(int error);

// The handler moved *n* bytes of file data (read and write: what the meter charges).
inline void moved(uint64_t n);

// Answer this thread's request with *reply* (a fuse_reply_* function), unless the interrupt
// answered it already: then -EINTR, and *req* is not touched.
template <typename Reply, typename... Args>
int answer(Reply reply, fuse_req_t req, Args&&... args) {
  if (!this_call().claim(req)) return -EINTR;
  if constexpr (std::is_same_v<Reply, int (*)(fuse_req_t, int)> && sizeof...(Args) == 1) {
    note_error((static_cast<int>(args), ...));
  }
  this_call().let_go_of_held();
  return reply(req, std::forward<Args>(args)...);
}

inline void moved(uint64_t n) { this_call().bytes = n; }

// libfuse's interrupt callback: answers EINTR if the caller is dying (SIGKILL pending: the
// kernel turns every fatal signal into one) and the handler has not answered yet. A caller
// that is not dying waits, as on NFS, whose waits only fatal signals end.
void on_interrupt(fuse_req_t req, void* call);

// After fuse_req_interrupt_func: answers EINTR, and says so, if the interrupt came before it
// and the caller is dying (on_interrupt leaves that case to the request's own thread).
bool answer_if_interrupted(fuse_req_t req);

}  // namespace ft
