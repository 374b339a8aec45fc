#include "call.h"

#include "engine.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ft {

Call& this_call() {
  thread_local Call call;
  return call;
}

bool dying(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(tid));
  std::FILE* status = std::fopen(path, "re");
  if (status == nullptr) return false;  // gone already, or not ours to see
  constexpr unsigned long long kSigkill = 1ull << (9 - 1);
  bool found = false;
  char line[256];
  while (!found && std::fgets(line, sizeof line, status) != nullptr) {
    if (std::strncmp(line, "SigPnd:", 7) == 0 || std::strncmp(line, "ShdPnd:", 7) == 0) {
      found = (std::strtoull(line + 7, nullptr, 16) & kSigkill) != 0;
    }
  }
  std::fclose(status);
  return found;
}

void note_error(int error) {
  Call& call = this_call();
  call.error = error;
  if (error == ESTALE && call.node != 0) call.engine->inodes().get(call.node).set_stale(true);
}

bool answer_if_interrupted(fuse_req_t req) {
  Call& call = this_call();
  if (!fuse_req_interrupted(req) || call.unanswered.load() != req || !dying(call.pid)) return false;
  if (call.claim(req)) fuse_reply_err(req, EINTR);
  return true;
}

void on_interrupt(fuse_req_t req, void* data) {
  auto* call = static_cast<Call*>(data);
  // Called at once, on the request's own thread, by fuse_req_interrupt_func when the interrupt
  // came first: libfuse holds the request's lock there and unlocks it after this returns, so
  // an answer here would free the request (and that lock) under it. Counted::serve answers
  // it instead (answer_if_interrupted), once the registration has returned.
  if (call == &this_call()) return;
  // The request is held by libfuse while this runs: its pid is read from the Call, which is
  // this request's only while unanswered holds it.
  pid_t pid = call->pid;
  if (call->unanswered.load() != req || !dying(pid)) return;
  if (call->claim(req)) fuse_reply_err(req, EINTR);
}

}  // namespace ft
