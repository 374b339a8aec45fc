// A file's life without a mount, checked against a model: random sequences of what the kernel,
// the flusher and the removals do to the InodeTable and the Window (lookup, open, flush, write,
// admit, sync start/end/fail, the application's fsync, truncate, release, forget, unlink,
// rename, a replaced object, the end's syncs), on real files in a temporary directory so every
// descriptor is real. `make model-test` runs it.
//
// Model mode (one thread): after every step the table and the window are compared with a
// simple model of them: un-synced bytes = reserved + dirty + syncing, the syncs handed out are
// exactly those the model says are due (and why), each file's place in the table, who keeps
// each file alive, and how many descriptors the process has open.
// Threads mode: the same calls from several threads at once; the rules that hold whatever the
// interleaving are checked whenever the threads stop (between rounds) and at the end, when
// everything is let go of and every descriptor must be closed.
//
// model_test [seed [sequences [steps]]]; FT_MODEL_SEED sets the seed too. Every failure names
// the seed, the sequence and the step: the same seed replays the same steps (model mode).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../src/handles.h"
#include "../src/inode.h"
#include "../src/removal.h"
#include "../src/window.h"

namespace {

using ft::Place;
using std::chrono::milliseconds;

int failures = 0;
std::string where;  // seed, sequence and step of what is checked now
// What the steps did (those that found something to do), printed at the end: what a run covered.
std::map<std::string, uint64_t> covered;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: failed: %s (%s)\n", __FILE__, __LINE__, #cond, where.c_str()); \
      failures++;                                                                        \
    }                                                                                    \
  } while (0)

// splitmix64: small, and the same sequence for the same seed everywhere.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
  bool chance(unsigned percent) { return next() % 100 < percent; }
};

// The process's open descriptors (the directory read to count them aside).
size_t open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  size_t n = 0;
  while (struct dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') n++;
  }
  ::closedir(dir);
  return n - 1;
}

constexpr uint64_t KiB = 1024;
constexpr size_t kNames = 5;

ft::WindowParams params(bool inject) {
  ft::WindowParams p;
  p.window = 64 * KiB;  // sync_trigger: 16 KiB
  p.batch = 16 * KiB;
  p.max_age = 30;
  p.admission_timeout = 60;
  p.inject = inject;
  return p;
}

std::string name_of(size_t i) { return "f" + std::to_string(i); }

// A temporary directory of real files, removed with what is left in it.
struct Scratch {
  std::string path;
  ft::Fd dir;
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string made = std::string(tmp != nullptr ? tmp : "/tmp") + "/ft-model-XXXXXX";
    if (::mkdtemp(made.data()) == nullptr) {
      std::perror("model_test: mkdtemp");
      std::exit(2);
    }
    path = made;
    dir = ft::Fd(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  }
  ~Scratch() {
    for (size_t i = 0; i < kNames; i++) ::unlinkat(dir.get(), name_of(i).c_str(), 0);
    dir.reset();
    ::rmdir(path.c_str());
  }
  bool exists(const std::string& name) const {
    struct stat st {};
    return ::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  }
  bool create(const std::string& name) const {
    ft::Fd fd(::openat(dir.get(), name.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644));
    return static_cast<bool>(fd);
  }
};

// --- model mode -------------------------------------------------------------------------------

// The model of one node: where the table keeps it, and its ledger as the window should hold it.
struct MFile {
  std::weak_ptr<ft::Inode> real;
  const ft::Inode* raw = nullptr;
  ft::InodeKey key{};
  std::string handle;
  uint64_t lookups = 0;
  Place place = Place::kKnown;
  uint64_t dirty = 0, syncing = 0;
  int error = 0, errors = 0;
  bool backoff = false;  // a sync failed and none ended well since: not ready before its retry
  bool released = false, queued = false, held = false, kept = false;
  int opens = 0, closing = 0;
  int apps = 0, jobs = 0;  // the application's fsyncs and the flusher's jobs under way
  bool owes() const { return dirty > 0 || syncing > 0 || error != 0 || queued; }
  bool forgotten() const { return place == Place::kOwing || place == Place::kGone; }
  bool in_table() const { return place != Place::kGone; }
  bool alive() const { return in_table() || kept || opens > 0 || apps > 0 || jobs > 0; }
};

struct MHandle {
  std::shared_ptr<ft::OpenFile> file;
  MFile* m;
  bool closing = false;
};
struct MJob {
  ft::SyncJob job;
  MFile* m;
};
struct MApp {
  std::shared_ptr<ft::Inode> inode;
  MFile* m;
  uint64_t bytes;
};

struct KeyLess {
  bool operator()(const ft::InodeKey& a, const ft::InodeKey& b) const {
    return a.dev != b.dev ? a.dev < b.dev : a.ino < b.ino;
  }
};

class Model {
 public:
  Model(uint64_t seed, bool inject)
      : rng_{seed}, inject_(inject), window_(params(inject)) {
    window_.when_settled([this](const std::shared_ptr<ft::Inode>& inode) { table_.settled(inode); });
  }
  ~Model() = default;

  void run(size_t steps, const std::string& label) {
    for (size_t step = 0; step < steps && failures == 0; step++) {
      where = label + " step " + std::to_string(step);
      std::string op = one_step();
      where = label + " step " + std::to_string(step) + " (" + op + ")";
      if (op.back() != '-') covered[op.substr(0, op.find_first_of(" 0123456789"))]++;
      check();
    }
    where = label + " end";
    if (failures == 0) end();
  }

 private:
  // --- the model's rules, mirroring the window's ---
  uint64_t unsynced() const {
    uint64_t in_files = 0;
    for (auto& m : files_) in_files += m->dirty + m->syncing;
    return reserved_ + in_files;
  }
  // A file that owes nothing more leaves the window; a forgotten one leaves the table too,
  // unless looked up again since (InodeTable::settled).
  void collect(MFile& m) {
    if (m.owes()) return;
    if (m.held) {
      m.held = false;
      held_--;
    }
    if (!m.kept) return;
    m.kept = false;
    if (m.forgotten() && m.lookups == 0 && known_.count(m.key) && known_[m.key] == &m) {
      known_.erase(m.key);
      m.place = Place::kGone;
    }
  }
  void begin(MFile& m, MJob& job) {
    CHECK(job.job.bytes == m.dirty);
    CHECK(static_cast<bool>(job.job.held) == m.held);
    if (m.held) {
      m.held = false;
      held_--;
    }
    m.syncing += m.dirty;
    m.dirty = 0;
    m.released = false;
    m.queued = true;
    m.jobs++;
  }
  struct Due {
    MFile* m;
    ft::SyncReason reason;
  };
  // What Window::due hands out at a time before every write (*future* false: nothing is old,
  // no close gathered, no retry's time has come) or long after them all (true).
  std::vector<Due> due(bool future, std::vector<MFile*>* largest) {
    std::vector<MFile*> ready;
    uint64_t in_flight = 0;
    bool gathered = false;
    for (auto& m : files_) {
      if (!m->kept) continue;
      in_flight += m->syncing;
      if (m->dirty > 0 && !m->queued && (future || !m->backoff)) {
        ready.push_back(m.get());
        gathered = gathered || (future && m->released);
      }
    }
    std::vector<Due> out;
    uint64_t trigger = ft::sync_trigger(params(inject_).batch, params(inject_).window);
    for (MFile* m : ready) {
      if (m->forgotten()) {
        out.push_back({m, ft::SyncReason::kForget});
      } else if (!inject_) {
        continue;
      } else if (m->dirty >= trigger) {
        out.push_back({m, ft::SyncReason::kBatch});
      } else if (m->released) {
        if (gathered) out.push_back({m, ft::SyncReason::kRelease});
      } else if (future) {
        out.push_back({m, ft::SyncReason::kAge});
      }
    }
    bool pressure = unsynced() * 2 >= params(inject_).window;
    if (inject_ && pressure && out.empty() && !ready.empty() &&
        (in_flight < unsynced() / 2 || in_flight == 0)) {
      uint64_t most = 0;
      for (MFile* m : ready) most = std::max(most, m->dirty);
      for (MFile* m : ready) {
        if (m->dirty == most) largest->push_back(m);  // any of them (ties: by age)
      }
    }
    return out;
  }

  MFile* model_of(const ft::Inode* inode) {
    for (auto& m : files_) {
      if (m->raw == inode && !m->real.expired()) return m.get();
    }
    return nullptr;
  }
  // A node the kernel holds (at least one lookup), or null.
  MFile* held_node(bool open_ok = true) {
    std::vector<MFile*> out;
    for (auto& m : files_) {
      if (m->lookups > 0 && (open_ok || m->place != Place::kDetached)) out.push_back(m.get());
    }
    return out.empty() ? nullptr : out[rng_.below(out.size())];
  }
  std::shared_ptr<ft::Inode> share(MFile& m) { return table_.share(reinterpret_cast<fuse_ino_t>(m.raw)); }

  // --- the steps ---
  std::string one_step() {
    switch (rng_.below(20)) {
      case 0: return create();
      case 1: case 2: return lookup();
      case 3: case 4: return open();
      case 5: return admit();
      case 6: case 7: return write();
      case 8: return flush_or_use();
      case 9: case 10: return release();
      case 11: case 12: return sync_start();
      case 13: return sync_end();
      case 14: return app_sync();
      case 15: return rng_.chance(50) ? take_error() : discard();
      case 16: return forget();
      case 17: return remove();
      case 18: return rng_.chance(30) ? replace() : abandon();
      default: return rng_.chance(20) ? stop() : lookup();
    }
  }

  std::string create() {
    std::string name = name_of(rng_.below(kNames));
    if (objects_.count(name) || !dir_.create(name)) return "create -";
    objects_[name] = "o" + std::to_string(++made_);
    return "create " + name;
  }

  std::string lookup() {
    std::string name = name_of(rng_.below(kNames));
    if (!objects_.count(name)) return "lookup -";
    ft::Fd fd(::openat(dir_.dir.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) {
      CHECK(false);
      return "lookup failed";
    }
    ft::InodeKey key{st.st_dev, st.st_ino};
    const std::string& handle = objects_[name];
    MFile* slot = known_.count(key) ? known_[key] : nullptr;
    if (slot != nullptr && slot->handle != handle) {  // its key names another object now
      covered[slot->lookups != 0 ? "(retired)" : "(owing, its key taken)"]++;
      slot->place = slot->lookups != 0 ? Place::kRetired : Place::kGone;
      known_.erase(key);
      slot = nullptr;
    }
    if (slot != nullptr && slot->place == Place::kOwing) covered["(owing, found again)"]++;
    fuse_ino_t node = table_.remember(std::move(fd), st, handle);
    if (slot == nullptr) {
      auto m = std::make_unique<MFile>();
      m->real = table_.share(node);
      m->raw = m->real.lock().get();
      CHECK(model_of(m->raw) == nullptr);  // a new node, not one still held
      m->key = key;
      m->handle = handle;
      slot = m.get();
      files_.push_back(std::move(m));
      known_[key] = slot;
    }
    CHECK(node == reinterpret_cast<fuse_ino_t>(slot->raw));
    slot->place = Place::kKnown;
    slot->lookups++;
    return "lookup " + name;
  }

  std::string open() {
    MFile* m = held_node(false);
    if (m == nullptr) return "open -";
    auto inode = share(*m);
    ft::Fd fd(::open(ft::proc_path(inode->fd()).c_str(), O_RDWR | O_CLOEXEC));
    if (!fd) {
      CHECK(false);
      return "open failed";
    }
    window_.opening(inode);
    auto file = std::make_shared<ft::OpenFile>(handles_, window_, inode);
    file->fd = std::move(fd);
    handles_held_.push_back(MHandle{std::move(file), m});
    m->opens++;
    return "open";
  }

  std::string flush_or_use() {
    if (handles_held_.empty()) return "flush -";
    MHandle& h = handles_held_[rng_.below(handles_held_.size())];
    if (rng_.chance(60)) {
      h.file->flushed();
      if (!h.closing) h.m->closing++;
      h.closing = true;
      return "flush";
    }
    h.file->used();
    if (h.closing) h.m->closing--;
    h.closing = false;
    return "use";
  }

  std::string release() {
    if (handles_held_.empty()) return "release -";
    size_t i = rng_.below(handles_held_.size());
    MFile& m = *handles_held_[i].m;
    bool closing = handles_held_[i].closing;
    handles_held_.erase(handles_held_.begin() + static_cast<ptrdiff_t>(i));  // the release
    m.opens--;
    if (closing) m.closing--;
    if (m.opens == 0 && m.dirty > 0) {
      m.released = true;
      if (!m.held) {
        m.held = true;
        held_++;
      }
    }
    return "release";
  }

  std::string admit() {
    uint64_t n = (1 + rng_.below(8)) * KiB;
    uint64_t before = unsynced();
    bool fits = before == 0 || before + n <= params(inject_).window;
    bool got = window_.admit(n, [] { return true; });  // a full gate refuses at once
    CHECK(got == fits);
    if (got) {
      reservations_.push_back(n);
      reserved_ += n;
    }
    return got ? "admit" : "admit refused";
  }

  std::string write() {
    if (reservations_.empty() || handles_held_.empty()) return "write -";
    size_t r = rng_.below(reservations_.size());
    uint64_t bytes = reservations_[r];
    reservations_.erase(reservations_.begin() + static_cast<ptrdiff_t>(r));
    MHandle& h = handles_held_[rng_.below(handles_held_.size())];
    uint64_t written = rng_.chance(10) ? 0 : rng_.chance(10) ? bytes / 2 : bytes;
    int64_t off = static_cast<int64_t>(rng_.below(64) * KiB);
    window_.landed(share(*h.m), bytes, static_cast<int64_t>(written), off);
    reserved_ -= bytes;
    if (written > 0) {
      h.m->dirty += written;
      h.m->released = false;
      h.m->kept = true;
    }
    return "write";
  }

  std::string abandon() {
    if (reservations_.empty()) return "abandon -";
    uint64_t bytes = reservations_.back();
    reservations_.pop_back();
    { ft::Window::Reservation dropped(window_, bytes); }  // a handler that threw before landing
    reserved_ -= bytes;
    return "abandon";
  }

  std::string sync_start() {
    bool future = rng_.chance(50);
    std::vector<MFile*> largest;
    std::vector<Due> expected = due(future, &largest);
    double at = future ? ft::now_seconds() + 1e6 : start_ - 1;
    std::vector<ft::SyncJob> jobs = window_.take_due(at);
    if (!largest.empty()) {
      CHECK(jobs.size() == 1);
      if (jobs.size() == 1) {
        MFile* m = model_of(jobs[0].inode.get());
        CHECK(std::find(largest.begin(), largest.end(), m) != largest.end());
        CHECK(jobs[0].reason == ft::SyncReason::kWindow);
      }
    } else {
      if (jobs.size() != expected.size()) {
        std::string got, want;
        for (auto& job : jobs) got += " " + std::to_string(static_cast<int>(job.reason));
        for (auto& e : expected) want += " " + std::to_string(static_cast<int>(e.reason));
        where += ": handed out reasons" + got + ", the model's" + want;
      }
      CHECK(jobs.size() == expected.size());
      for (auto& job : jobs) {
        MFile* m = model_of(job.inode.get());
        bool found = false;
        for (auto& e : expected) found = found || (e.m == m && e.reason == job.reason);
        CHECK(found);
      }
    }
    for (auto& job : jobs) {
      MFile* m = model_of(job.inode.get());
      covered["(synced as forgotten)"] += job.reason == ft::SyncReason::kForget ? 1 : 0;
      if (m == nullptr) {
        CHECK(false);
        continue;
      }
      jobs_.push_back(MJob{std::move(job), m});
      begin(*m, jobs_.back());
    }
    return future ? "sync start (late)" : "sync start (early)";
  }

  std::string stop() {
    std::vector<MFile*> expected;
    for (auto& m : files_) {
      if (m->kept && m->dirty > 0 && !m->queued) expected.push_back(m.get());
    }
    std::vector<ft::SyncJob> jobs = window_.take_all_dirty();
    CHECK(jobs.size() == expected.size());
    for (auto& job : jobs) {
      MFile* m = model_of(job.inode.get());
      CHECK(std::find(expected.begin(), expected.end(), m) != expected.end());
      CHECK(job.reason == ft::SyncReason::kEnd);
      if (m == nullptr) continue;
      jobs_.push_back(MJob{std::move(job), m});
      begin(*m, jobs_.back());
    }
    return "stop";
  }

  std::string sync_end() {
    if (jobs_.empty()) return "sync end -";
    size_t i = rng_.below(jobs_.size());
    MJob job = std::move(jobs_[i]);
    jobs_.erase(jobs_.begin() + static_cast<ptrdiff_t>(i));
    static const int outcomes[] = {0, 0, 0, EIO, ESTALE, ft::Window::kNotSynced};
    int error = outcomes[rng_.below(6)];
    CHECK(!window_.removing(*job.job.inode));
    uint64_t bytes = job.job.bytes;
    window_.end_sync(job.job, error);
    MFile& m = *job.m;
    m.queued = false;
    m.jobs--;
    uint64_t covered = std::min(bytes, m.syncing);
    m.syncing -= covered;
    if (error == 0 || error == ESTALE || error == ft::Window::kNotSynced) {
      m.errors = 0;
      m.backoff = false;
    } else {
      m.errors++;
      m.error = error;
      m.dirty += covered;
      m.backoff = true;
    }
    collect(m);
    return "sync end " + std::to_string(error);
  }

  std::string app_sync() {
    if (!apps_.empty() && rng_.chance(50)) {
      MApp app = std::move(apps_.back());
      apps_.pop_back();
      int error = rng_.chance(20) ? EIO : 0;
      window_.end_app_sync(*app.inode, app.bytes, error);
      MFile& m = *app.m;
      m.apps--;
      m.syncing -= std::min(app.bytes, m.syncing);
      collect(m);
      return "app sync end";
    }
    MFile* m = held_node();
    if (m == nullptr) return "app sync -";
    auto inode = share(*m);
    uint64_t bytes = window_.begin_app_sync(*inode);
    CHECK(bytes == m->dirty);
    m->syncing += m->dirty;
    m->dirty = 0;
    m->apps++;
    apps_.push_back(MApp{std::move(inode), m, bytes});
    return "app sync begin";
  }

  std::string take_error() {
    MFile* m = held_node();
    if (m == nullptr) return "take error -";
    int error = window_.take_error(*share(*m));
    CHECK(error == m->error);
    m->error = 0;
    if (error != 0) {
      m->errors = 0;
      collect(*m);
    }
    return "take error";
  }

  std::string discard() {
    MFile* m = held_node();
    if (m == nullptr) return "discard -";
    window_.discard(*share(*m));
    m->dirty = 0;
    collect(*m);
    return "discard";
  }

  std::string forget() {
    MFile* m = held_node();
    if (m == nullptr) return "forget -";
    // The kernel holds a node while it is open or a request on it runs.
    uint64_t keep = m->opens > 0 || m->apps > 0 ? 1 : 0;
    if (m->lookups <= keep) return "forget -";
    uint64_t n = 1 + rng_.below(m->lookups - keep);
    m->lookups -= n;
    auto owed = [this](const std::shared_ptr<ft::Inode>& inode) { return window_.forgotten(inode); };
    auto gone = table_.forget(reinterpret_cast<fuse_ino_t>(m->raw), n, owed);
    if (m->lookups != 0) {
      CHECK(gone == nullptr);
      return "forget";
    }
    if (m->place == Place::kDetached || m->place == Place::kRetired) {
      m->place = Place::kGone;
      CHECK(gone != nullptr);
      m->kept = m->kept || m->owes();
    } else if (m->owes()) {
      m->place = Place::kOwing;
      m->kept = true;
      CHECK(gone == nullptr);
    } else {
      m->place = Place::kGone;
      known_.erase(m->key);
      CHECK(gone != nullptr);
    }
    return "forget all";
  }

  // Its object on the target replaced by another host under the same inode number.
  std::string replace() {
    std::string name = name_of(rng_.below(kNames));
    if (!objects_.count(name)) return "replace -";
    objects_[name] = "o" + std::to_string(++made_);
    return "replace " + name;
  }

  // A removal of the last name of *name* (unlink, or rename over it), *failed* or not, as
  // LetGo does it; *remove* removes it.
  void removal_of(const std::string& name, bool failed, const std::function<int()>& remove) {
    struct stat st {};
    MFile* m = nullptr;
    if (::fstatat(dir_.dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      ft::InodeKey key{st.st_dev, st.st_ino};
      if (known_.count(key)) m = known_[key];
    }
    bool detached = false;
    if (m != nullptr && m->opens == 0 && !m->queued && m->syncing == 0) {
      m->dirty = 0;
      m->error = 0;
      m->errors = 0;
      m->released = false;
      collect(*m);
      if (known_.count(m->key) && known_[m->key] == m) {
        m->place = m->lookups != 0 ? Place::kDetached : Place::kGone;
        known_.erase(m->key);
        detached = true;
        covered["(let go of before its removal)"]++;
      }
    }
    ft::LetGo held(table_, window_, dir_.dir.get(), name.c_str(), milliseconds(0));
    int rc = failed ? EBUSY : remove() == 0 ? 0 : errno;
    CHECK(rc == 0 || failed);
    held.removed(rc);
    if (rc != 0 && detached && m->place == Place::kDetached) {  // held by its name again
      covered["(held again after a failed removal)"]++;
      m->place = Place::kKnown;
      known_[m->key] = m;
    }
  }

  std::string remove() {
    std::string name = name_of(rng_.below(kNames));
    if (!objects_.count(name)) return "remove -";
    bool failed = rng_.chance(20);
    if (rng_.chance(50)) {
      removal_of(name, failed, [&] { return ::unlinkat(dir_.dir.get(), name.c_str(), 0); });
      if (!failed) objects_.erase(name);
      return failed ? "unlink (failed) " + name : "unlink " + name;
    }
    std::string from = name_of(rng_.below(kNames));
    if (from == name || !objects_.count(from)) return "rename -";
    removal_of(name, failed, [&] {
      return ::renameat(dir_.dir.get(), from.c_str(), dir_.dir.get(), name.c_str());
    });
    if (!failed) {
      objects_[name] = objects_[from];
      objects_.erase(from);
    }
    return (failed ? "rename (failed) " : "rename ") + from + " " + name;
  }

  // --- the checks ---
  void check() {
    ft::WindowStats s = window_.stats();
    uint64_t dirty = 0, syncing = 0, kept_syncing = 0;
    size_t alive = 0, in_table = 0, held = 0;
    std::set<const ft::Inode*> owing_expected, nodes_expected;
    for (auto& m : files_) {
      dirty += m->dirty;
      syncing += m->syncing;
      if (m->kept) kept_syncing += m->syncing;
      CHECK(m->kept == m->owes());  // in the window exactly while it owes
      std::shared_ptr<ft::Inode> real = m->real.lock();
      CHECK(static_cast<bool>(real) == m->alive());
      if (!real) continue;
      alive++;
      if (m->in_table()) in_table++;
      if (m->held) held++;
      const ft::FileLedger& f = real->ledger;
      CHECK(real->place() == m->place);
      CHECK(f.dirty == m->dirty && f.syncing == m->syncing);
      CHECK(f.error == m->error && f.queued == m->queued);
      CHECK(f.opens == m->opens && f.closing == m->closing);
      CHECK(f.released == m->released && static_cast<bool>(f.held) == m->held);
      if (m->kept && (m->dirty > 0 || m->syncing > 0 || m->error != 0)) owing_expected.insert(m->raw);
      if ((m->place == Place::kKnown && m->lookups > 0) || m->place == Place::kDetached ||
          m->place == Place::kRetired) {
        nodes_expected.insert(m->raw);
      }
      if (m->place == Place::kKnown || m->place == Place::kOwing)
        CHECK(table_.find(m->key) == real);
    }
    CHECK(s.reserved == reserved_);
    CHECK(s.unsynced == reserved_ + dirty + syncing);  // reserved + dirty + syncing
    CHECK(s.syncing == kept_syncing);
    std::set<const ft::Inode*> owing;
    for (auto& [inode, error] : window_.owing()) owing.insert(inode.get());
    CHECK(owing == owing_expected);
    std::set<const ft::Inode*> nodes;
    for (fuse_ino_t node : table_.nodes()) nodes.insert(reinterpret_cast<const ft::Inode*>(node));
    CHECK(nodes == nodes_expected);
    CHECK(table_.size() == in_table);
    CHECK(table_.illegal_moves() == 0);
    CHECK(handles_.load() == handles_held_.size());
    size_t jobs_held = 0;
    for (auto& job : jobs_) jobs_held += job.job.held ? 1 : 0;
    // The placeholder, each live node's descriptor, each open handle's, those held for syncs.
    CHECK(open_fds() == base_fds_ + 1 + alive + handles_held_.size() + held + jobs_held);
    CHECK(held == held_);
    // The dead leave the model (their addresses may be a new node's).
    std::erase_if(files_, [](const std::unique_ptr<MFile>& m) { return m->real.expired(); });
  }

  // Everything let go of as at the end of a mount: nothing left, every descriptor closed.
  void end() {
    for (auto& job : jobs_) {
      window_.end_sync(job.job, 0);
      job.m->jobs--;
    }
    jobs_.clear();
    for (auto& app : apps_) window_.end_app_sync(*app.inode, app.bytes, 0);
    apps_.clear();
    handles_held_.clear();
    for (uint64_t bytes : reservations_) window_.landed(nullptr, bytes, 0, 0);
    reservations_.clear();
    auto owed = [this](const std::shared_ptr<ft::Inode>& inode) { return window_.forgotten(inode); };
    for (auto& m : files_) {
      if (m->lookups > 0) table_.forget(reinterpret_cast<fuse_ino_t>(m->raw), m->lookups, owed);
    }
    for (int round = 0; round < 4; round++) {
      for (auto& job : window_.take_all_dirty()) window_.end_sync(job, 0);
      for (auto& [inode, error] : window_.owing()) window_.take_error(*inode);
    }
    CHECK(window_.owing().empty());
    CHECK(window_.stats().unsynced == 0);
    CHECK(table_.size() == 0);
    CHECK(table_.illegal_moves() == 0);
    for (auto& m : files_) CHECK(m->real.expired());
    CHECK(handles_.load() == 0);
    files_.clear();
  }

 public:
  size_t base_fds_ = 0;

 private:
  Rng rng_;
  bool inject_;
  double start_ = ft::now_seconds();
  Scratch dir_;
  ft::InodeTable table_;
  ft::Window window_;
  std::atomic<uint64_t> handles_{0};
  std::vector<std::unique_ptr<MFile>> files_;
  std::map<ft::InodeKey, MFile*, KeyLess> known_;
  std::map<std::string, std::string> objects_;  // name -> the object's handle
  uint64_t made_ = 0;
  uint64_t reserved_ = 0;
  size_t held_ = 0;
  std::vector<uint64_t> reservations_;
  std::vector<MHandle> handles_held_;
  std::vector<MJob> jobs_;
  std::vector<MApp> apps_;
};

void model_mode(uint64_t seed, size_t sequences, size_t steps) {
  Rng seeds{seed};
  for (size_t i = 0; i < sequences && failures == 0; i++) {
    uint64_t sequence_seed = seeds.next();
    bool inject = i % 4 != 3;  // one in four as mode=off: only forgotten files are synced
    std::string label = "seed " + std::to_string(seed) + " sequence " + std::to_string(i);
    size_t before = open_fds();
    {
      Model model(sequence_seed, inject);
      model.base_fds_ = before + 1;  // the scratch directory
      model.run(steps, label);
    }
    where = label + " after";
    CHECK(open_fds() == before);  // every descriptor closed
  }
  std::printf("model_test: model mode covered");
  for (auto& [what, n] : covered) std::printf(" %s %llu,", what.c_str(), static_cast<unsigned long long>(n));
  std::printf("\n");
}

// --- threads mode -----------------------------------------------------------------------------

struct Shared {
  Scratch dir;
  ft::InodeTable table;
  ft::Window window{params(true)};
  std::atomic<uint64_t> handles{0};
  std::mutex lock;  // guards what follows
  std::vector<ft::SyncJob> jobs;
  std::vector<std::weak_ptr<ft::Inode>> seen;
};

struct THandle {
  std::shared_ptr<ft::OpenFile> file;
  std::shared_ptr<ft::Inode> inode;
  bool closing = false;
};

// One thread's part: its lookups (the kernel's, counted per node), its open handles.
struct Worker {
  Rng rng;
  std::map<fuse_ino_t, uint64_t> lookups;
  std::vector<THandle> handles;

  fuse_ino_t node(Rng& r) {
    if (lookups.empty()) return 0;
    auto it = lookups.begin();
    std::advance(it, static_cast<ptrdiff_t>(r.below(lookups.size())));
    return it->first;
  }
  uint64_t opens_of(fuse_ino_t node) const {
    uint64_t n = 0;
    for (auto& h : handles) n += reinterpret_cast<fuse_ino_t>(h.inode.get()) == node ? 1 : 0;
    return n;
  }

  void step(Shared& s) {
    auto owed = [&s](const std::shared_ptr<ft::Inode>& inode) { return s.window.forgotten(inode); };
    std::string name = name_of(rng.below(kNames));
    int dir = s.dir.dir.get();
    switch (rng.below(16)) {
      case 0: s.dir.create(name); break;
      case 1: case 2: case 15: lookup(s, name); break;
      case 3: {  // open
        fuse_ino_t n = node(rng);
        if (n == 0) break;
        auto inode = s.table.share(n);
        ft::Using use(inode);
        if (!use) break;  // let go of: answered as a removed file
        ft::Fd fd(::open(ft::proc_path(inode->fd()).c_str(), O_RDWR | O_CLOEXEC));
        if (!fd) break;
        s.window.opening(inode);
        auto file = std::make_shared<ft::OpenFile>(s.handles, s.window, inode);
        file->fd = std::move(fd);
        handles.push_back(THandle{std::move(file), inode});
        break;
      }
      case 4: case 5: {  // write
        if (handles.empty()) break;
        THandle& h = handles[rng.below(handles.size())];
        uint64_t bytes = (1 + rng.below(8)) * KiB;
        auto give_up = std::chrono::steady_clock::now() + milliseconds(20);
        if (!s.window.admit(bytes, [give_up] { return std::chrono::steady_clock::now() > give_up; }))
          break;
        ft::Window::Reservation reserved(s.window, bytes);
        if (rng.chance(10)) break;  // the handler failed before the write
        h.file->used();
        h.closing = false;
        s.window.landed(h.inode, reserved.take(), static_cast<int64_t>(bytes),
                        static_cast<int64_t>(rng.below(64) * KiB));
        break;
      }
      case 6: {  // flush, or release
        if (handles.empty()) break;
        size_t i = rng.below(handles.size());
        if (rng.chance(50) && !handles[i].closing) {
          handles[i].file->flushed();
          handles[i].closing = true;
        } else {
          handles.erase(handles.begin() + static_cast<ptrdiff_t>(i));
        }
        break;
      }
      case 7: {  // the flusher hands out syncs
        auto jobs = s.window.take_due(rng.chance(50) ? ft::now_seconds() + 1e6 : ft::now_seconds());
        if (rng.chance(10)) {
          for (auto& job : s.window.take_all_dirty()) jobs.push_back(std::move(job));
        }
        std::lock_guard<std::mutex> guard(s.lock);
        for (auto& job : jobs) s.jobs.push_back(std::move(job));
        break;
      }
      case 8: case 9: {  // a sync ends
        ft::SyncJob job;
        {
          std::lock_guard<std::mutex> guard(s.lock);
          if (s.jobs.empty()) break;
          size_t i = rng.below(s.jobs.size());
          job = std::move(s.jobs[i]);
          s.jobs.erase(s.jobs.begin() + static_cast<ptrdiff_t>(i));
        }
        if (s.window.removing(*job.inode)) {
          s.window.dropped(job);
        } else {
          static const int outcomes[] = {0, 0, 0, EIO, ESTALE};
          s.window.end_sync(job, outcomes[rng.below(5)]);
        }
        break;
      }
      case 10: {  // the application's fsync, its error, a truncate to nothing, a stat
        fuse_ino_t n = node(rng);
        if (n == 0) break;
        auto inode = s.table.share(n);
        switch (rng.below(4)) {
          case 0: s.window.end_app_sync(*inode, s.window.begin_app_sync(*inode), rng.chance(20) ? EIO : 0); break;
          case 1: s.window.take_error(*inode); break;
          case 2: s.window.discard(*inode); break;
          default: {
            ft::Using use(inode);
            struct stat st {};
            if (use) ::fstat(inode->fd(), &st);
          }
        }
        break;
      }
      case 11: case 12: {  // forget
        fuse_ino_t n = node(rng);
        if (n == 0) break;
        uint64_t keep = opens_of(n) > 0 ? 1 : 0;
        if (lookups[n] <= keep) break;
        uint64_t count = 1 + rng.below(lookups[n] - keep);
        lookups[n] -= count;
        if (lookups[n] == 0) lookups.erase(n);
        s.table.forget(n, count, owed);
        break;
      }
      case 13: case 14: {  // unlink, or rename over
        bool failed = rng.chance(20);
        std::string from = name_of(rng.below(kNames));
        bool rename = rng.chance(50) && from != name;
        ft::LetGo held(s.table, s.window, dir, name.c_str(), milliseconds(20));
        int rc = failed ? EBUSY
                 : (rename ? ::renameat(dir, from.c_str(), dir, name.c_str())
                           : ::unlinkat(dir, name.c_str(), 0)) == 0
                     ? 0
                     : errno;
        held.removed(rc);
        break;
      }
    }
  }

  void lookup(Shared& s, const std::string& name) {
    ft::Fd fd(::openat(s.dir.dir.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) return;
    std::string handle = ft::handle_of(fd.get(), st.st_dev);
    fuse_ino_t n = s.table.remember(std::move(fd), st, std::move(handle));
    lookups[n]++;
    std::lock_guard<std::mutex> guard(s.lock);
    s.seen.push_back(s.table.share(n));
  }
};

// The rules that hold whatever the interleaving, checked with every thread stopped.
void check_quiescent(Shared& s, std::vector<Worker>& workers) {
  std::map<const ft::Inode*, uint64_t> lookups, opens, closing;
  for (auto& w : workers) {
    for (auto& [node, n] : w.lookups) lookups[reinterpret_cast<const ft::Inode*>(node)] += n;
    for (auto& h : w.handles) {
      opens[h.inode.get()]++;
      if (h.closing) closing[h.inode.get()]++;
    }
  }
  std::set<const ft::Inode*> in_jobs;
  for (auto& job : s.jobs) in_jobs.insert(job.inode.get());
  std::set<const ft::Inode*> owing;
  for (auto& [inode, error] : s.window.owing()) owing.insert(inode.get());
  ft::WindowStats st = s.window.stats();
  CHECK(st.reserved == 0);
  uint64_t in_files = 0;
  std::set<const ft::Inode*> alive;
  size_t in_table = 0;
  for (auto& weak : s.seen) {
    std::shared_ptr<ft::Inode> inode = weak.lock();
    if (!inode || !alive.insert(inode.get()).second) continue;
    const ft::FileLedger& f = inode->ledger;
    in_files += f.dirty + f.syncing;
    uint64_t held = lookups[inode.get()];
    Place place = inode->place();
    if (held > 0) {
      CHECK(place == Place::kKnown || place == Place::kDetached || place == Place::kRetired);
    } else {
      CHECK(place == Place::kOwing || place == Place::kGone);
    }
    if (place != Place::kGone) in_table++;
    if (place == Place::kOwing) CHECK(f.owes() && s.table.find(inode->key()) == inode);
    if (place == Place::kKnown) CHECK(s.table.find(inode->key()) == inode);
    CHECK(f.opens == static_cast<int>(opens[inode.get()]));
    CHECK(f.closing == static_cast<int>(closing[inode.get()]));
    CHECK(f.queued == (in_jobs.count(inode.get()) > 0));
    CHECK(owing.count(inode.get()) == (f.dirty > 0 || f.syncing > 0 || f.error != 0 ? 1u : 0u));
    // Alive only while something holds it: the table, the window (it owes), a handle, a job.
    CHECK(place != Place::kGone || f.owes() || f.opens > 0 || in_jobs.count(inode.get()));
  }
  CHECK(st.unsynced == st.reserved + in_files);
  CHECK(s.table.size() == in_table);
  CHECK(s.table.illegal_moves() == 0);
  size_t handles = 0;
  for (auto& w : workers) handles += w.handles.size();
  CHECK(s.handles.load() == handles);
  // A forgotten file is synced as one at once (whatever the mode), a file the kernel holds is
  // not: the due set agrees with the table.
  for (auto& job : s.window.take_due(ft::now_seconds() + 1e6)) {
    bool forgotten = lookups[job.inode.get()] == 0;
    CHECK((job.reason == ft::SyncReason::kForget) == forgotten);
    s.jobs.push_back(std::move(job));
  }
  for (auto& weak : s.seen) {
    std::shared_ptr<ft::Inode> inode = weak.lock();
    if (!inode) continue;
    const ft::FileLedger& f = inode->ledger;
    CHECK(!(f.dirty > 0 && !f.queued));  // every file with dirty bytes was due
  }
  std::erase_if(s.seen, [](const std::weak_ptr<ft::Inode>& w) { return w.expired(); });
}

void threads_mode(uint64_t seed, size_t rounds, size_t steps, size_t threads) {
  size_t before = open_fds();
  {
    Shared s;
    s.window.when_settled([&s](const std::shared_ptr<ft::Inode>& inode) { s.table.settled(inode); });
    std::vector<Worker> workers(threads);
    for (size_t t = 0; t < threads; t++) workers[t].rng.state = seed * 7919 + t;
    for (size_t round = 0; round < rounds && failures == 0; round++) {
      std::vector<std::thread> running;
      for (auto& w : workers) {
        running.emplace_back([&w, &s, steps] {
          for (size_t i = 0; i < steps; i++) w.step(s);
        });
      }
      for (auto& t : running) t.join();
      where = "threads seed " + std::to_string(seed) + " round " + std::to_string(round);
      check_quiescent(s, workers);
    }
    // The end: every handle released, every sync ended, every lookup forgotten.
    where = "threads seed " + std::to_string(seed) + " end";
    for (auto& w : workers) w.handles.clear();
    for (auto& job : s.jobs) s.window.end_sync(job, 0);
    s.jobs.clear();
    auto owed = [&s](const std::shared_ptr<ft::Inode>& inode) { return s.window.forgotten(inode); };
    for (auto& w : workers) {
      for (auto& [node, n] : w.lookups) s.table.forget(node, n, owed);
      w.lookups.clear();
    }
    for (int round = 0; round < 4; round++) {
      for (auto& job : s.window.take_all_dirty()) s.window.end_sync(job, 0);
      for (auto& [inode, error] : s.window.owing()) s.window.take_error(*inode);
    }
    CHECK(s.window.owing().empty());
    CHECK(s.window.stats().unsynced == 0);
    CHECK(s.table.size() == 0);
    CHECK(s.table.illegal_moves() == 0);
    CHECK(s.handles.load() == 0);
    for (auto& weak : s.seen) CHECK(weak.expired());
  }
  where = "threads seed " + std::to_string(seed) + " after";
  CHECK(open_fds() == before);  // every descriptor closed
}

// What the random sequences found, kept as a test of its own: a file the kernel forgot while
// it owed a sync and then looked up again (a plain lookup, no open) is the kernel's again, and
// is not synced as a forgotten one (at once, even with injection off).
void test_a_forgotten_file_looked_up_again_is_not_synced_as_forgotten() {
  where = "forgotten, then looked up again";
  Scratch dir;
  ft::InodeTable table;
  ft::Window window(params(false));  // mode=off: only forgotten files are synced
  window.when_settled([&table](const std::shared_ptr<ft::Inode>& inode) { table.settled(inode); });
  auto owed = [&window](const std::shared_ptr<ft::Inode>& inode) { return window.forgotten(inode); };
  CHECK(dir.create("f0"));
  auto lookup = [&] {
    ft::Fd fd(::openat(dir.dir.get(), "f0", O_PATH | O_CLOEXEC));
    struct stat st {};
    CHECK(fd && ::fstat(fd.get(), &st) == 0);
    return table.remember(std::move(fd), st, "o1");
  };
  fuse_ino_t node = lookup();
  auto inode = table.share(node);
  window.opening(inode);
  CHECK(window.admit(KiB));
  window.landed(inode, KiB, KiB, 0);
  window.released(inode, ft::Fd());
  CHECK(table.forget(node, 1, owed) == nullptr);
  CHECK(inode->place() == Place::kOwing);
  CHECK(lookup() == node);  // found again as itself
  CHECK(inode->place() == Place::kKnown);
  CHECK(window.take_due(ft::now_seconds() + 1e6).empty());  // the kernel's: no forced sync
  // Forgotten again: now it is synced as a forgotten file, and leaves the table once synced.
  CHECK(table.forget(node, 1, owed) == nullptr);
  auto jobs = window.take_due(ft::now_seconds());
  CHECK(jobs.size() == 1 && jobs[0].reason == ft::SyncReason::kForget);
  std::weak_ptr<ft::Inode> gone = inode;
  inode.reset();
  for (auto& job : jobs) window.end_sync(job, 0);
  jobs.clear();
  CHECK(table.size() == 0 && gone.expired());
}

uint64_t number(const char* text, uint64_t fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') {
    std::fprintf(stderr, "model_test: not a number: %s\n", text);
    std::exit(2);
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = number(argc > 1 ? argv[1] : std::getenv("FT_MODEL_SEED"),
                         static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000007u);
  size_t sequences = number(argc > 2 ? argv[2] : nullptr, 400);
  size_t steps = number(argc > 3 ? argv[3] : nullptr, 300);
  std::printf("model_test: seed %llu (FT_MODEL_SEED=%llu replays it), %zu sequences of %zu steps\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed),
              sequences, steps);
  std::fflush(stdout);
  // Each part runs whatever the others found (each stops at its own first failure).
  int found = 0;
  for (auto part : {+[](uint64_t, size_t, size_t) {
                      test_a_forgotten_file_looked_up_again_is_not_synced_as_forgotten();
                    },
                    +[](uint64_t seed, size_t sequences, size_t steps) {
                      model_mode(seed, sequences, steps);
                    },
                    +[](uint64_t seed, size_t sequences, size_t steps) {
                      threads_mode(seed, sequences / 10 + 1, steps, 4);
                    }}) {
    part(seed, sequences, steps);
    found += failures;
    failures = 0;
  }
  failures = found;
  if (failures != 0) {
    std::fprintf(stderr, "model_test: %d check(s) failed (seed %llu)\n", failures,
                 static_cast<unsigned long long>(seed));
    return 1;
  }
  std::printf("model_test: all checks passed\n");
  return 0;
}
