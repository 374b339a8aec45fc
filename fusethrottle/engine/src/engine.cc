#include "engine.h"

#include <fuse_lowlevel.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <iterator>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "caller.h"
#include "deadline.h"
#include "fusethrottle_engine.h"
#include "thread_name.h"

namespace ft {

// A request thread that served nothing for this long gives its 1 MiB buffer's pages back
// (session_io.cc): a quiet mount holds what it uses. Long enough that a backup's bursts, a
// second or so apart, do not fault their buffers in again each time.
constexpr int kRequestBufferIdleMs = 2000;

Engine::~Engine() {
  pages_.stop();
  if (session_ && mounted_) fuse_session_unmount(session_.get());
  // A drop the kernel still holds uses the session: it is left to the process's exit, as the
  // control plane leaves a request thread the target holds (kernel_pages.h).
  if (pages_.left()) (void)session_.release();
}

int Engine::mount(std::string& error) {
  int rc = inodes_.open_root(options_.source.c_str());
  if (rc != 0) {
    error = "cannot open the source " + options_.source + ": " + std::strerror(-rc);
    return rc;
  }
  // Modes arrive with the caller's umask applied by the kernel; the engine's own must not
  // take more away.
  ::umask(0);
  set_switch_credentials(options_.switch_credentials);
  std::vector<std::string> words{"fusethrottle"};
  if (!options_.fuse_options.empty()) {
    words.emplace_back("-o");
    words.push_back(options_.fuse_options);
  }
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  session_.reset(fuse_session_new(&args, &operations(options_.xattrs, options_.target_decides),
                                  sizeof(fuse_lowlevel_ops), this));
  fuse_opt_free_args(&args);
  if (!session_) {
    error = "the FUSE session could not be made (options: " + options_.fuse_options + ")";
    return -EINVAL;
  }
  if (fuse_session_mount(session_.get(), options_.mountpoint.c_str()) != 0) {
    error = "mounting on " + options_.mountpoint + " failed";
    return -EIO;
  }
  mounted_ = true;
  passthrough_.attach(fuse_session_fd(session_.get()));
  io_.ask_killpriv_v2 = options_.killpriv_v2;
  io_.buffer_idle_ms = kRequestBufferIdleMs;
  rc = use_session_io(session_.get(), fuse_session_fd(session_.get()));
  if (rc != 0) {
    error = std::string("the session's io: ") + std::strerror(-rc);
    return rc;
  }
  rc = events_.open();
  if (rc != 0) {
    error = std::string("eventfd: ") + std::strerror(-rc);
    return rc;
  }
  if (options_.window.drop_synced) pages_.start(session_.get());
  flusher_.start(options_.sync_threads);
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    relief_.start(session_.get(), relief_bounds(limit.rlim_cur));
  return 0;
}

int Engine::serve() {
  struct ConfigDeleter {
    void operator()(fuse_loop_config* c) const { fuse_loop_cfg_destroy(c); }
  };
  std::unique_ptr<fuse_loop_config, ConfigDeleter> config(fuse_loop_cfg_create());
  if (!config) return -ENOMEM;
  // One descriptor per thread: the kernel hands requests to threads without a shared queue.
  fuse_loop_cfg_set_clone_fd(config.get(), 1);
  fuse_loop_cfg_set_max_threads(config.get(), options_.max_threads);
  fuse_loop_cfg_set_idle_threads(config.get(), options_.max_threads);
  ThreadName serving("ft-serve");  // libfuse's request threads inherit it
  int rc = fuse_session_loop_mt(session_.get(), config.get());
  return rc > 0 ? -EINTR : rc;  // a signal ended it: the control plane asked
}

void Engine::close_the_cache() {
  closing_.store(true, std::memory_order_release);
  // What waits at a ceiling or for the fleet's share goes now: the kernel's write-back must end.
  ceilings_.open_up();
  fleet_.open_up();
  if (!session_) return;
  fuse_lowlevel_notify_inval_inode(session_.get(), FUSE_ROOT_ID, -1, 0);
  for (fuse_ino_t node : inodes_.nodes()) {
    // -ENOENT: the kernel forgot it meanwhile, so nothing of it is cached.
    fuse_lowlevel_notify_inval_inode(session_.get(), node, -1, 0);
  }
}

void Engine::stop() {
  // Every wait of a request that the stop depends on ends now, whether the cache was closed
  // first or not (close_the_cache: the control plane bounds it, and may have left it).
  closing_.store(true, std::memory_order_release);
  ceilings_.open_up();
  fleet_.open_up();
  // While the loop still serves: a notification the kernel holds for a page's write-back
  // ends only when a request thread has written it. One that a request thread stuck on the
  // target holds is not waited for past KernelPages::kStopWait (the control plane then aborts
  // the connection, which ends it).
  pages_.stop();
  fuse_session_exit(session_.get());
  if (mounted_) {
    fuse_session_unmount(session_.get());
    mounted_ = false;
  }
}

SessionIo& session_io_of(void* userdata) { return static_cast<Engine*>(userdata)->session_io(); }

}  // namespace ft

struct ft_engine {
  std::unique_ptr<ft::Engine> engine;
};

namespace {

template <size_t N>
size_t copy_layout(const size_t (&layout)[N], size_t* out, size_t max) {
  for (size_t i = 0; i < N && i < max && out != nullptr; i++) out[i] = layout[i];
  return N;
}
// The layout of *T* as the control plane checks it at load (native.py): its size, then the
// offset of each field named, in the order given; how many values that is.
template <typename T, typename... Types>
size_t layout_of(size_t* out, size_t max, Types T::*... fields) {
  static_assert(std::is_standard_layout_v<T>);
  static const T probe{};
  const char* base = reinterpret_cast<const char*>(&probe);
  const size_t layout[] = {
      sizeof(T), static_cast<size_t>(reinterpret_cast<const char*>(&(probe.*fields)) - base)...};
  return copy_layout(layout, out, max);
}

// A duration from the control plane as the engine may use it: from none to a century (past
// that, infinite or NaN: a century), so no conversion to the clock's nanoseconds overflows.
double sane_seconds(double seconds) {
  if (!(seconds < ft::kFarSeconds)) return ft::kFarSeconds;
  return seconds > 0 ? seconds : 0;
}

// Threads the engine starts at once at most, whatever it is asked for.
constexpr unsigned kSyncThreadsMax = 64;

ft_engine* mount_engine(const ft_engine_config* config, std::string& why) {
  if (config == nullptr || config->source == nullptr || config->mountpoint == nullptr) {
    why = "no source or mountpoint given";
    return nullptr;
  }
  ft::Options options;
  options.source = config->source;
  options.mountpoint = config->mountpoint;
  options.fuse_options = config->fuse_options != nullptr ? config->fuse_options : "";
  options.writeback_cache = config->writeback_cache != 0;
  options.entry_timeout = sane_seconds(config->entry_timeout);
  options.attr_timeout = sane_seconds(config->attr_timeout);
  options.max_threads = config->max_threads > 0 ? config->max_threads : 16;
  options.switch_credentials = config->switch_credentials != 0;
  options.xattrs = config->xattrs != 0;
  options.killpriv_v2 = config->killpriv_v2 != 0;
  options.target_decides = config->target_decides != 0;
  options.uncached = config->uncached != 0;
  options.window.enforce = config->enforce != 0;
  options.window.inject = config->inject != 0;
  options.window.window = config->window;
  options.window.batch = config->batch;
  options.window.max_age = sane_seconds(config->max_age);
  options.window.admission_timeout = sane_seconds(config->admission_timeout);
  options.window.pieces = config->writeback_pieces != 0;
  options.window.drop_synced = config->drop_synced != 0;
  options.sync_threads = config->sync_threads > 0 ? std::min(config->sync_threads, kSyncThreadsMax) : 4;
  for (double bound : config->admission_bounds) {
    if (bound > 0 && bound < ft::kFarSeconds) options.window.wait_bounds.push_back(bound);
  }
  const ft_engine_meter& m = config->meter;
  options.meter = ft::MeterProfile{m.data_min, m.meta_min, m.granule, m.read_factor, m.read_units, m.write_units};
  std::copy(std::begin(m.classes), std::end(m.classes), std::begin(options.classes));
  options.metered_limit = m.metered_limit;
  options.ops_limit = m.ops_limit;
  options.throttle_reads = m.throttle_reads != 0;
  options.fleet = m.fleet != 0;
  auto handle = std::make_unique<ft_engine>();
  handle->engine = std::make_unique<ft::Engine>(std::move(options));
  if (handle->engine->mount(why) != 0) return nullptr;
  return handle.release();  // the control plane owns it until ft_engine_free
}

}  // namespace

extern "C" {

int ft_engine_abi(void) { return FT_ENGINE_ABI; }

size_t ft_engine_layout(uint32_t which, size_t* out, size_t max) {
  switch (which) {
    case FT_LAYOUT_CONFIG: {
      using C = ft_engine_config;
      return layout_of<C>(out, max, &C::source, &C::mountpoint, &C::fuse_options,
          &C::writeback_cache, &C::entry_timeout, &C::attr_timeout, &C::max_threads,
          &C::switch_credentials, &C::xattrs, &C::enforce, &C::inject, &C::window, &C::batch,
          &C::max_age, &C::admission_timeout, &C::writeback_pieces, &C::drop_synced,
          &C::sync_threads, &C::killpriv_v2, &C::target_decides, &C::meter, &C::admission_bounds,
          &C::uncached);
    }
    case FT_LAYOUT_METER: {
      using M = ft_engine_meter;
      return layout_of<M>(out, max, &M::data_min, &M::meta_min, &M::granule, &M::read_factor,
          &M::read_units, &M::write_units, &M::classes, &M::metered_limit, &M::ops_limit,
          &M::throttle_reads, &M::fleet);
    }
    case FT_LAYOUT_STATS: {
      // Its size only: its fields are many, and read, never written, by the control plane.
      return layout_of<ft_engine_stats>(out, max);
    }
    case FT_LAYOUT_EVENT: {
      using E = ft_engine_event;
      return layout_of<E>(out, max, &E::kind, &E::reason, &E::error, &E::unused, &E::node,
          &E::bytes, &E::seconds, &E::at, &E::path);
    }
    case FT_LAYOUT_ERROR: {
      using R = ft_engine_error;
      return layout_of<R>(out, max, &R::op, &R::error, &R::count);
    }
    default:
      return 0;
  }
}

ft_engine* ft_engine_mount(const ft_engine_config* config, char* error, size_t error_size) {
  // Nothing may leave through the C boundary: an exception (a thread that could not start,
  // memory) is a failed mount with its reason, as any other.
  std::string why;
  ft_engine* engine = nullptr;
  try {
    engine = mount_engine(config, why);
  } catch (const std::exception& e) {
    why = std::string("the engine could not start: ") + e.what();
  } catch (...) {
    why = "the engine could not start";
  }
  if (engine == nullptr && error != nullptr && error_size > 0) {
    std::snprintf(error, error_size, "%s", why.empty() ? "the engine did not mount" : why.c_str());
  }
  return engine;
}

int ft_engine_serve(ft_engine* engine) { return engine->engine->serve(); }

void ft_engine_stop(ft_engine* engine) { engine->engine->stop(); }

void ft_engine_read_stats(ft_engine* engine, ft_engine_stats* out) {
  ft::Engine& e = *engine->engine;
  ft::WindowStats w = e.window().stats();
  *out = ft_engine_stats{};
  out->known_files = e.known_files();
  out->writeback_cache = e.writeback_cache() ? 1 : 0;
  out->written_bytes = w.written;
  out->window_bytes = w.window;
  out->unsynced_bytes = w.unsynced;
  out->reserved_bytes = w.reserved;
  out->syncing_bytes = w.syncing;
  out->unsynced_high = w.unsynced_high;
  out->dirty_files = w.dirty_files;
  out->oldest_age = w.oldest_age;
  out->synced_bytes = w.synced;
  out->fsyncs = e.flusher().fsyncs();
  out->fsync_errors = e.flusher().errors();
  out->fsyncs_in_flight = e.flusher().in_flight();
  out->waiting_writes = w.waiting;
  out->throttled_writes = w.throttled;
  out->paced_writes = w.paced;
  out->admission_timeouts = w.timeouts;
  out->admission_wait_seconds = w.wait_seconds;
  out->events_dropped = e.events().dropped();
  out->killpriv_v2 = e.session_io().killpriv_v2.load() ? 1 : 0;
  out->xattrs = e.options().xattrs ? 1 : 0;
  for (int op = 0; op < FT_OP_COUNT; op++) {
    out->operations[op] = e.served(static_cast<ft_engine_op>(op));
  }
  e.meter().read(*out);
  ft::CeilingStats c = e.ceilings().stats();
  out->ceiling_delayed = c.delayed;
  out->ceiling_delay_seconds = c.delay_seconds;
  ft::FleetGateStats f = e.fleet().stats();
  out->fleet_spent_metered = f.spent_metered;
  out->fleet_spent_units = f.spent_units;
  out->fleet_waiting = f.waiting;
  out->fleet_pacing = f.pacing;
  out->fleet_waited = f.waited;
  out->fleet_wait_seconds = f.wait_seconds;
  for (size_t i = 0; i < w.waits.size() && i <= FT_ADMISSION_BOUNDS; i++) out->admission_waits[i] = w.waits[i];
  out->open_handles = e.open_handles();
  out->relief_high = e.relief().high();
  out->names_dropped = e.relief().asked();
  out->page_cache_drops = e.kernel_pages().dropped();
  out->passthrough = static_cast<int32_t>(e.passthrough().state());
  out->passthrough_opens = e.passthrough().opens();
}

size_t ft_engine_read_errors(ft_engine* engine, ft_engine_error* out, size_t max) {
  return engine->engine->meter().errors(out, max);
}

void ft_engine_price(const ft_engine_meter* meter, uint32_t cls, uint64_t nbytes, uint64_t* metered,
                     uint32_t* units) {
  ft::MeterProfile p{meter->data_min, meter->meta_min, meter->granule, meter->read_factor,
                     meter->read_units, meter->write_units};
  ft::Charge charge = ft::price(p, ft::op_class_of(cls), nbytes);
  *metered = charge.metered;
  *units = charge.units;
}

int ft_engine_events_fd(ft_engine* engine) { return engine->engine->events().fd(); }

size_t ft_engine_read_events(ft_engine* engine, ft_engine_event* out, size_t max) {
  return engine->engine->events().drain(out, max);
}

void ft_engine_set_window(ft_engine* engine, uint64_t window, double commit_rate) {
  // A rate the window converts to whole bytes (a write-back piece) stays far inside them: not
  // a number or below nothing is not known (0), past a petabyte a second is that.
  constexpr double kRateMax = 1e15;
  commit_rate = commit_rate > 0 ? std::min(commit_rate, kRateMax) : 0;
  engine->engine->window().set_window(window, commit_rate);
}

void ft_engine_set_ceilings(ft_engine* engine, double metered_limit, double ops_limit) {
  engine->engine->ceilings().set_limits(metered_limit, ops_limit);
}

void ft_engine_set_params(ft_engine* engine, uint64_t batch, double max_age, int enforce,
                          int inject) {
  engine->engine->window().set_params(batch, max_age, enforce != 0, inject != 0);
}

void ft_engine_fleet_hand_out(ft_engine* engine, double allow_metered, double allow_units,
                              double pace_metered, double pace_units) {
  engine->engine->fleet().hand_out(allow_metered, allow_units, pace_metered, pace_units);
}

void ft_engine_close_the_cache(ft_engine* engine) { engine->engine->close_the_cache(); }

uint64_t ft_engine_sync_all(ft_engine* engine) { return engine->engine->flusher().finish(); }

size_t ft_engine_unsynced(ft_engine* engine, char* out, size_t size) {
  size_t used = 0;
  for (auto& [inode, error] : engine->engine->window().owing()) {
    std::string path = ft::proc_path(inode->fd());
    char target[4096];
    ssize_t n = ::readlink(path.c_str(), target, sizeof target);
    // A record ends at its NUL, the one byte no path holds (a newline is a name's own).
    std::string record = std::to_string(error) + " " +
                         (n > 0 ? std::string(target, static_cast<size_t>(n)) : path) + '\0';
    if (used + record.size() > size) break;
    std::memcpy(out + used, record.data(), record.size());
    used += record.size();
  }
  return used;
}

void ft_engine_free(ft_engine* engine) { std::unique_ptr<ft_engine> owned(engine); }

}  // extern "C"
