/* The engine's C ABI: what the Python control plane calls (through ctypes). No engine thread
 * ever calls back into Python. */
#ifndef FUSETHROTTLE_ENGINE_H
#define FUSETHROTTLE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a structure or call below changes: Python refuses a library of another. */
#define FT_ENGINE_ABI 12

/* The requests the engine serves, in the order of ft_engine_stats.operations (native.py
 * names them as the FUSE operations they are). */
enum ft_engine_op {
  FT_OP_LOOKUP, FT_OP_FORGET, FT_OP_GETATTR, FT_OP_SETATTR, FT_OP_READLINK, FT_OP_MKNOD,
  FT_OP_MKDIR, FT_OP_UNLINK, FT_OP_RMDIR, FT_OP_SYMLINK, FT_OP_RENAME, FT_OP_LINK, FT_OP_OPEN,
  FT_OP_READ, FT_OP_WRITE, FT_OP_FLUSH, FT_OP_RELEASE, FT_OP_FSYNC, FT_OP_OPENDIR,
  FT_OP_READDIR, FT_OP_READDIRPLUS, FT_OP_RELEASEDIR, FT_OP_FSYNCDIR, FT_OP_STATFS,
  FT_OP_SETXATTR, FT_OP_GETXATTR, FT_OP_LISTXATTR, FT_OP_REMOVEXATTR, FT_OP_CREATE,
  FT_OP_FALLOCATE, FT_OP_ACCESS,
  FT_OP_COUNT
};

/* How a request kind is metered (ft_engine_meter.classes): the class of meter.py, and a flag
 * for the kinds that never wait at a ceiling (fsync). */
#define FT_METER_NONE 0
#define FT_METER_DATA_READ 1
#define FT_METER_DATA_WRITE 2
#define FT_METER_META_READ 3
#define FT_METER_META_WRITE 4
#define FT_METER_CLASS_MASK 0x0f
#define FT_METER_NO_WAIT 0x80

/* Metering's rules, as the control plane's profile says (meter.py), and the ceilings. */
struct ft_engine_meter {
  uint64_t data_min;   /* a data request is metered at least this */
  uint64_t meta_min;   /* a metadata request is metered at least this */
  uint64_t granule;    /* metered sizes are rounded up to a multiple of it */
  double read_factor;  /* reads are metered at this share (rounded up to a byte) */
  uint32_t read_units; /* op units of a read, of data or metadata */
  uint32_t write_units;
  uint8_t classes[FT_OP_COUNT]; /* FT_METER_* by ft_engine_op */
  double metered_limit; /* metered bytes/s at most (0: no ceiling) */
  double ops_limit;     /* op units/s at most (0: no ceiling) */
  int throttle_reads;   /* reads and metadata wait at the ceilings too (else writes only) */
  int fleet;            /* budget=: requests spend the fleet's share first, as handed out by
                         * ft_engine_fleet_hand_out (nothing before the first hand-out) */
};

/* The bounds (seconds, ascending) of the histogram of writes' waits at the gate. */
#define FT_ADMISSION_BOUNDS 16

struct ft_engine_config {
  const char *source;       /* the backing directory */
  const char *mountpoint;
  const char *fuse_options; /* comma list for the kernel: fsname=,subtype=,allow_other,... */
  int writeback_cache;      /* ask the kernel for its writeback cache */
  double entry_timeout;     /* seconds the kernel may keep a name, and attributes */
  double attr_timeout;
  unsigned max_threads;     /* request threads at most */
  int switch_credentials;   /* run each call as its caller (the daemon is root) */
  int xattrs;               /* serve extended attributes (else ENOSYS: the kernel stops asking) */
  /* The write window (set_window moves it later). */
  int enforce;              /* the gate holds writes back (mode=off: 0) */
  int inject;               /* fsyncs after batches, on release and by age (mode=off: 0) */
  uint64_t window;          /* bytes the gate admits un-synced */
  uint64_t batch;           /* a file's dirty bytes that make it due for an fsync */
  double max_age;           /* seconds dirty data may wait for one */
  double admission_timeout; /* seconds a write waits at most (then admitted, and counted) */
  int writeback_pieces;     /* write back in pieces of ~0.1 s of the commit rate first */
  int drop_synced;          /* drop synced ranges from the target's page cache */
  unsigned sync_threads;    /* fsyncs running at once at most */
  int killpriv_v2;          /* ask the kernel to leave set-ID removal to the target (only
                             * where writes reach it as their caller) */
  int target_decides;       /* permissions=target: the kernel checks nothing (no
                             * default_permissions), the target decides every call as its
                             * caller, nothing it refuses is made as the daemon */
  struct ft_engine_meter meter;
  double admission_bounds[FT_ADMISSION_BOUNDS];
  int uncached;             /* target_io: writes leave no page in the target's page cache
                             * (whole pages through O_DIRECT, the rest written back, waited
                             * for and dropped), where the daemon shares a memory cgroup */
};


/* One class's totals (meter.py's ClassTotals). */
struct ft_engine_meter_totals {
  uint64_t ops;
  uint64_t bytes;
  uint64_t metered_bytes;
  uint64_t units;
};

struct ft_engine_stats {
  uint64_t known_files;     /* files the kernel holds a node id of (the root aside) */
  int writeback_cache;      /* what the kernel granted at INIT */
  uint64_t written_bytes;   /* written to the target, in all */
  uint64_t window_bytes;    /* the gate's window now */
  uint64_t unsynced_bytes;  /* admitted and not yet durable */
  uint64_t reserved_bytes;  /* admitted, on the way to the target */
  uint64_t syncing_bytes;   /* in fsyncs under way */
  uint64_t unsynced_high;   /* the most ever un-synced at once */
  uint64_t dirty_files;
  double oldest_age;        /* seconds the oldest un-synced byte has waited */
  uint64_t synced_bytes;
  uint64_t fsyncs;          /* injected fsyncs ended */
  uint64_t fsync_errors;
  uint64_t fsyncs_in_flight;
  uint64_t waiting_writes;  /* at the gate now */
  uint64_t throttled_writes; /* waited for room */
  uint64_t paced_writes;    /* waited for their pacing turn only */
  uint64_t admission_timeouts;
  double admission_wait_seconds;
  uint64_t events_dropped;  /* events the control plane did not drain in time */
  int killpriv_v2;          /* the INIT reply asked for FUSE_HANDLE_KILLPRIV_V2 */
  int xattrs;               /* extended attributes are served */
  uint64_t operations[FT_OP_COUNT]; /* requests served, by kind */
  struct ft_engine_meter_totals meter[4]; /* by FT_METER_* class, from DATA_READ on */
  uint64_t ceiling_delayed;       /* requests that waited at a ceiling */
  double ceiling_delay_seconds;   /* and how long, in all */
  uint64_t admission_waits[FT_ADMISSION_BOUNDS + 1]; /* writes that waited at the gate, by
                                                      * the bound of their wait (last: above) */
  uint64_t open_handles;          /* files and directories open through the mount */
  uint64_t relief_high;           /* known files at which the kernel is asked to drop names */
  uint64_t names_dropped;         /* names the kernel was asked to drop */
  uint64_t page_cache_drops;      /* synced ranges dropped from the mount's own page cache */
  double fleet_spent_metered;     /* the fleet's share: metered bytes and op units spent */
  double fleet_spent_units;
  uint64_t fleet_waiting;         /* requests waiting for a lease now (the events descriptor
                                   * turned readable when the first began) */
  uint64_t fleet_pacing;          /* requests waiting out the share's pace now */
  uint64_t fleet_waited;          /* requests that waited for the fleet's share, in all */
  double fleet_wait_seconds;
  int32_t passthrough;            /* reads of files open for reading only go to the kernel
                                   * (FUSE passthrough): 1 on; off: 0 built against a libfuse
                                   * before 3.17, 2 the kernel lacks it, 3 the mount uses the
                                   * write-back cache, 4 no CAP_SYS_ADMIN, 5 turned off by
                                   * FUSETHROTTLE_PASSTHROUGH=off */
  uint64_t passthrough_opens;     /* opens whose reads the kernel served, in all */
};

/* Error answers of one request kind with one errno (ft_engine_read_errors). */
struct ft_engine_error {
  uint32_t op;    /* ft_engine_op */
  int32_t error;  /* the errno (0: one above those counted by value) */
  uint64_t count;
};

/* What the control plane hears of. */
#define FT_EVENT_SYNC 1 /* an injected fsync ended, or an application's own */
#define FT_EVENT_LOST 2 /* the target failed to store some of a file's data (a write or an
                         * fsync failed with ENOSPC, EDQUOT, EFBIG, EIO, EROFS, ETIMEDOUT) */
struct ft_engine_event {
  uint32_t kind;
  uint32_t reason;  /* 1 batch, 2 release, 3 age, 4 window, 5 forgotten, 6 the end,
                     * 7 the application's own fsync */
  int32_t error;    /* 0, or the errno it failed with */
  uint32_t unused;
  uint64_t node;    /* the file's node id */
  uint64_t bytes;   /* what it made durable (or failed to) */
  double seconds;   /* how long it took */
  double at;        /* when it ended: CLOCK_MONOTONIC seconds */
  char path[256];   /* LOST: the file's path on the target (cut short if longer) */
};

struct ft_engine;

int ft_engine_abi(void);
/* The layout of a structure above as this library was built, for the control plane to check
 * its own against at load: out[0] its size, then the offset of each of its fields in order (an
 * array or a nested structure is one field). Up to *max* values into *out*; how many there are
 * (0: no such structure). */
#define FT_LAYOUT_CONFIG 1 /* struct ft_engine_config */
#define FT_LAYOUT_METER 2  /* struct ft_engine_meter */
#define FT_LAYOUT_STATS 3  /* struct ft_engine_stats */
#define FT_LAYOUT_EVENT 4  /* struct ft_engine_event */
#define FT_LAYOUT_ERROR 5  /* struct ft_engine_error */
size_t ft_engine_layout(uint32_t which, size_t *out, size_t max);
/* Open the source and mount: NULL on failure, *error* (of *error_size*) then says why. A
 * duration past a century, infinite or not a number is taken as a century; a negative one as
 * none. */
struct ft_engine *ft_engine_mount(const struct ft_engine_config *config, char *error,
                                  size_t error_size);
/* Serve requests on this thread (and the engine's own) until unmounted or stopped:
 * 0, or minus an errno. */
int ft_engine_serve(struct ft_engine *engine);
/* The fleet budget's lease (budget=), from the control plane's renewer: requests may spend
 * until the totals of ft_engine_stats.fleet_spent_* reach *allow_metered* and *allow_units*
 * (INFINITY: no lease needed), paced at *pace_metered* bytes/s and *pace_units* units/s (0:
 * unpaced). */
void ft_engine_fleet_hand_out(struct ft_engine *engine, double allow_metered, double allow_units,
                              double pace_metered, double pace_units);
/* From any thread: unmount (lazily) and end serve() once the kernel lets go. */
void ft_engine_stop(struct ft_engine *engine);
void ft_engine_read_stats(struct ft_engine *engine, struct ft_engine_stats *out);
/* Refuse everything new (ENOTCONN) but the kernel's write-back and closes, and expire every
 * attribute the kernel holds, so a writer still writing is refused, not acknowledged. */
void ft_engine_close_the_cache(struct ft_engine *engine);
/* After serve() has returned: finish the fsyncs under way and fsync every file still
 * un-synced (three tries): how many files are still un-synced, or had a sync fail that their
 * writer was never told of (ft_engine_unsynced names them). */
uint64_t ft_engine_sync_all(struct ft_engine *engine);
/* A descriptor that turns readable when events are queued (read it to reset it). */
int ft_engine_events_fd(struct ft_engine *engine);
/* Move up to *max* queued events into *out*: how many. */
size_t ft_engine_read_events(struct ft_engine *engine, struct ft_engine_event *out, size_t max);
/* The controller's decision: the window the gate admits, and the target's commit rate
 * (bytes/s, 0 if not known) that paces writes above half of it. */
void ft_engine_set_window(struct ft_engine *engine, uint64_t window, double commit_rate);
/* The ceilings from now on (metered bytes/s, op units/s; 0: none), while the mount serves:
 * `fusethrottle set`, a schedule, the pressure guard. Requests waiting at a ceiling rescale
 * what is left of their wait to the new rate. */
void ft_engine_set_ceilings(struct ft_engine *engine, double metered_limit, double ops_limit);
/* `fusethrottle set`: batch (bytes), max_age (seconds) and the mode (enforce, inject as in the
 * config) from now on. */
void ft_engine_set_params(struct ft_engine *engine, uint64_t batch, double max_age, int enforce,
                          int inject);
/* The files that still owe the target data, as records "ERRNO PATH\0" (ERRNO 0: the target did
 * not answer; PATH: where the file is on the target, any bytes but NUL: a newline in a name is
 * part of it), into *out* of *size* (cut at a whole record): the bytes written. Touches no file
 * of the target: safe while it hangs. */
size_t ft_engine_unsynced(struct ft_engine *engine, char *out, size_t size);
/* The error answers so far, by kind and errno: up to *max* into *out*, how many. */
size_t ft_engine_read_errors(struct ft_engine *engine, struct ft_engine_error *out, size_t max);
/* What one request of *nbytes* in class *cls* (FT_METER_*) costs under *meter*'s rules: the
 * engine's own pricing, for the control plane's parity test. */
void ft_engine_price(const struct ft_engine_meter *meter, uint32_t cls, uint64_t nbytes,
                     uint64_t *metered_bytes, uint32_t *units);
/* After serve() has returned: unmount if still mounted and free everything. */
void ft_engine_free(struct ft_engine *engine);
/* libfuse's own log (process-wide, before any mount): from now on its messages are queued
 * for ft_engine_read_libfuse_log instead of printed on stderr. A descriptor that turns readable
 * when some are queued (read it to reset it), or minus an errno. Called again: the same. */
int ft_engine_capture_libfuse_log(void);
/* The oldest queued libfuse message into *out* of *size* (NUL-terminated, cut short if
 * longer): its level (FUSE_LOG_EMERG 0 .. FUSE_LOG_DEBUG 7), or -1 when none is queued. */
int ft_engine_read_libfuse_log(char *out, size_t size);
/* Messages dropped so far because the control plane lagged (the queue holds 256). */
uint64_t ft_engine_libfuse_log_dropped(void);

#ifdef __cplusplus
}
#endif

#endif
