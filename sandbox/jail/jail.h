/* ccw-jail: the jail's launcher and init (see ccw_jail.c for why it is C).
 *
 * The plan the helper writes (sandbox/jail_launcher.py encodes it; plan.c reads it), on
 * descriptor 4, a memfd read to its end:
 *
 *     "CCWJAIL1" record* ; record = tag (1 byte) | length (u32, native order) | payload
 *
 *     'O' options: nine u32: unshare flags, option bits (PLAN_*), uid, gid, last_cap,
 *         the END signal's number, the number of cgroup files, keep_caps low and high word
 *     'h' hostname            't' time namespace offsets (text for timens_offsets)
 *     'f' seccomp program (struct sock_filter[])
 *     'u' the notifying seccomp program (only where a capsule's runs overlap): u32, the
 *         descriptor of the socket its listener is sent on at the first notification, or an
 *         'F' if the kernel refuses it (after the bind sources), then
 *         struct sock_filter[] (sandbox/unotify.py)
 *     'c' cwd                 'a' one argv element (in order; one at least)
 *     'e' one "NAME=value" of the command's environment
 *     'm' one mount step: three u32 (action, MOUNT_ATTR_* set, STEP_* bits), then four
 *         NUL-terminated strings: target, source, data, the step's name for errors
 *     'r' one step of the root tree, as 'm' (only without PLAN_ROOT: the launcher builds
 *         the tree itself, attached, where the kernel could not build it detached)
 *     'Z' the end (empty): a plan without it was cut short
 *
 * Every string is NUL-free before its terminator; any other tag, a short record or a
 * missing field is refused with an "E" report.  The descriptors (DESIGN: contain.py's
 * essay): 0-2 the command's stdio, 3 the report pipe, 4 the plan, 5 a network namespace
 * (PLAN_NET), 6 the root tree (PLAN_ROOT), 7 and up the exec cgroup's "tasks" files, the
 * binds' sources, and the notifying filter's socket ('u').
 */
#ifndef CCW_JAIL_H
#define CCW_JAIL_H

#include <stddef.h>
#include <stdint.h>

#define FD_REPORT 3
#define FD_PLAN 4
#define FD_NET 5
#define FD_ROOT 6
#define FD_LAUNCH 7
#define FD_CGROUPS 8
#define SETUP_FAILED 125
#define PLAN_MAX_BYTES (8u << 20) /* argv and env are bounded by ARG_MAX (a few MiB) */
#define MAX_STEPS 512
#define MAX_CGROUPS 16

enum plan_option {
    PLAN_DIRECT = 1,       /* already pid 1 of the jail's pid namespace (else: unshare, fork the init) */
    PLAN_NET = 2,          /* descriptor 5 is a network namespace to join, lo up */
    PLAN_ROOT = 4,         /* descriptor 6 is the root tree (mounts.build_root); else 'r' records */
    PLAN_SET_UID = 8,
    PLAN_SET_GID = 16,
    PLAN_CLEAR_GROUPS = 32,
    PLAN_CONTROLLING_TTY = 64,
    PLAN_LAUNCH = 128,     /* descriptor 7 is the mount namespace to copy (mounts.launch_namespace) */
};

enum step_action {
    STEP_PRIVATE = 1, STEP_ROOT, STEP_BIND, STEP_SYMLINK, STEP_MASK_FILE, STEP_MASK_DIR,
    STEP_PROC, STEP_SYSFS, STEP_CONSOLE, STEP_DETACH_OLD_ROOT, STEP_SEAL_ROOT,
    /* only in the root tree's own steps ('r' records: mounts.root_steps) */
    STEP_BIND_OVER, STEP_ETC, STEP_DEV, STEP_DEVPTS, STEP_TMPFS,
};

/* STEP_SOURCE_FD: the source is the number of a descriptor the helper passed, a detached
 * clone of the host path (mounts.launch_namespace: the jail's namespace is not a copy of
 * the helper's, so no host path is there); they follow the tasks files, in step order. */
enum step_bits { STEP_SOURCE_IS_FILE = 1, STEP_NOFOLLOW = 2, STEP_SOURCE_FD = 4 };

struct mount_step {
    uint32_t action, attrs, bits;
    const char *target, *source, *data, *name;
};

struct plan {
    uint32_t flags, options, uid, gid, last_cap, end_signal, cgroups;
    uint64_t keep_caps;
    const char *hostname, *timens, *cwd;
    size_t timens_len;
    const void *seccomp;
    size_t seccomp_len;
    const void *notify; /* the notifying filter ('u'), NULL without; its listener goes over notify_fd */
    size_t notify_len;
    uint32_t notify_fd;
    char **argv, **envp; /* NULL-terminated */
    size_t nsteps, nroot_steps;
    struct mount_step steps[MAX_STEPS];
    struct mount_step root_steps[MAX_STEPS]; /* without PLAN_ROOT: the tree to build in place */
};

/* plan.c */
int plan_read(int fd, struct plan *plan, const char **why);

/* report.c-like helpers, in ccw_jail.c */
void report(char kind, const void *payload, size_t length);
_Noreturn void fail(const char *step, int number, const char *text);
_Noreturn void fail_errno(const char *step, const char *call);

/* steps.c: the jail's steps (namespaces, mounts, privileges), each failing with an "E" report */
void contain(const struct plan *plan);
/* the notifying filter's listener while the init holds it (-1: none, or handed over), and its handover */
int notify_listener(void);
void hand_listener(const struct plan *plan);

#endif
