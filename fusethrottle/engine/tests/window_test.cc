// The window's rules without a mount: what is due for an fsync and why, what a failed sync
// leaves, and that the gate holds a write until a sync makes room; and when the kernel's view
// of a file is renewed after another writer changed it. `make test` runs it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../src/ceilings.h"
#include "../src/fleet_gate.h"
#include "../src/inode.h"
#include "../src/kernel_view.h"
#include "../src/window.h"

namespace {

int failures = 0;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                     \
    }                                                                 \
  } while (0)

constexpr uint64_t MiB = 1ull << 20;

std::shared_ptr<ft::Inode> file(ino_t ino) {
  return std::make_shared<ft::Inode>(ft::Fd(), ft::InodeKey{1, ino}, S_IFREG, std::string());
}

struct stat sized(off_t size, int64_t mtime_s) {
  struct stat st {};
  st.st_mode = S_IFREG | 0644;
  st.st_size = size;
  st.st_mtim.tv_sec = mtime_s;
  return st;
}

ft::WindowParams params() {
  ft::WindowParams p;
  p.window = 64 * MiB;
  p.batch = 16 * MiB;
  p.max_age = 30;
  p.admission_timeout = 60;
  return p;
}

void test_pure_rules() {
  CHECK(ft::sync_trigger(64 * MiB, 256 * MiB) == 64 * MiB);
  CHECK(ft::sync_trigger(64 * MiB, 32 * MiB) == 16 * MiB);  // half the window if smaller
  CHECK(ft::sync_trigger(64 * MiB, 0) == 1);
  CHECK(ft::pacing_rate(100.0, 10, 100) == 0);    // below half: no pacing
  CHECK(ft::pacing_rate(100.0, 50, 100) == 100);  // at half: the commit rate
  CHECK(ft::pacing_rate(100.0, 100, 100) == 10);  // at the edge: a tenth of it
  CHECK(ft::pacing_rate(0.0, 90, 100) == 0);      // rate unknown: no pacing
  CHECK(ft::writeback_piece(0, 64 * MiB) == MiB);               // rate unknown
  CHECK(ft::writeback_piece(20.0 * MiB, 64 * MiB) == 2 * MiB);  // 0.1 s of it
  CHECK(ft::writeback_piece(1.0 * MiB, 64 * MiB) == 128 * 1024);  // never below 128 KiB
  CHECK(ft::writeback_piece(1000.0 * MiB, 4 * MiB) == 4 * MiB);   // never above the trigger
}

void test_a_file_is_due_at_its_batch_on_release_and_by_age() {
  ft::Window w(params());
  auto a = file(1), b = file(2), c = file(3);
  w.admit(16 * MiB);
  w.landed(a, 16 * MiB, 16 * MiB, 0);
  w.admit(MiB);
  w.landed(b, MiB, MiB, 0);
  w.admit(MiB);
  w.landed(c, MiB, MiB, 0);
  double t = ft::now_seconds();
  auto jobs = w.take_due(t);
  CHECK(jobs.size() == 1 && jobs[0].inode == a && jobs[0].reason == ft::SyncReason::kBatch);
  CHECK(jobs.size() == 1 && jobs[0].bytes == 16 * MiB && jobs[0].lo == 0 && jobs[0].hi == int64_t(16 * MiB));
  CHECK(w.take_due(t).empty());  // one sync per file at a time; the others not due yet
  w.opening(b);
  w.released(b, ft::Fd());
  CHECK(w.take_due(ft::now_seconds()).empty());  // closes gather a moment, to go as a group
  auto released = w.take_due(ft::now_seconds() + ft::kGroupGather);
  CHECK(released.size() == 1 && released[0].inode == b && released[0].reason == ft::SyncReason::kRelease);
  CHECK(released.size() == 1 && released[0].groupable());
  auto aged = w.take_due(t + 31);
  CHECK(aged.size() == 1 && aged[0].inode == c && aged[0].reason == ft::SyncReason::kAge);
  CHECK(w.stats().unsynced == 18 * MiB);
  if (jobs.size() != 1 || released.size() != 1 || aged.size() != 1) return;
  for (auto* done : {&jobs[0], &released[0], &aged[0]}) w.end_sync(*done, 0);
  auto s = w.stats();
  CHECK(s.unsynced == 0 && s.synced == 18 * MiB && s.dirty_files == 0);
}

void test_under_pressure_the_largest_file_is_synced_below_its_batch() {
  ft::WindowParams p = params();
  p.window = 32 * MiB;  // the trigger: 16 MiB
  ft::Window w(p);
  auto small = file(1), large = file(2);
  w.admit(4 * MiB);
  w.landed(small, 4 * MiB, 4 * MiB, 0);
  w.admit(14 * MiB);
  w.landed(large, 14 * MiB, 14 * MiB, 0);  // 18 of 32 MiB: over half the window
  auto jobs = w.take_due(ft::now_seconds());
  CHECK(jobs.size() == 1 && jobs[0].inode == large && jobs[0].reason == ft::SyncReason::kWindow);
}

void test_a_failed_sync_keeps_its_bytes_and_its_error_for_the_application_once() {
  ft::Window w(params());
  auto a = file(1);
  w.admit(16 * MiB);
  w.landed(a, 16 * MiB, 16 * MiB, 0);
  double t = ft::now_seconds();
  auto jobs = w.take_due(t);
  CHECK(jobs.size() == 1);
  if (jobs.size() != 1) return;
  w.end_sync(jobs[0], EIO);
  CHECK(w.stats().unsynced == 16 * MiB);  // still owed
  CHECK(w.stats().failed_syncs == 1);
  CHECK(w.take_due(t).empty());  // backing off
  CHECK(w.take_error(*a) == EIO);
  CHECK(w.take_error(*a) == 0);  // handed out once
  auto retry = w.take_due(t + 2);
  CHECK(retry.size() == 1 && retry[0].bytes == 16 * MiB && retry[0].lo == 0);
  if (retry.size() == 1) w.end_sync(retry[0], 0);
  CHECK(w.stats().unsynced == 0);
}

void test_the_applications_own_fsync_takes_the_bytes_and_truncation_discards_them() {
  ft::Window w(params());
  auto a = file(1), b = file(2);
  w.admit(MiB);
  w.landed(a, MiB, MiB, 0);
  w.admit(MiB);
  w.landed(b, MiB, MiB, 0);
  uint64_t taken = w.begin_app_sync(*a);
  CHECK(taken == MiB);
  w.end_app_sync(*a, taken, EIO);  // the application was told: not owed again
  w.discard(*b);
  CHECK(w.stats().unsynced == 0 && w.stats().dirty_files == 0);
}

void test_the_gate_holds_a_write_until_a_sync_makes_room() {
  ft::Window w(params());
  auto a = file(1);
  w.admit(60 * MiB);
  w.landed(a, 60 * MiB, 60 * MiB, 0);
  std::atomic<bool> admitted{false};
  std::thread writer([&] {
    w.admit(8 * MiB);  // 68 > 64 MiB: waits
    admitted = true;
  });
  while (w.stats().waiting == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(!admitted);
  auto jobs = w.take_due(ft::now_seconds());
  CHECK(jobs.size() == 1);
  if (jobs.size() == 1) w.end_sync(jobs[0], 0);
  writer.join();
  CHECK(admitted);
  auto s = w.stats();
  CHECK(s.throttled == 1 && s.unsynced == 8 * MiB && s.unsynced_high <= 64 * MiB);
}

// Three hundred writers (a backup host's many jobs) at a full gate at once: syncs make room a
// file at a time, every writer gets through before its admission timeout, and the window is
// never exceeded on the way.
void test_three_hundred_writers_at_a_full_gate_all_get_through_within_the_window() {
  ft::WindowParams p = params();
  p.admission_timeout = 20;  // a lost wake-up fails the test here, not by hanging it
  ft::Window w(p);
  auto first = file(1);
  w.admit(60 * MiB);
  w.landed(first, 60 * MiB, 60 * MiB, 0);
  constexpr int kWriters = 300;
  std::atomic<int> admitted{0}, refused{0};
  std::vector<std::thread> writers;
  for (int i = 0; i < kWriters; i++) {
    writers.emplace_back([&, i] {
      auto mine = file(static_cast<ino_t>(100 + i));
      if (!w.admit(MiB)) {
        refused++;
        return;
      }
      w.landed(mine, MiB, MiB, 0);
      admitted++;
    });
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (admitted + refused < kWriters && std::chrono::steady_clock::now() < deadline) {
    for (auto& job : w.take_due(ft::now_seconds())) w.end_sync(job, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& t : writers) t.join();
  CHECK(admitted == kWriters && refused == 0);
  auto s = w.stats();
  CHECK(s.timeouts == 0 && s.waiting == 0);
  CHECK(s.unsynced_high <= 64 * MiB);
  CHECK(s.written == 60 * MiB + kWriters * MiB);
}

void test_a_writer_killed_at_the_gate_leaves_it_reserving_nothing() {
  ft::Window w(params());
  auto a = file(1);
  w.admit(60 * MiB);
  w.landed(a, 60 * MiB, 60 * MiB, 0);
  std::atomic<bool> killed{false};
  std::atomic<int> result{-1};
  std::thread writer([&] { result = w.admit(8 * MiB, [&] { return killed.load(); }) ? 1 : 0; });
  while (w.stats().waiting == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  killed = true;  // no sync makes room: only the check lets it go
  writer.join();
  CHECK(result == 0);
  auto s = w.stats();
  CHECK(s.waiting == 0 && s.unsynced == 60 * MiB && s.throttled == 0);
  // The line moved on: once a sync makes room, the next writer is admitted.
  auto jobs = w.take_due(ft::now_seconds());
  CHECK(jobs.size() == 1);
  if (jobs.size() == 1) w.end_sync(jobs[0], 0);
  CHECK(w.admit(8 * MiB, [] { return false; }));
  CHECK(w.stats().unsynced == 8 * MiB);
}

// A write whose handler fails between the gate and the target (an exception the request loop
// answers EIO) gives its room back: the window is not smaller for every later writer.
void test_a_write_that_never_lands_gives_its_room_back() {
  ft::Window w(params());
  auto a = file(1);
  CHECK(w.admit(60 * MiB));
  try {
    ft::Window::Reservation reserved(w, 60 * MiB);
    CHECK(w.stats().reserved == 60 * MiB);
    throw std::runtime_error("the handler failed before the write reached the target");
  } catch (const std::runtime_error&) {
  }
  auto s = w.stats();
  CHECK(s.reserved == 0 && s.unsynced == 0);
  // The whole window is there for the next writer, at once.
  CHECK(w.admit(60 * MiB, [] { return false; }));
  {
    ft::Window::Reservation reserved(w, 60 * MiB);
    w.landed(a, reserved.take(), 60 * MiB, 0);
  }
  s = w.stats();
  CHECK(s.reserved == 0 && s.unsynced == 60 * MiB && s.throttled == 0);
}

void test_a_forgotten_file_is_synced_even_without_injection() {
  ft::WindowParams p = params();
  p.inject = false;
  p.enforce = false;
  ft::Window w(p);
  ft::InodeTable table;
  struct stat st {};
  st.st_dev = 1;
  st.st_ino = 5;
  st.st_mode = S_IFREG | 0644;
  fuse_ino_t node = table.remember(ft::Fd(::open("/dev/null", O_PATH | O_CLOEXEC)), st, "handle-5");
  auto a = table.share(node);
  w.admit(32 * MiB);
  w.landed(a, 32 * MiB, 32 * MiB, 0);
  CHECK(w.take_due(ft::now_seconds() + 100).empty());  // mode=off injects nothing
  // Forgotten by the kernel (the table says so, see Inode::forgotten): synced at once.
  CHECK(table.forget(node, 1, [&w](const std::shared_ptr<ft::Inode>& i) { return w.forgotten(i); }) ==
        nullptr);
  auto jobs = w.take_due(ft::now_seconds());
  CHECK(jobs.size() == 1 && jobs[0].reason == ft::SyncReason::kForget);
  for (auto& job : jobs) w.end_sync(job, 0);
}

}  // namespace

// Before its last name is removed, a closed file's un-synced bytes are dropped and its held
// descriptor closed (nothing would keep the file on the target); an open file is left alone,
// and so is one whose sync still runs when the removal stops waiting for it.
void test_a_file_about_to_be_removed_is_let_go_of_unless_open_or_syncing() {
  using std::chrono::milliseconds;
  ft::Window w(params());
  auto closed = file(1), open = file(2), syncing = file(3);
  int pipe_fds[2];
  CHECK(::pipe(pipe_fds) == 0);
  ft::Fd reader(pipe_fds[0]);
  w.opening(closed);
  w.admit(MiB);
  w.landed(closed, MiB, MiB, 0);
  w.released(closed, ft::Fd(pipe_fds[1]));  // held for its release sync
  w.opening(open);
  w.admit(MiB);
  w.landed(open, MiB, MiB, 0);
  w.admit(16 * MiB);
  w.landed(syncing, 16 * MiB, 16 * MiB, 0);
  auto jobs = w.take_due(ft::now_seconds());
  CHECK(jobs.size() == 1 && jobs[0].inode == syncing);
  CHECK(w.stats().unsynced == 18 * MiB);
  CHECK(w.let_go(*closed, milliseconds(0)));
  CHECK(w.stats().unsynced == 17 * MiB);
  char byte;
  CHECK(::read(reader.get(), &byte, 1) == 0);  // the held write end is closed: end of file
  CHECK(!w.let_go(*open, milliseconds(100)));
  CHECK(!w.let_go(*syncing, milliseconds(50)));
  CHECK(w.stats().unsynced == 17 * MiB);
  w.end_sync(jobs[0], 0);
}

// A removal waits for the file's running sync to end; one handed to the flusher but not
// started is not run at all, and its descriptor is closed before the removal goes ahead (an
// open descriptor keeps the file's space allocated, and on NFS makes the removal a rename).
void test_a_removal_waits_for_a_running_sync_and_drops_one_not_started() {
  using std::chrono::milliseconds;
  ft::Window w(params());
  auto running = file(1), waiting = file(2);
  w.admit(16 * MiB);
  w.landed(running, 16 * MiB, 16 * MiB, 0);
  auto jobs = w.take_due(ft::now_seconds());
  CHECK(jobs.size() == 1);
  std::atomic<bool> let_go{false};
  std::thread removal([&] { let_go = w.let_go(*running, milliseconds(10000)); });
  std::this_thread::sleep_for(milliseconds(100));
  CHECK(!let_go);  // still waiting for the sync
  if (!jobs.empty()) w.end_sync(jobs[0], 0);
  removal.join();
  CHECK(let_go);

  int pipe_fds[2];
  CHECK(::pipe(pipe_fds) == 0);
  ft::Fd reader(pipe_fds[0]);
  w.opening(waiting);
  w.admit(16 * MiB);
  w.landed(waiting, 16 * MiB, 16 * MiB, 0);
  w.released(waiting, ft::Fd(pipe_fds[1]));
  jobs = w.take_due(ft::now_seconds());
  CHECK(jobs.size() == 1 && jobs[0].held);
  CHECK(!w.removing(*waiting));
  let_go = false;
  removal = std::thread([&] { let_go = w.let_go(*waiting, milliseconds(10000)); });
  while (!w.removing(*waiting)) std::this_thread::sleep_for(milliseconds(1));
  if (!jobs.empty()) w.dropped(jobs[0]);  // what the flusher does instead of syncing it
  removal.join();
  CHECK(let_go);
  char byte;
  CHECK(::read(reader.get(), &byte, 1) == 0);  // its descriptor closed
  CHECK(w.stats().unsynced == 0);
  CHECK(w.stats().synced == 16 * MiB);  // the first file's only
}

// A process closed the file (FLUSH) and its RELEASE is still on its way when its next request
// (the removal, an open) is served: the removal waits for that RELEASE and lets go of the file,
// as if it had come first. A handle still open, or a closed one whose RELEASE never comes in
// time (a duplicate of it lives on in another process), leaves the file open to the removal.
void test_a_removal_waits_for_a_closed_handles_release_but_not_for_an_open_handle() {
  using std::chrono::milliseconds;
  ft::Window w(params());
  auto closed = file(1), open = file(2), shared = file(3);
  w.opening(closed);
  w.admit(MiB);
  w.landed(closed, MiB, MiB, 0);
  w.closing(*closed, true);
  std::thread release([&] {
    std::this_thread::sleep_for(milliseconds(20));
    w.released(closed, ft::Fd(), true);
  });
  CHECK(w.let_go(*closed, milliseconds(0)));
  release.join();
  CHECK(w.stats().unsynced == 0);  // its bytes went with it
  w.opening(open);
  CHECK(!w.let_go(*open, milliseconds(0)));
  // An open (counted from before the target's open, as Window::opening) that finds the file
  // changed on the target waits for the other handles' releases only while every one of them
  // was closed by its process. The kernel was shown each file at a size of 100 first.
  auto since = [] { return ft::KernelView::now(); };
  for (auto& f : {open, shared}) w.looked_up(*f, sized(100, 1), since());
  w.opening(open);  // a second open of it: the first is open, not closing: no wait
  ft::KernelView::AtOpen at = w.at_open(*open, sized(5, 2), since(), milliseconds(10000));
  CHECK(at.changed && !at.alone);
  w.not_opened(open);
  // Two handles, one closed: the other is open, nothing to wait for.
  w.opening(shared);
  w.opening(shared);
  w.closing(*shared, true);
  w.opening(shared);
  at = w.at_open(*shared, sized(5, 2), since(), milliseconds(10000));
  CHECK(at.changed && !at.alone);
  w.not_opened(shared);
  // Both closed, one released in time: not alone, the other's release never came.
  w.closing(*shared, true);
  w.released(shared, ft::Fd(), true);
  w.opening(shared);
  at = w.at_open(*shared, sized(5, 2), since(), milliseconds(20));
  CHECK(at.changed && !at.alone);
  w.not_opened(shared);
  CHECK(!w.let_go(*shared, milliseconds(0)));
  // Its release comes while the open waits: the open is alone.
  w.opening(shared);
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(20));
    w.released(shared, ft::Fd(), true);
  });
  at = w.at_open(*shared, sized(5, 2), since(), milliseconds(10000));
  late.join();
  CHECK(at.changed && at.alone);
  // Used again after its FLUSH (a duplicate still open): not closing any more.
  w.opening(shared);
  w.closing(*shared, true);
  w.closing(*shared, false);
  w.opening(shared);
  at = w.at_open(*shared, sized(5, 2), since(), milliseconds(10000));
  CHECK(at.changed && !at.alone);
}

// The kernel evicts a closed file that still owes a sync, then looks its name up again: the
// table hands back the same inode (its data, its descriptors), not a second one beside it,
// until the sync is done; then a forgotten file leaves the table.
void test_a_file_forgotten_while_it_owes_a_sync_is_found_again_as_itself() {
  ft::Window w(params());
  ft::InodeTable table;
  w.when_settled([&table](const std::shared_ptr<ft::Inode>& inode) { table.settled(inode); });
  auto owed = [&w](const std::shared_ptr<ft::Inode>& inode) { return w.forgotten(inode); };
  struct stat st {};
  st.st_dev = 1;
  st.st_ino = 7;
  st.st_mode = S_IFREG | 0644;
  auto path = [] { return ft::Fd(::open("/dev/null", O_PATH | O_CLOEXEC)); };
  fuse_ino_t node = table.remember(path(), st, "handle-7");
  auto inode = table.share(node);
  w.opening(inode);
  w.admit(MiB);
  w.landed(inode, MiB, MiB, 0);
  w.released(inode, ft::Fd());
  inode.reset();
  CHECK(table.forget(node, 1, owed) == nullptr);  // kept: it owes a sync
  CHECK(table.size() == 1);
  CHECK(table.nodes().empty());  // the kernel holds nothing of it
  CHECK(table.remember(path(), st, "handle-7") == node);  // found again as itself
  auto jobs = w.take_due(ft::now_seconds() + 1);
  CHECK(jobs.size() == 1);
  if (jobs.size() == 1) w.end_sync(jobs[0], 0);
  CHECK(table.size() == 1);  // looked up again: the kernel holds it
  CHECK(table.forget(node, 1, owed) != nullptr);  // owes nothing: it goes

  node = table.remember(path(), st, "handle-7");
  inode = table.share(node);
  w.opening(inode);
  w.admit(MiB);
  w.landed(inode, MiB, MiB, 0);
  w.released(inode, ft::Fd());
  CHECK(table.forget(node, 1, owed) == nullptr);
  jobs = w.take_due(ft::now_seconds() + 1);
  CHECK(jobs.size() == 1 && jobs[0].reason == ft::SyncReason::kForget);
  std::weak_ptr<ft::Inode> gone = inode;
  inode.reset();
  if (jobs.size() == 1) w.end_sync(jobs[0], 0);
  jobs.clear();
  CHECK(table.size() == 0);  // synced with no lookup: out of the table
  CHECK(gone.expired());     // and its descriptor closed
  CHECK(table.illegal_moves() == 0);
}

void test_a_files_place_in_the_table_moves_only_as_its_life_allows() {
  using ft::Place;
  const Place all[] = {Place::kNew,      Place::kKnown,   Place::kOwing,
                       Place::kDetached, Place::kRetired, Place::kGone};
  int allowed = 0;
  for (Place from : all) {
    CHECK(!ft::legal(from, Place::kNew));  // nothing becomes new again
    CHECK(!ft::legal(Place::kGone, from));  // nothing comes back from gone
    for (Place to : all) allowed += ft::legal(from, to) ? 1 : 0;
  }
  CHECK(allowed == 12);
  CHECK(!ft::legal(Place::kNew, Place::kGone));        // known before anything else
  CHECK(!ft::legal(Place::kRetired, Place::kKnown));   // its key names another object
  CHECK(!ft::legal(Place::kOwing, Place::kRetired));   // only the kernel's holds are kept

  ft::Window w(params());
  ft::InodeTable table;
  auto owed = [&w](const std::shared_ptr<ft::Inode>& inode) { return w.forgotten(inode); };
  struct stat st {};
  st.st_dev = 1;
  st.st_ino = 9;
  st.st_mode = S_IFREG | 0644;
  auto path = [] { return ft::Fd(::open("/dev/null", O_PATH | O_CLOEXEC)); };
  // Looked up, let go of before a removal that failed, found by its key again.
  fuse_ino_t node = table.remember(path(), st, "handle-9");
  auto inode = table.share(node);
  CHECK(inode->place() == Place::kKnown);
  CHECK(table.detach(*inode, st));
  CHECK(inode->place() == Place::kDetached);
  CHECK(table.find(ft::InodeKey{1, 9}) == nullptr);  // a new lookup makes a new one
  table.reattach(*inode, path());
  CHECK(inode->place() == Place::kKnown);
  CHECK(table.find(ft::InodeKey{1, 9}) == inode);
  // Let go of again; this time its key is looked up anew before the removal fails.
  CHECK(table.detach(*inode, st));
  fuse_ino_t fresh = table.remember(path(), st, "handle-9");
  CHECK(fresh != node);
  table.reattach(*inode, path());
  CHECK(inode->place() == Place::kRetired);
  CHECK(table.forget(node, 1, owed) == inode);
  CHECK(inode->place() == Place::kGone);
  // The same inode number given to another object: the one the kernel holds is retired.
  st.st_mode = S_IFDIR | 0755;
  fuse_ino_t other = table.remember(path(), st, "handle-9b");
  CHECK(other != fresh);
  CHECK(table.share(fresh)->place() == Place::kRetired);
  CHECK(table.share(other)->place() == Place::kKnown);
  CHECK(table.forget(fresh, 1, owed) != nullptr);
  CHECK(table.forget(other, 1, owed) != nullptr);
  CHECK(table.size() == 0);
  // Where the target has no handles (NFS): the same type under the key is the same object,
  // unless the target called the one held stale: its object is gone, the key names another.
  st.st_ino = 11;
  st.st_mode = S_IFREG | 0644;
  fuse_ino_t held = table.remember(path(), st, "");
  CHECK(table.remember(path(), st, "") == held);
  table.share(held)->set_stale(true);
  fuse_ino_t anew = table.remember(path(), st, "");
  CHECK(anew != held);
  CHECK(table.share(held)->place() == Place::kRetired);
  CHECK(!table.share(anew)->stale());
  CHECK(table.forget(held, 2, owed) != nullptr);
  CHECK(table.forget(anew, 1, owed) != nullptr);
  CHECK(table.size() == 0);
  CHECK(table.illegal_moves() == 0);
}

// A removal lets go of a file's descriptor only once the calls under way through it ended: it
// waits for the last one (woken by it, not polling), and past its bound gives up and lets
// calls in again (a call on a hung target may never end).
void test_a_removal_waits_for_the_calls_under_way_and_gives_up_at_its_bound() {
  ft::InodeTable table;
  struct stat st {};
  st.st_dev = 1;
  st.st_ino = 13;
  st.st_mode = S_IFREG | 0644;
  auto path = [] { return ft::Fd(::open("/dev/null", O_PATH | O_CLOEXEC)); };
  auto inode = table.share(table.remember(path(), st, "handle-13"));
  std::atomic<bool> ended{false};
  auto call = std::make_unique<ft::Using>(inode);
  std::thread caller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ended = true;
    call.reset();
  });
  CHECK(table.detach(*inode, st));
  CHECK(ended);  // not before the call ended
  caller.join();
  CHECK(inode->detached() && inode->place() == ft::Place::kDetached);
  { ft::Using late(inode); CHECK(!late); }  // no call goes in once it is let go of
  table.reattach(*inode, path());
  CHECK(inode->place() == ft::Place::kKnown);
  {
    ft::Using stuck(inode);  // never ends while the removal waits
    CHECK(!table.detach(*inode, st));
    CHECK(!inode->detached());
    ft::Using next(inode);
    CHECK(next);  // calls go in again
  }
  CHECK(table.forget(table.node_of(*inode), 1, [](const std::shared_ptr<ft::Inode>&) { return false; }) != nullptr);
  CHECK(table.illegal_moves() == 0);
}

// A file system without handles (procfs here, the NFS client in the lab) is not asked again;
// one that has them still is.
void test_a_file_system_without_handles_leaves_the_others_theirs() {
  auto handle_at = [](const char* path) {
    ft::Fd fd(::open(path, O_PATH | O_CLOEXEC));
    struct stat st {};
    CHECK(fd && ::fstat(fd.get(), &st) == 0);
    return ft::handle_of(fd.get(), st.st_dev);
  };
  CHECK(handle_at("/proc/self/status").empty());
  CHECK(handle_at("/proc/self/status").empty());
  char made[] = "/dev/shm/ft-handle-XXXXXX";  // tmpfs: handles
  ft::Fd file(::mkstemp(made));
  CHECK(file);
  CHECK(!handle_at(made).empty());
  ::unlink(made);
}

void test_another_writers_change_renews_the_kernels_inode_only_when_nobody_has_it_open() {
  // The file's open count is the window's (FileLedger::opens): the kernel's view reads it
  // under the window's lock (Window::looked_up, at_open).
  ft::Window w(params());
  auto inode = file(1);
  ft::KernelView& view = inode->view;
  uint64_t first = w.looked_up(*inode, sized(100, 1), ft::KernelView::now());
  CHECK(w.looked_up(*inode, sized(100, 1), ft::KernelView::now()) == first);  // unchanged
  // Shrunk on the target by another writer: a new generation, the kernel drops its size.
  uint64_t renewed = w.looked_up(*inode, sized(10, 2), ft::KernelView::now());
  CHECK(renewed != first);
  // Changed again while open through the mount: the kernel keeps its own until the last
  // close; the open sees the change, and that it is not alone.
  w.opening(inode);
  w.opening(inode);
  CHECK(w.looked_up(*inode, sized(5, 3), ft::KernelView::now()) == renewed);
  ft::KernelView::AtOpen at = w.at_open(*inode, sized(5, 3), ft::KernelView::now(), std::chrono::milliseconds(0));
  CHECK(at.changed && !at.alone);
  // An open under way (counted before the target's open) keeps the generation too; once it
  // failed (not_opened) and the other was released, nobody has it open: a new generation.
  w.released(inode, ft::Fd());
  CHECK(w.looked_up(*inode, sized(5, 3), ft::KernelView::now()) == renewed);
  w.not_opened(inode);
  CHECK(view.generation() == renewed);
  CHECK(w.looked_up(*inode, sized(5, 3), ft::KernelView::now()) != renewed);
}

void test_the_mounts_own_writes_are_not_taken_for_another_writers() {
  ft::KernelView view;
  uint64_t shown = view.looked_up(sized(100, 1), ft::KernelView::now(), false);
  uint64_t since = ft::KernelView::now();
  {
    ft::KernelView::Change write(view);
    // A lookup racing our write: its stat may show either: nothing is learnt from it.
    CHECK(view.looked_up(sized(150, 2), since, false) == shown);
    view.wrote_to(200);
  }
  CHECK(view.looked_up(sized(150, 2), since, false) == shown);  // taken before the write ended
  CHECK(view.mtime_unknown());
  // The kernel's size grew with the write; the mtime it left is learnt at the flush.
  view.learn_mtime(2'000'000'000, ft::KernelView::now());
  CHECK(!view.mtime_unknown());
  CHECK(view.looked_up(sized(200, 2), ft::KernelView::now(), false) == shown);
  // Rewritten in place by another writer, same size: the mtime tells.
  CHECK(view.looked_up(sized(200, 3), ft::KernelView::now(), false) != shown);
  // A truncate of ours: the kernel takes its size; the mtime read is ours unless another
  // change of ours came meanwhile.
  uint64_t now = view.generation();
  {
    ft::KernelView::Change truncate(view);
    view.set(sized(0, 4), true, truncate);
  }
  CHECK(!view.mtime_unknown());
  CHECK(view.looked_up(sized(0, 4), ft::KernelView::now(), false) == now);
  {
    ft::KernelView::Change truncate(view);
    ft::KernelView::Change write(view);
    view.set(sized(0, 5), true, truncate);
  }
  CHECK(view.mtime_unknown());
}

void test_the_ceilings_price_by_the_profile_and_hold_a_write_over_the_budget() {
  ft::MeterProfile efs;  // meter.py's efs profile
  ft::Charge one_byte = ft::price(efs, ft::OpClass::kDataWrite, 1);
  CHECK(one_byte.metered == 32 * 1024 && one_byte.units == 5);  // a full 32 KiB minimum
  ft::Charge read = ft::price(efs, ft::OpClass::kDataRead, 40000);
  CHECK(read.metered == 13654 && read.units == 1);  // 40 KiB at a third, rounded up
  CHECK(ft::price(efs, ft::OpClass::kNone, 1 << 20).metered == 0);

  ft::TokenBucket bucket(100, 50, 0);
  CHECK(bucket.delay_for(0, 50) == 0);    // the burst goes at once
  CHECK(bucket.delay_for(0, 100) == 1.0); // then the rate: in debt, callers queue behind it
  CHECK(bucket.delay_for(1.0, 0) == 0);
  bucket.refund(2.0, 100);
  CHECK(bucket.delay_for(2.0, 50) == 0);  // refilled, and never above the burst
  CHECK(ft::TokenBucket(0, 0, 0).delay_for(0, 1e12) == 0);  // rate 0: no ceiling

  // 1 MiB/s: the first MiB is the burst, the next half MiB waits half a second at least.
  ft::Ceilings ceilings(double(MiB), 0, false, ft::now_seconds());
  ceilings.pay(ft::OpClass::kDataWrite, {MiB, 5});
  auto start = std::chrono::steady_clock::now();
  ceilings.pay(ft::OpClass::kDataWrite, {MiB / 2, 5});
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(400));
  ceilings.pay(ft::OpClass::kMetaRead, {1 << 30, 1});  // reads do not wait unless asked
  CHECK(ceilings.stats().delayed == 1);
  // A request that would wait ten seconds goes as soon as the mount closes.
  std::thread waiter([&] { ceilings.pay(ft::OpClass::kDataWrite, {10 * MiB, 5}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ceilings.open_up();
  waiter.join();
  CHECK(ceilings.stats().delayed == 2);
}

void test_the_fleet_gate_spends_what_is_handed_out_at_its_pace() {
  std::atomic<int> starved{0};
  ft::FleetGate gate(true, ft::now_seconds(), [&] { starved++; });
  // Nothing before the first lease: the request waits, and the control plane is told at once.
  std::atomic<bool> passed{false};
  std::thread first([&] {
    gate.spend({MiB, 5});
    passed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(!passed && starved == 1 && gate.stats().waiting == 1);
  gate.hand_out(2.0 * MiB, ft::FleetGate::kUnlimited, 0, 0);  // a lease of 2 MiB, unpaced
  first.join();
  CHECK(passed && gate.stats().waiting == 0);
  gate.spend({MiB, 5});  // the rest of the lease
  ft::FleetGateStats s = gate.stats();
  CHECK(s.spent_metered == 2.0 * MiB && s.spent_units == 10 && s.waited == 1);
  // Used up: the next request waits for the next hand-out, which counts from the totals, so
  // what was spent meanwhile is never handed out twice.
  passed = false;
  std::thread second([&] {
    gate.spend({MiB, 5});
    passed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(!passed && starved == 2);
  // A lease paced at 4 MiB/s: 1 MiB over the pace's burst waits about a quarter of a second.
  gate.hand_out(8.0 * MiB, ft::FleetGate::kUnlimited, 4.0 * MiB, 0);
  second.join();
  auto start = std::chrono::steady_clock::now();
  gate.spend({MiB, 5});
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(150));
  // A share that grows wakes the requests already waiting at the old pace.
  gate.hand_out(64.0 * MiB, ft::FleetGate::kUnlimited, 4.0 * MiB, 0);
  std::thread slow([&] { gate.spend({40 * MiB, 5}); });  // ~10 s at 4 MiB/s
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(gate.stats().pacing == 1);
  start = std::chrono::steady_clock::now();
  gate.hand_out(64.0 * MiB, ft::FleetGate::kUnlimited, 1024.0 * MiB, 0);
  slow.join();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  // The mount closes: whatever waits goes.
  gate.hand_out(gate.stats().spent_metered, ft::FleetGate::kUnlimited, 0, 0);  // used up
  std::thread last([&] { gate.spend({MiB, 5}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(gate.stats().waiting == 1);
  gate.open_up();
  last.join();
  // Without a budget the gate takes nothing.
  ft::FleetGate off(false, ft::now_seconds(), nullptr);
  off.spend({MiB, 5});
  CHECK(off.stats().spent_metered == 0);
}

// A request whose caller was answered EINTR while it waits for a lease (or its pace turn)
// leaves the gate by itself, spending nothing, with no hand-out and no close to wake it.
void test_a_request_nobody_waits_for_leaves_the_fleet_gate() {
  ft::FleetGate gate(true, ft::now_seconds(), nullptr);
  std::atomic<bool> gone{false};
  std::atomic<bool> left{false};
  std::thread waiter([&] {
    gate.spend({MiB, 5}, [&] { return gone.load(); });
    left = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(!left && gate.stats().waiting == 1);
  gone = true;
  waiter.join();
  ft::FleetGateStats s = gate.stats();
  CHECK(s.waiting == 0 && s.spent_metered == 0 && s.spent_units == 0);
  // At its pace: a 40 MiB request at 4 MiB/s would wait about 10 s.
  gate.hand_out(64.0 * MiB, ft::FleetGate::kUnlimited, 4.0 * MiB, 0);
  gone = false;
  std::thread paced([&] { gate.spend({40 * MiB, 5}, [&] { return gone.load(); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(gate.stats().pacing == 1);
  gone = true;
  paced.join();
  CHECK(gate.stats().pacing == 0);
}

int main() {
  test_the_fleet_gate_spends_what_is_handed_out_at_its_pace();
  test_a_request_nobody_waits_for_leaves_the_fleet_gate();
  test_the_ceilings_price_by_the_profile_and_hold_a_write_over_the_budget();
  test_pure_rules();
  test_a_file_is_due_at_its_batch_on_release_and_by_age();
  test_under_pressure_the_largest_file_is_synced_below_its_batch();
  test_a_failed_sync_keeps_its_bytes_and_its_error_for_the_application_once();
  test_the_applications_own_fsync_takes_the_bytes_and_truncation_discards_them();
  test_the_gate_holds_a_write_until_a_sync_makes_room();
  test_a_writer_killed_at_the_gate_leaves_it_reserving_nothing();
  test_three_hundred_writers_at_a_full_gate_all_get_through_within_the_window();
  test_a_write_that_never_lands_gives_its_room_back();
  test_a_forgotten_file_is_synced_even_without_injection();
  test_a_file_about_to_be_removed_is_let_go_of_unless_open_or_syncing();
  test_a_removal_waits_for_a_closed_handles_release_but_not_for_an_open_handle();
  test_a_removal_waits_for_a_running_sync_and_drops_one_not_started();
  test_a_file_forgotten_while_it_owes_a_sync_is_found_again_as_itself();
  test_a_files_place_in_the_table_moves_only_as_its_life_allows();
  test_a_removal_waits_for_the_calls_under_way_and_gives_up_at_its_bound();
  test_another_writers_change_renews_the_kernels_inode_only_when_nobody_has_it_open();
  test_a_file_system_without_handles_leaves_the_others_theirs();
  test_the_mounts_own_writes_are_not_taken_for_another_writers();
  if (failures != 0) {
    std::fprintf(stderr, "window_test: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("window_test: all checks passed\n");
  return 0;
}
