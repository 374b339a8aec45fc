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
#define FT_ENGINE_ABI 3

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
};

struct ft_engine_stats {
  uint64_t known_files;     /* files the kernel holds a node id of (the root aside) */
  int writeback_cache;      /* what the kernel granted at INIT */
  uint64_t written_bytes;   /* written to the target, in all */
  uint64_t lost_syncs;      /* files whose fsync failed as the kernel forgot them */
};

struct ft_engine;

int ft_engine_abi(void);
/* Open the source and mount: NULL on failure, *error* (of *error_size*) then says why. */
struct ft_engine *ft_engine_mount(const struct ft_engine_config *config, char *error,
                                  size_t error_size);
/* Serve requests on this thread (and the engine's own) until unmounted or stopped:
 * 0, or minus an errno. */
int ft_engine_serve(struct ft_engine *engine);
/* From any thread: unmount (lazily) and end serve() once the kernel lets go. */
void ft_engine_stop(struct ft_engine *engine);
void ft_engine_read_stats(struct ft_engine *engine, struct ft_engine_stats *out);
/* Refuse everything new (ENOTCONN) but the kernel's write-back and closes, and expire every
 * attribute the kernel holds, so a writer still writing is refused, not acknowledged. */
void ft_engine_close_the_cache(struct ft_engine *engine);
/* fsync every file written since its last fsync (also after serve() returned): how many
 * failed. */
uint64_t ft_engine_sync_all(struct ft_engine *engine);
/* After serve() has returned: unmount if still mounted and free everything. */
void ft_engine_free(struct ft_engine *engine);

#ifdef __cplusplus
}
#endif

#endif
