#include "call.h"

#include "engine.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

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

void on_interrupt(fuse_req_t req, void* data) {
  auto* call = static_cast<Call*>(data);
  // The request's own thread: called from its registration, which holds the request's lock
  // with nothing else holding the request (see Call::interrupted_early). Answered after it.
  if (call == &this_call()) {
    if (call->unanswered.load() == req) call->interrupted_early = true;
    return;
  }
  // Another thread read the interrupt: libfuse holds the request while this runs. Its pid is
  // read from the Call, which is this request's only while unanswered holds it.
  pid_t pid = call->pid;
  if (call->unanswered.load() != req || !dying(pid)) return;
  if (call->claim(req)) fuse_reply_err(req, EINTR);
}

void interrupted(Call& call, fuse_req_t req) {
  call.interrupted_early = false;
  if (dying(call.pid) && call.claim(req)) fuse_reply_err(req, EINTR);
}

void test_delay_interrupt_registration(ft_engine_op op, fuse_req_t req) {
  static const long delayed = [] {
    const char* kind = std::getenv("FUSETHROTTLE_TEST_DELAY_INTERRUPT_REGISTRATION");
    char* end = nullptr;
    long value = kind != nullptr && *kind != '\0' ? std::strtol(kind, &end, 10) : -1;
    return end != nullptr && *end == '\0' && value >= 0 && value < FT_OP_COUNT ? value : -1;
  }();
  static std::atomic<bool> done{false};
  if (op != delayed || done.exchange(true)) return;
  std::fprintf(stderr, "fusethrottle engine: test: request kind %d waits for its interrupt\n",
               static_cast<int>(op));
  int waited_ms = 0;
  for (; waited_ms < 30000 && fuse_req_interrupted(req) == 0; waited_ms++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fprintf(stderr, "fusethrottle engine: test: request kind %d registered for its interrupt %s\n",
               static_cast<int>(op), waited_ms < 30000 ? "after it was read" : "after 30 s without one");
}

}  // namespace ft
