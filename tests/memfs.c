/*
 * memfs: a tiny in-memory FUSE filesystem that stands in for the target in mount tests.
 *
 * It can do two things that a plain directory cannot. It writes every fsync it receives (and
 * every write) to a log file outside itself, so a test can see that an fsync issued on the
 * fusethrottle mount reached the target. And it can be frozen with SIGSTOP, so every request
 * into it hangs exactly like a dead NFS server.
 *
 * Usage: memfs MOUNTPOINT LOGFILE [--stale-unlinked] [--slow-getattr=SECONDS]
 *              [--slow-all-while=PATH:SECONDS] [--log-attributes]
 * SIGTERM, SIGINT or `fusermount3 -u` ends it (exit 0).
 *
 * --stale-unlinked: a removed file is gone for everyone, as on an NFS server when another
 *   client deletes it: opening, reading, writing or syncing it answers ESTALE.
 * --slow-getattr: every stat takes that long to answer, as on a server that is slow but alive.
 * --slow-all-while: every call except statfs and release takes SECONDS while PATH (outside
 *   the file system) exists: a target that turns slow once a test has set up its files.
 * --log-attributes: every stat and setattr of a node but the root is logged too, so a test
 *   can see what a request through the mount cost the target.
 *
 * The log gets one line per event: "write NAME OFF LEN" and "fsync NAME SIZE DATASYNC" (and
 * with --log-attributes "getattr NAME" and "setattr NAME TO_SET"), where NAME is the name the
 * file was created with. Only what the tests need is implemented;
 * everything else answers ENOSYS (libfuse's answer for an operation that is not set).
 *
 * Requests are served by libfuse's multithreaded loop, so a slow call does not hold up the
 * others. One mutex guards all the nodes; nothing sleeps or replies while holding it.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror $(pkg-config --cflags fuse3) memfs.c \
 *            $(pkg-config --libs fuse3) -lpthread
 */

#define FUSE_USE_VERSION 312
#define _GNU_SOURCE

#include <errno.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* A directory's entry; a directory keeps them sorted by name (readdir's order). */
struct entry {
	char *name;
	fuse_ino_t ino;
};

struct node {
	mode_t mode;
	char *name; /* as created: the log names files by it */
	char *data; /* a regular file's contents */
	size_t size, cap;
	struct entry *kids; /* a directory's entries */
	size_t nkids, kids_cap;
	nlink_t nlink;
	struct timespec mtime; /* creation time, shown as atime, mtime and ctime */
};

/* nodes[ino]; 0 is unused, FUSE_ROOT_ID (1) is the root. Nodes are never freed: the kernel
 * may name any inode it was given until it forgets it, and the tests' files are small. */
static struct node **nodes;
static size_t nnodes, nodes_cap;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static FILE *record;
static struct fuse_session *session;
static int stale_unlinked;
static double slow_getattr;
static int log_attributes;
static const char *slow_path; /* --slow-all-while */
static double slow_seconds;

/* Sleep SECONDS, in short steps so that an ending session is not held up by a sleeper:
 * libfuse joins every worker thread before its loop returns. */
static void pause_for(double seconds)
{
	struct timespec end, step;

	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += (time_t)seconds;
	end.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	while (!fuse_session_exited(session)) {
		clock_gettime(CLOCK_MONOTONIC, &step);
		if (step.tv_sec > end.tv_sec ||
		    (step.tv_sec == end.tv_sec && step.tv_nsec >= end.tv_nsec))
			return;
		step.tv_nsec += 50000000L;
		if (step.tv_nsec >= 1000000000L) {
			step.tv_sec++;
			step.tv_nsec -= 1000000000L;
		}
		if (step.tv_sec > end.tv_sec ||
		    (step.tv_sec == end.tv_sec && step.tv_nsec > end.tv_nsec))
			step = end;
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &step, NULL);
	}
}

/* --slow-all-while: called first by every operation but statfs, release and releasedir. */
static void maybe_slow(void)
{
	struct stat st;

	if (slow_path != NULL && stat(slow_path, &st) == 0)
		pause_for(slow_seconds);
}

/* The rest runs with the lock held. */

static struct node *get(fuse_ino_t ino)
{
	return ino < nnodes ? nodes[ino] : NULL;
}

/* A file to open, read, write or sync: 0, or the errno to answer. */
static int live(fuse_ino_t ino, struct node **out)
{
	*out = get(ino);
	if (*out == NULL)
		return ENOENT;
	if (stale_unlinked && (*out)->nlink == 0)
		return ESTALE;
	return 0;
}

static void fill_attr(fuse_ino_t ino, const struct node *n, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_mode = n->mode;
	st->st_nlink = n->nlink;
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_size = (off_t)n->size;
	st->st_blksize = 4096;
	st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
	st->st_atim = st->st_mtim = st->st_ctim = n->mtime;
}

/* Timeouts 0: the kernel asks again every time, so changes made any way show at once. */
static void fill_entry(fuse_ino_t ino, const struct node *n, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = ino;
	fill_attr(ino, n, &e->attr);
}

/* Where NAME is in directory N, or where it would go (*found tells which). */
static size_t find_kid(const struct node *n, const char *name, int *found)
{
	size_t lo = 0, hi = n->nkids;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int cmp = strcmp(name, n->kids[mid].name);

		if (cmp == 0) {
			*found = 1;
			return mid;
		}
		if (cmp < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	*found = 0;
	return lo;
}

/* Resize a file's contents; new bytes are zeros. 0 or an errno. */
static int resize(struct node *n, size_t size)
{
	if (size > n->cap) {
		size_t cap = n->cap ? n->cap : 4096;
		char *data;

		while (cap < size)
			cap = cap > SIZE_MAX / 2 ? size : cap * 2;
		data = realloc(n->data, cap);
		if (data == NULL)
			return ENOSPC;
		n->data = data;
		n->cap = cap;
	}
	if (size > n->size)
		memset(n->data + n->size, 0, size - n->size);
	n->size = size;
	return 0;
}

/* Room in DIR's entries for one more. 0 or ENOMEM. */
static int room_for_a_kid(struct node *dir)
{
	if (dir->nkids == dir->kids_cap) {
		size_t cap = dir->kids_cap ? dir->kids_cap * 2 : 8;
		struct entry *grown = realloc(dir->kids, cap * sizeof(*dir->kids));

		if (grown == NULL)
			return ENOMEM;
		dir->kids = grown;
		dir->kids_cap = cap;
	}
	return 0;
}

/* Add a node called NAME to directory PARENT. 0 and *ino, or an errno. */
static int add_node(fuse_ino_t parent, const char *name, mode_t mode, fuse_ino_t *ino)
{
	struct node *dir = get(parent), *n;
	size_t at = 0;
	int found;

	if (dir == NULL)
		return ENOENT;
	at = find_kid(dir, name, &found);
	if (found)
		return EEXIST;
	if (nnodes == nodes_cap) {
		size_t cap = nodes_cap ? nodes_cap * 2 : 64;
		struct node **grown = realloc(nodes, cap * sizeof(*nodes));

		if (grown == NULL)
			return ENOMEM;
		nodes = grown;
		nodes_cap = cap;
	}
	if (room_for_a_kid(dir) != 0)
		return ENOMEM;
	n = calloc(1, sizeof(*n));
	if (n == NULL || (n->name = strdup(name)) == NULL) {
		free(n);
		return ENOMEM;
	}
	n->mode = mode;
	n->nlink = S_ISDIR(mode) ? 2 : 1;
	clock_gettime(CLOCK_REALTIME, &n->mtime);
	*ino = nnodes;
	nodes[nnodes++] = n;
	memmove(&dir->kids[at + 1], &dir->kids[at], (dir->nkids - at) * sizeof(*dir->kids));
	dir->kids[at].name = n->name; /* the same string: a node has one name */
	dir->kids[at].ino = *ino;
	dir->nkids++;
	return 0;
}

/* Operations. Each one fills its answer under the lock and replies after. */

static void mf_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	/* Always READDIRPLUS, never plain READDIR, as this helper has always answered listings:
	 * each entry comes with its attributes and counts as a lookup. */
	conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
}

static void mf_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	struct node *dir;
	size_t at = 0;
	int found = 0;

	maybe_slow();
	pthread_mutex_lock(&lock);
	dir = get(parent);
	if (dir != NULL)
		at = find_kid(dir, name, &found);
	if (found)
		fill_entry(dir->kids[at].ino, get(dir->kids[at].ino), &e);
	pthread_mutex_unlock(&lock);
	if (found)
		fuse_reply_entry(req, &e);
	else
		fuse_reply_err(req, ENOENT);
}

static void mf_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;
	struct node *n;

	(void)fi;
	maybe_slow();
	if (slow_getattr > 0)
		pause_for(slow_getattr);
	pthread_mutex_lock(&lock);
	n = get(ino);
	if (n != NULL)
		fill_attr(ino, n, &st);
	if (n != NULL && n->name != NULL && n->name[0] != '\0' && log_attributes)
		fprintf(record, "getattr %s\n", n->name); /* the root has no name: not logged */
	pthread_mutex_unlock(&lock);
	if (n != NULL)
		fuse_reply_attr(req, &st, 0);
	else
		fuse_reply_err(req, ENOENT);
}

/* Only size and permission bits change; other fields (times, owner) are accepted and kept. */
static void mf_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct stat st;
	struct node *n;
	int err = 0;

	(void)fi;
	maybe_slow();
	pthread_mutex_lock(&lock);
	n = get(ino);
	if (n == NULL)
		err = ENOENT;
	else if ((to_set & FUSE_SET_ATTR_SIZE) && attr->st_size < 0)
		err = EINVAL;
	else if (to_set & FUSE_SET_ATTR_SIZE)
		err = resize(n, (size_t)attr->st_size);
	if (err == 0 && (to_set & FUSE_SET_ATTR_MODE))
		n->mode = (n->mode & S_IFMT) | (attr->st_mode & 07777);
	if (err == 0 && n->name != NULL && n->name[0] != '\0' && log_attributes)
		fprintf(record, "setattr %s %d\n", n->name, to_set);
	if (err == 0)
		fill_attr(ino, n, &st);
	pthread_mutex_unlock(&lock);
	if (err == 0)
		fuse_reply_attr(req, &st, 0);
	else
		fuse_reply_err(req, err);
}

static void mf_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct fuse_entry_param e;
	fuse_ino_t ino;
	int err;

	maybe_slow();
	pthread_mutex_lock(&lock);
	err = add_node(parent, name, S_IFDIR | (mode & 07777), &ino);
	if (err == 0)
		fill_entry(ino, get(ino), &e);
	pthread_mutex_unlock(&lock);
	if (err == 0)
		fuse_reply_entry(req, &e);
	else
		fuse_reply_err(req, err);
}

static void mf_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct fuse_entry_param e;
	fuse_ino_t ino;
	int err;

	maybe_slow();
	pthread_mutex_lock(&lock);
	err = add_node(parent, name, S_IFREG | (mode & 07777), &ino);
	if (err == 0)
		fill_entry(ino, get(ino), &e);
	pthread_mutex_unlock(&lock);
	if (err != 0) {
		fuse_reply_err(req, err);
		return;
	}
	fi->fh = ino;
	fi->keep_cache = 1; /* only the kernel changes the file: its cached pages stay right */
	fuse_reply_create(req, &e, fi);
}

/* The open flags are not looked at, as this helper never did: O_TRUNC (which libfuse's
 * atomic_o_trunc sends here instead of a setattr) leaves the contents as they are. */
static void mf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct node *n;
	int err;

	maybe_slow();
	pthread_mutex_lock(&lock);
	err = live(ino, &n);
	pthread_mutex_unlock(&lock);
	if (err != 0) {
		fuse_reply_err(req, err);
		return;
	}
	fi->fh = ino;
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

static void mf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct node *n;
	char *copy = NULL;
	size_t len = 0;
	int err;

	(void)ino;
	maybe_slow();
	pthread_mutex_lock(&lock);
	err = live(fi->fh, &n);
	if (err == 0 && off >= 0 && (size_t)off < n->size) {
		len = n->size - (size_t)off < size ? n->size - (size_t)off : size;
		copy = malloc(len);
		if (copy == NULL)
			err = ENOMEM;
		else
			memcpy(copy, n->data + off, len);
	}
	pthread_mutex_unlock(&lock);
	if (err != 0)
		fuse_reply_err(req, err);
	else
		fuse_reply_buf(req, copy, copy == NULL ? 0 : len);
	free(copy);
}

static void mf_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct node *n;
	int err;

	(void)ino;
	maybe_slow();
	pthread_mutex_lock(&lock);
	err = live(fi->fh, &n);
	if (err == 0 && (off < 0 || (size_t)off > SIZE_MAX - size))
		err = EFBIG;
	if (err == 0 && (size_t)off + size > n->size)
		err = resize(n, (size_t)off + size); /* a gap before OFF reads as zeros */
	if (err == 0) {
		memcpy(n->data + off, buf, size);
		/* Under the lock: the log's order is the order the data changed in. */
		fprintf(record, "write %s %jd %zu\n", n->name, (intmax_t)off, size);
	}
	pthread_mutex_unlock(&lock);
	if (err == 0)
		fuse_reply_write(req, size);
	else
		fuse_reply_err(req, err);
}

static void mf_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	maybe_slow();
	fuse_reply_err(req, 0);
}

static void mf_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void mf_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct node *n;
	int err;

	(void)ino;
	maybe_slow();
	pthread_mutex_lock(&lock);
	err = live(fi->fh, &n);
	if (err == 0)
		fprintf(record, "fsync %s %zu %d\n", n->name, n->size, datasync != 0);
	pthread_mutex_unlock(&lock);
	fuse_reply_err(req, err);
}

/* The node stays (a reader may still hold it open); only its name and a link go. */
static void mf_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct node *dir;
	size_t at = 0;
	int found = 0;

	maybe_slow();
	pthread_mutex_lock(&lock);
	dir = get(parent);
	if (dir != NULL)
		at = find_kid(dir, name, &found);
	if (found) {
		get(dir->kids[at].ino)->nlink--;
		dir->nkids--;
		memmove(&dir->kids[at], &dir->kids[at + 1], (dir->nkids - at) * sizeof(*dir->kids));
	}
	pthread_mutex_unlock(&lock);
	fuse_reply_err(req, found ? 0 : ENOENT);
}

/* Files only: a directory is neither moved nor replaced. The node keeps the name it was
 * created with (the log's); the entry takes the new one. */
static int rename_locked(fuse_ino_t parent, const char *name, fuse_ino_t newparent,
			 const char *newname)
{
	struct node *from = get(parent), *to = get(newparent), *moved;
	size_t at, there;
	int found;
	fuse_ino_t ino;
	char *copy;

	if (from == NULL || to == NULL)
		return ENOENT;
	at = find_kid(from, name, &found);
	if (!found)
		return ENOENT;
	ino = from->kids[at].ino;
	moved = get(ino);
	if (S_ISDIR(moved->mode))
		return EXDEV;
	there = find_kid(to, newname, &found);
	if (found && to->kids[there].ino == ino)
		return 0;
	if (found && S_ISDIR(get(to->kids[there].ino)->mode))
		return EISDIR;
	if (!found && room_for_a_kid(to) != 0)
		return ENOMEM;
	copy = strdup(newname); /* kept for memfs's life, as every node is */
	if (copy == NULL)
		return ENOMEM;
	if (found) { /* the file replaced loses this name */
		get(to->kids[there].ino)->nlink--;
		to->nkids--;
		memmove(&to->kids[there], &to->kids[there + 1], (to->nkids - there) * sizeof(*to->kids));
	}
	at = find_kid(from, name, &found);
	from->nkids--;
	memmove(&from->kids[at], &from->kids[at + 1], (from->nkids - at) * sizeof(*from->kids));
	there = find_kid(to, newname, &found);
	memmove(&to->kids[there + 1], &to->kids[there], (to->nkids - there) * sizeof(*to->kids));
	to->kids[there].name = copy;
	to->kids[there].ino = ino;
	to->nkids++;
	return 0;
}

static void mf_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	int err;

	maybe_slow();
	if (flags != 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	pthread_mutex_lock(&lock);
	err = rename_locked(parent, name, newparent, newname);
	pthread_mutex_unlock(&lock);
	fuse_reply_err(req, err);
}

static void mf_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct node *n;
	int err = 0;

	maybe_slow();
	pthread_mutex_lock(&lock);
	n = get(ino);
	if (n == NULL)
		err = ENOENT;
	else if (!S_ISDIR(n->mode))
		err = ENOTDIR;
	pthread_mutex_unlock(&lock);
	if (err != 0) {
		fuse_reply_err(req, err);
		return;
	}
	fi->fh = ino;
	fuse_reply_open(req, fi);
}

/* Entries in name order, each entry's offset its index + 1; no "." and "..". As many as fit
 * in SIZE from OFF on. */
static void list_dir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus)
{
	struct fuse_entry_param e;
	struct node *dir;
	size_t used = 0;
	char *buf;

	maybe_slow();
	buf = malloc(size ? size : 1);
	if (buf == NULL) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	pthread_mutex_lock(&lock);
	dir = get(ino);
	for (size_t i = off > 0 ? (size_t)off : 0; dir != NULL && i < dir->nkids; i++) {
		const struct entry *kid = &dir->kids[i];
		size_t len;

		fill_entry(kid->ino, get(kid->ino), &e);
		if (plus)
			len = fuse_add_direntry_plus(req, buf + used, size - used, kid->name, &e,
						     (off_t)(i + 1));
		else
			len = fuse_add_direntry(req, buf + used, size - used, kid->name, &e.attr,
						(off_t)(i + 1));
		if (len > size - used)
			break; /* full: the kernel asks again from this offset */
		used += len;
	}
	pthread_mutex_unlock(&lock);
	if (dir == NULL)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_buf(req, buf, used);
	free(buf);
}

static void mf_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	(void)fi;
	list_dir(req, ino, size, off, 0);
}

static void mf_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			   struct fuse_file_info *fi)
{
	(void)fi;
	list_dir(req, ino, size, off, 1);
}

static void mf_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

/* Never slow: a test's `df` must answer while the rest hangs. */
static void mf_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs st;

	(void)ino;
	memset(&st, 0, sizeof(st));
	st.f_bsize = st.f_frsize = 4096;
	st.f_blocks = st.f_bfree = st.f_bavail = 1 << 20;
	st.f_files = st.f_ffree = st.f_favail = 1 << 20;
	st.f_namemax = 200; /* not the usual 255, so a test can tell it was passed through */
	fuse_reply_statfs(req, &st);
}

static const struct fuse_lowlevel_ops ops = {
	.init = mf_init,
	.lookup = mf_lookup,
	.getattr = mf_getattr,
	.setattr = mf_setattr,
	.mkdir = mf_mkdir,
	.create = mf_create,
	.open = mf_open,
	.read = mf_read,
	.write = mf_write,
	.flush = mf_flush,
	.release = mf_release,
	.fsync = mf_fsync,
	.unlink = mf_unlink,
	.rename = mf_rename,
	.opendir = mf_opendir,
	.readdir = mf_readdir,
	.readdirplus = mf_readdirplus,
	.releasedir = mf_releasedir,
	.statfs = mf_statfs,
};

static int usage(void)
{
	fprintf(stderr, "usage: memfs MOUNTPOINT LOGFILE [--stale-unlinked] "
			"[--slow-getattr=SECONDS] [--slow-all-while=PATH:SECONDS] "
			"[--log-attributes]\n");
	return 2;
}

/* SECONDS as a number >= 0, or -1. */
static double parse_seconds(const char *text)
{
	char *end;
	double value = strtod(text, &end);

	return end == text || *end != '\0' || !(value >= 0) ? -1 : value;
}

int main(int argc, char *argv[])
{
	char *fuse_argv[] = {argv[0], "-o", "fsname=memfs,subtype=memfs", NULL};
	struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
	struct fuse_loop_config *loop;
	struct node *root;

	if (argc < 3)
		return usage();
	for (int i = 3; i < argc; i++) {
		const char *arg = argv[i];

		if (strcmp(arg, "--stale-unlinked") == 0) {
			stale_unlinked = 1;
		} else if (strcmp(arg, "--log-attributes") == 0) {
			log_attributes = 1;
		} else if (strncmp(arg, "--slow-getattr=", 15) == 0) {
			slow_getattr = parse_seconds(arg + 15);
			if (slow_getattr < 0)
				return usage();
		} else if (strncmp(arg, "--slow-all-while=", 17) == 0) {
			char *spec = strdup(arg + 17);
			char *colon = spec ? strrchr(spec, ':') : NULL; /* a path may hold ':' */

			if (colon == NULL)
				return usage();
			*colon = '\0';
			slow_path = spec;
			slow_seconds = parse_seconds(colon + 1);
			if (slow_seconds < 0)
				return usage();
		} else {
			return usage();
		}
	}

	record = fopen(argv[2], "a");
	if (record == NULL) {
		perror(argv[2]);
		return 1;
	}
	setvbuf(record, NULL, _IOLBF, 0); /* each line on disk at once: tests read it live */

	/* The root: inode 1, with inode 0 left empty so that nodes[ino] works. */
	nodes = calloc(64, sizeof(*nodes));
	root = calloc(1, sizeof(*root));
	if (nodes == NULL || root == NULL || (root->name = strdup("")) == NULL)
		return 1;
	nodes_cap = 64;
	root->mode = S_IFDIR | 0755;
	root->nlink = 2;
	clock_gettime(CLOCK_REALTIME, &root->mtime);
	nodes[FUSE_ROOT_ID] = root;
	nnodes = FUSE_ROOT_ID + 1;

	session = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	fuse_opt_free_args(&args); /* what parsing added to it */
	if (session == NULL)
		return 1;
	if (fuse_set_signal_handlers(session) != 0 || fuse_session_mount(session, argv[1]) != 0) {
		fuse_session_destroy(session);
		return 1;
	}
	/* Enough threads that calls sleeping in --slow-* options do not starve the rest. */
	loop = fuse_loop_cfg_create();
	fuse_loop_cfg_set_max_threads(loop, 100);
	fuse_loop_cfg_set_idle_threads(loop, 10);
	fuse_session_loop_mt(session, loop); /* until a signal or an unmount */
	fuse_loop_cfg_destroy(loop);
	fuse_session_unmount(session);
	fuse_remove_signal_handlers(session);
	fuse_session_destroy(session);
	fclose(record);
	return 0;
}
